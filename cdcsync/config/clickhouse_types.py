"""Postgres column types (as declared in a source's ``columns:``) mapped to ClickHouse column types.

One table, used by the migrations (DDL), the startup check (comparing with ``system.columns``) and the sink
(casting the decoded Arrow columns before the insert), so the three can never disagree.

Choices, and why:

* Integers and floats map to their same-width ClickHouse types; ``boolean`` to ``Bool``.
* ``numeric(p,s)`` with ``p <= 38`` maps to ``Decimal(p, s)``: it travels from the decoder as an Arrow
  ``decimal128`` and stays exact. Wider or unconstrained ``numeric`` has no exact Arrow/Spark counterpart, so it
  is kept as its exact decimal text in a ``String``.
* Timestamps (with or without time zone) map to ``DateTime64(6, 'UTC')``: microseconds like Postgres; values
  without a zone are read as UTC, as the decoder already does. ``date`` maps to ``Date32`` (Postgres' range is
  wider than ``Date``'s 1970-2149).
* ``uuid`` maps to ``UUID``. ``json``/``jsonb``, ``time``, ``interval``, ``bytea`` and ``hstore`` (its Postgres text
  form) become ``String``: ClickHouse's JSON type is still changing between releases, and text compares exactly
  with the source.
* ``time with time zone`` and ``bit``/``bit varying`` become ``String`` (the Postgres text form). Arrays map to
  ``Array(Nullable(<element>))``: Postgres array elements may always be NULL. ClickHouse has no nullable arrays
  (``Nullable(Array(...))`` is refused), so an array column is never ``Nullable`` and a NULL array lands as ``[]``.
* Key columns are never ``Nullable`` (ClickHouse refuses nullable sorting keys by default); every other column is,
  because the pipeline does not know whether the source allows NULL. ``LowCardinality`` wraps string columns the
  sink lists in ``low_cardinality`` (outside ``Nullable``, as ClickHouse requires).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from cdcsync.config.types import SPARK_MAX_DECIMAL_PRECISION, PgType
from cdcsync.core import names

_BASE_BY_PG: dict[str, str] = {
    "smallint": "Int16",
    "integer": "Int32",
    "bigint": "Int64",
    "real": "Float32",
    "double precision": "Float64",
    "boolean": "Bool",
    "text": "String",
    "character varying": "String",
    "character": "String",
    "date": "Date32",
    "timestamp without time zone": "DateTime64(6, 'UTC')",
    "timestamp with time zone": "DateTime64(6, 'UTC')",
    "time without time zone": "String",
    "time with time zone": "String",
    "interval": "String",
    "bit": "String",
    "bit varying": "String",
    "uuid": "UUID",
    "json": "String",
    "jsonb": "String",
    "bytea": "String",
    "hstore": "String",
}

VERSION_COLUMN = "_version"
DELETED_COLUMN = "_is_deleted"
TS_COLUMN = "_cdc_ts"
METADATA_COLUMNS: tuple[tuple[str, str], ...] = (
    (VERSION_COLUMN, names.CLICKHOUSE_VERSION_TYPE),
    (DELETED_COLUMN, "UInt8"),
    (TS_COLUMN, "Nullable(DateTime64(6, 'UTC'))"),
)
"""Columns every cdcsync ClickHouse table has after the business columns, with their exact types."""


def base_type(pg_type: PgType) -> str:
    """The ClickHouse type for ``pg_type`` without ``Nullable``/``LowCardinality``."""
    if pg_type.element is not None:
        return f"Array(Nullable({base_type(pg_type.element)}))"
    if pg_type.name == "numeric":
        if pg_type.args and pg_type.args[0] <= SPARK_MAX_DECIMAL_PRECISION:
            precision = pg_type.args[0]
            scale = pg_type.args[1] if len(pg_type.args) > 1 else 0
            return f"Decimal({precision}, {scale})"
        return "String"
    return _BASE_BY_PG[pg_type.name]


def is_string_type(pg_type: PgType) -> bool:
    """True when the column is a ``String`` in ClickHouse, which is what ``LowCardinality`` may wrap."""
    return base_type(pg_type) == "String"


def column_type(pg_type: PgType, *, key: bool, low_cardinality: bool = False) -> str:
    """The full ClickHouse type of a business column, exactly as ``system.columns.type`` spells it."""
    ch = base_type(pg_type)
    if not key and pg_type.element is None:
        ch = f"Nullable({ch})"
    if low_cardinality:
        ch = f"LowCardinality({ch})"
    return ch


_TOKEN_RE = re.compile(
    r"'(?:[^'\\]|\\.|'')*'|`((?:[^`\\]|\\.|``)*)`|\"((?:[^\"\\]|\\.|\"\")*)\"|([A-Za-z_][A-Za-z0-9_]*)"
)
"""String literals, quoted and bare identifiers; ClickHouse escapes a quote inside quotes with a backslash or by
doubling it."""
_ESCAPE_RE = re.compile(r"\\(.)|([`\"])\2")


def _unescape(match: re.Match[str]) -> str:
    return match.group(1) or match.group(2)


def partition_columns(expression: str, columns: Iterable[str]) -> set[str]:
    """The columns of ``columns`` that a ``partition_by`` expression may read (every identifier that names one).

    Conservative on purpose: a function spelled like a column counts as reading it. The sink uses this to decide
    whether a change can land in another partition than the older rows of its key (see
    ``templates/clickhouse/runtime/partition_markers.sql.j2``), which is only impossible when the partition
    depends on key columns alone.
    """
    names = set(columns)
    found = set()
    for match in _TOKEN_RE.finditer(expression):  # left to right: quotes inside string literals are not names
        quoted, double_quoted, bare = match.groups()
        if quoted is None and double_quoted is None and bare is None:
            continue  # a string literal
        name = bare if bare is not None else _ESCAPE_RE.sub(_unescape, quoted if quoted is not None else double_quoted)
        if name in names:
            found.add(name)
    return found
