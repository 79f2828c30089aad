"""Connect schemas as column types: the inverse of the converters, and what makes a schema a change.

``cdcsync init`` types a source's columns from its topic's schema (:func:`connect_pg_type`); at run time each
distinct message schema is compared with the source's columns (:func:`schema_change_of`). Avro writer schemas
are seen as Connect schemas first (:mod:`cdcsync.sources.debezium.avro_schema`), so both formats share this
mapping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdcsync.config.types import PgType
from cdcsync.core.reports import Report, schema_change
from cdcsync.sources.debezium.values import (
    DEBEZIUM_BITS,
    DEBEZIUM_DECIMAL,
    TIME_UNITS,
    TIMESTAMP_UNITS,
    VARIABLE_SCALE_DECIMAL,
    logical_type,
    show,
)

if TYPE_CHECKING:
    from cdcsync.sources.debezium.spec import DecodeSpec

_UNBOUNDED_BITS = 2**31 - 1
"""The ``length`` Debezium gives the Bits of a ``bit varying`` without a length."""
_CONNECT_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_CONNECT_PLAIN: dict[str, str] = {
    "int8": "smallint",
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "float": "real",
    "float32": "real",
    "double": "double precision",
    "float64": "double precision",
    "boolean": "boolean",
    "string": "text",
    "bytes": "bytea",
    "map": "json",
}
"""Connect base types without a logical name, by the declared type whose converter reads them as they come."""
_CONNECT_NAMED: dict[str, str] = {
    "io.debezium.time.ZonedTimestamp": "timestamp with time zone",
    "io.debezium.time.ZonedTime": "time with time zone",
    "io.debezium.time.MicroDuration": "interval",
    "io.debezium.time.Interval": "interval",
    "io.debezium.data.Json": "json",
    "io.debezium.data.Uuid": "uuid",
    "io.debezium.data.Enum": "text",
    "io.debezium.data.Xml": "text",
    "io.debezium.data.Ltree": "text",
    VARIABLE_SCALE_DECIMAL: "numeric",
}
"""Logical types whose declared type takes no parameter from the schema; the others (decimals, times, Bits,
dates) are decided in :func:`connect_pg_type` from the decoder's own unit tables and parameters."""


def connect_pg_type(schema: Any) -> PgType | str:
    """The column type whose converter reads values of this Connect field schema exactly: the inverse of the
    converters above (``cdcsync init`` renders DDL from it; ``run`` compares new schemas with it). A string is
    the reason a schema has no such type (the user declares one under ``columns:``).

    Where the schema cannot tell two Postgres types apart, the one that keeps every value wins: Debezium's
    ``Json`` becomes ``json`` (the text exactly as sent, for json and jsonb sources alike), ``Bits`` of length n
    ``bit(n)`` (exact for ``bit(n)``; a ``bit varying(n)`` source loses its leading zeros either way), ``Time`` and
    ``Timestamp`` in milliseconds ``time(3)`` / ``timestamp(3)``, a ``Decimal`` without a precision unconstrained
    ``numeric``, and plain strings (``varchar``, ``char``, ``inet``, enums ...) ``text``."""
    if type(schema) is not dict:
        return f"{show(schema)} is not a Connect schema"
    base, name = schema.get("type"), schema.get("name")
    logical, params = logical_type(schema)
    if base == "array":
        items = schema.get("items")
        element = connect_pg_type(items)
        if isinstance(element, str):
            return f"array of {element}"
        if element.is_array:
            return "arrays of arrays are not supported"
        return PgType("array", (), element)
    if logical is not None:
        if logical == DEBEZIUM_DECIMAL:
            scale, precision = _int_param(params, "scale"), _int_param(params, "connect.decimal.precision")
            if scale is None or scale < 0 or (precision is not None and not 0 < precision >= scale):
                return f"Decimal parameters {show(params)} are not a Postgres numeric"
            return PgType("numeric", (precision, scale)) if precision else PgType("numeric")
        if logical in TIMESTAMP_UNITS:
            return PgType("timestamp without time zone", (3,) if TIMESTAMP_UNITS[logical] == 1000 else ())
        if logical in TIME_UNITS:
            return PgType("time without time zone", (3,) if TIME_UNITS[logical] == 1000 else ())
        if logical in _CONNECT_DATES:
            return PgType("date")
        if logical == DEBEZIUM_BITS:
            length = _int_param(params, "length")
            if length is None or length <= 0 or length >= _UNBOUNDED_BITS:
                return PgType("bit varying")
            return PgType("bit", (length,))
        if logical in _CONNECT_NAMED:
            return PgType(_CONNECT_NAMED[logical])
        if base != "string":  # an unknown logical type: its base type alone could misread it
            return f"Connect type {base} named {name!r} has no Postgres mapping"
    if base in _CONNECT_PLAIN:
        return PgType(_CONNECT_PLAIN[base])
    return f"Connect type {base}" + (f" named {name!r}" if name else "") + " has no Postgres mapping"


def _int_param(params: dict[str, Any], key: str) -> int | None:
    value = params.get(key)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def row_fields(envelope: Any) -> list[dict[str, Any]] | None:
    """The field schemas of a Debezium envelope's row struct (``after``, else ``before``), or None when the
    schema is not an envelope."""
    if type(envelope) is not dict or type(envelope.get("fields")) is not list:
        return None
    for struct in ("after", "before"):
        for field_schema in envelope["fields"]:
            if type(field_schema) is dict and field_schema.get("field") == struct:
                fields = field_schema.get("fields")
                if type(fields) is list:
                    return [f for f in fields if type(f) is dict and type(f.get("field")) is str]
    return None


def struct_fields(schema: Any) -> list[dict[str, Any]] | None:
    """The field schemas of a Connect struct (a message key's), or None."""
    if type(schema) is not dict or type(schema.get("fields")) is not list:
        return None
    return [f for f in schema["fields"] if type(f) is dict and type(f.get("field")) is str]


def schema_change_of(spec: DecodeSpec, fields: list[dict[str, Any]]) -> Report | None:
    """The schema change of a message whose row has these Connect field schemas, or None.

    A change is a field the source's columns lack (a column added at the source), or a column whose recorded
    schema type (``spec.schema_types``: what ``cdcsync init`` read) differs from the type the field maps to now.
    A column the schema lacks is no change: Debezium stops sending a dropped column, and it lands as NULL. The
    report lists every field with its type (or why it has none), the added ones and the changed ones."""
    known = {name for name, _ in spec.columns}
    recorded = dict(spec.schema_types)
    mapped: list[tuple[str, str | None, str | None]] = []
    added: list[str] = []
    changed: list[tuple[str, str, str]] = []
    for field_schema in fields:
        name = field_schema["field"]
        pg = connect_pg_type(field_schema)
        sql, why = (None, pg) if isinstance(pg, str) else (pg.sql, None)
        mapped.append((name, sql, why))
        if name not in known:
            added.append(name)
        elif name in recorded and sql is not None and sql != recorded[name]:
            changed.append((name, recorded[name], sql))
    if not added and not changed:
        return None
    return schema_change(mapped, added, changed)
