"""What a ``postgres_aggregate`` sink's YAML means in columns and types, decided in one place.

Validation (:mod:`cdcsync.config.pipeline`) reports the problems this module finds; the migration planner
(:mod:`cdcsync.migrations.postgres`) turns a resolved sink into the state its templates render. Default result types
follow Postgres' own aggregate functions (``sum(integer)`` is ``bigint``, ``sum(bigint)`` and ``avg`` of exact
types are ``numeric``), so that the aggregation table holds exactly what ``SELECT fn(x) ... GROUP BY`` returns.

A declared ``type`` is the type of the readable column, never of the running state: ``sum(x)`` declared
``numeric(18,2)`` over a ``numeric(12,4)`` column equals ``SELECT sum(x)::numeric(18,2)``, rounded once, not the sum
of rows each rounded to cents (which drifts a cent per few rows and cannot be undone on retraction). We keep the
state at full precision rather than refuse such types because a report column of lower scale than the source is
what users ask for, and Postgres' own ``sum(x)::numeric(18,2)`` is the obvious meaning. So the running sum lives
in the type Postgres' ``sum`` itself returns (a hidden ``_cdc_<name>_sum`` column when the declared type could
lose anything per row), and ``avg`` always sums in ``numeric`` (``double precision`` for float columns).
``avg`` over an unconstrained ``numeric`` column also keeps the largest scale of the rows it averages, because
Postgres' ``avg`` divides at a result scale that depends on it (and ``max`` of the scales must be recomputed when
the row holding it leaves, like ``max`` itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcsync.config.types import PgType, UnknownTypeError, parse_pg_type

if TYPE_CHECKING:
    from cdcsync.config.pipeline import PostgresAggregateSink

INTEGER_TYPES = frozenset({"smallint", "integer", "bigint"})
FLOAT_TYPES = frozenset({"real", "double precision"})
NUMERIC_TYPES = INTEGER_TYPES | FLOAT_TYPES | {"numeric"}
TEXT_TYPES = frozenset({"text", "character varying", "character"})
ORDERED_TYPES = (
    NUMERIC_TYPES
    | TEXT_TYPES
    | {
        "date",
        "timestamp without time zone",
        "timestamp with time zone",
        "time without time zone",
        "interval",
    }
)
"""Types Postgres has ``min``/``max`` for (and that can key a btree index used to recompute them)."""

BIGINT = PgType("bigint")
NUMERIC = PgType("numeric")
DOUBLE = PgType("double precision")


@dataclass(frozen=True)
class GroupKey:
    name: str
    """Column of the aggregation table."""
    source: str
    """Column of the landing table it is read from."""
    type: PgType
    cast: bool
    """True when ``type`` differs from the landing column's type, so reads go through ``(col)::type``."""


@dataclass(frozen=True)
class Aggregate:
    name: str
    fn: str
    source: str | None
    """Landing column aggregated; None only for ``count`` of rows."""
    type: PgType
    """Type of the readable column ``name``."""
    accumulator_type: PgType | None = None
    """``sum`` and ``avg``: type the running sum is kept in (``<name>_sum`` for avg; for sum ``name`` itself when
    it equals ``type``, else the hidden ``_cdc_<name>_sum`` and ``name`` is the sum cast to ``type``)."""
    track_scale: bool = False
    """``avg`` of an unconstrained ``numeric``: keep the largest scale of the group's values (``_cdc_<name>_scale``)
    so that the average is computed at the scale Postgres' ``avg`` uses."""


@dataclass(frozen=True)
class ResolvedAggregation:
    group_by: tuple[GroupKey, ...]
    aggregates: tuple[Aggregate, ...]
    problems: tuple[str, ...]
    """``key.path: message`` lines relative to the sink, empty when the sink is valid."""


def _family(pg: PgType) -> str:
    if pg.name in NUMERIC_TYPES:
        return "number"
    if pg.name in TEXT_TYPES:
        return "text"
    return pg.name


def default_type(fn: str, input_type: PgType | None) -> PgType:
    """The type Postgres' own ``fn(input)`` returns."""
    if fn == "count" or input_type is None:
        return BIGINT
    if fn == "sum":
        if input_type.name in ("smallint", "integer"):
            return BIGINT
        if input_type.name in ("bigint", "numeric"):
            return NUMERIC
        return input_type
    if fn == "avg":
        return DOUBLE if input_type.name in FLOAT_TYPES else NUMERIC
    return input_type


def _sum_type(input_type: PgType) -> PgType:
    """The type Postgres' ``sum`` of ``input_type`` is computed (and returned) in."""
    return input_type if input_type.name in FLOAT_TYPES else default_type("sum", input_type)


def _sums_losslessly(declared: PgType, input_type: PgType) -> bool:
    """True when adding each row cast to ``declared`` gives the same sum as casting the exact sum once.

    Integers fit any integer or numeric type (overflow aside: an overflow is an error either way); a numeric needs
    a numeric of no smaller scale; a float column needs ``double precision`` (a float sum is only as exact as
    Postgres' own, which adds in the column's float type).
    """
    if declared == _sum_type(input_type):
        return True
    if input_type.name in FLOAT_TYPES:
        return declared.name == "double precision"
    if declared.name == "numeric":
        if not declared.args or input_type.name in INTEGER_TYPES:
            return True
        declared_scale = declared.args[1] if len(declared.args) > 1 else 0
        return bool(input_type.args) and declared_scale >= (input_type.args[1] if len(input_type.args) > 1 else 0)
    return input_type.name in INTEGER_TYPES and declared.name in INTEGER_TYPES


def hidden_sum(aggregate_name: str) -> str:
    """The full-precision running sum of a ``sum`` whose declared type could round or overflow per row."""
    return f"_cdc_{aggregate_name}_sum"


def generated_columns(aggregate_name: str, fn: str) -> list[str]:
    """Columns besides ``aggregate_name`` that the aggregation table gets for it (users may read them)."""
    return [f"{aggregate_name}_sum", f"{aggregate_name}_count"] if fn == "avg" else []


def resolve(
    sink: PostgresAggregateSink, columns: dict[str, PgType], described: str | None = None
) -> ResolvedAggregation:
    """Resolve input columns and types; every problem is reported, none raised.

    ``columns`` are the sink's input's (a source's or a SQL transform's); ``described`` names that input in
    messages (``source 'orders'``).
    """
    problems: list[str] = []
    described = described or f"source '{sink.from_}'"

    def parse(path: str, text: str | None) -> PgType | None:
        if text is None:
            return None
        try:
            return parse_pg_type(text)
        except UnknownTypeError as error:
            problems.append(f"{path}: {error}")
            return None

    def input_column(path: str, name: str) -> PgType | None:
        if name not in columns:
            known = ", ".join(columns)
            problems.append(f"{path}: column '{name}' is not in {described} (its columns: {known})")
            return None
        return columns[name]

    groups: list[GroupKey] = []
    for name, entry in sink.group_by.items():
        where = f"group_by.{name}"
        source_name = entry.from_ or name
        input_type = input_column(f"{where}.from" if entry.from_ else where, source_name)
        declared = parse(f"{where}.type", entry.type)
        if input_type is None or (entry.type is not None and declared is None):
            continue
        key_type = declared or input_type
        if _family(key_type) != _family(input_type):
            problems.append(
                f"{where}.type: {key_type.sql} cannot key groups of '{source_name}' ({input_type.sql}); "
                f"use a {_family(input_type)} type or leave 'type' out"
            )
            continue
        if key_type.name not in ORDERED_TYPES and key_type.name not in ("boolean", "uuid"):
            problems.append(f"{where}: {key_type.sql} columns cannot be grouped by (no equality index in Postgres)")
            continue
        groups.append(GroupKey(name, source_name, key_type, cast=key_type != input_type))

    aggregates: list[Aggregate] = []
    for name, spec in sink.aggregate.items():
        where = f"aggregate.{name}"
        aggregated: str | None = spec.from_ or (None if spec.fn == "count" else name)
        input_type = None
        if aggregated is not None:
            input_type = input_column(f"{where}.from" if spec.from_ else where, aggregated)
            if input_type is None:
                if not spec.from_:
                    problems[-1] += "; name the column to aggregate in 'from'"
                continue
        declared = parse(f"{where}.type", spec.type)
        if spec.type is not None and declared is None:
            continue
        if spec.fn in ("sum", "avg") and input_type is not None and input_type.name not in NUMERIC_TYPES:
            problems.append(f"{where}.fn: {spec.fn} needs a numeric column; '{aggregated}' is {input_type.sql}")
            continue
        if spec.fn in ("min", "max") and input_type is not None and input_type.name not in ORDERED_TYPES:
            problems.append(f"{where}.fn: Postgres has no {spec.fn} for '{aggregated}' ({input_type.sql})")
            continue
        result = declared or default_type(spec.fn, input_type)
        if declared is not None:
            wanted = "number" if spec.fn in ("sum", "avg", "count") else _family(input_type or BIGINT)
            if _family(declared) != wanted or (spec.fn == "count" and declared.name in FLOAT_TYPES):
                problems.append(f"{where}.type: {declared.sql} cannot hold {spec.fn}({aggregated or '*'})")
                continue
        accumulator: PgType | None = None
        track_scale = False
        if spec.fn == "sum":
            assert input_type is not None
            accumulator = result if _sums_losslessly(result, input_type) else _sum_type(input_type)
            if accumulator != result and len(hidden_sum(name).encode()) > 63:
                problems.append(f"{where}: the name is too long for its running-sum column '{hidden_sum(name)}'")
                continue
        elif spec.fn == "avg":
            assert input_type is not None
            accumulator = DOUBLE if input_type.name in FLOAT_TYPES else NUMERIC
            track_scale = input_type.name == "numeric" and not input_type.args
            if track_scale and len(f"_cdc_{name}_scale".encode()) > 63:
                problems.append(f"{where}: the name is too long for its bookkeeping column '_cdc_{name}_scale'")
                continue
        aggregates.append(Aggregate(name, spec.fn, aggregated, result, accumulator, track_scale))

    _check_names(sink, problems)
    return ResolvedAggregation(tuple(groups), tuple(aggregates), tuple(problems))


def _check_names(sink: PostgresAggregateSink, problems: list[str]) -> None:
    owners: dict[str, str] = {}
    entries = [(f"group_by.{name}", name) for name in sink.group_by]
    for name, entry in sink.aggregate.items():
        entries.append((f"aggregate.{name}", name))
        entries.extend((f"aggregate.{name}", extra) for extra in generated_columns(name, entry.fn))
    for name, entry in sink.aggregate.items():
        if entry.fn == "sum" and len(f"_cdc_{name}_n".encode()) > 63:
            problems.append(f"aggregate.{name}: the name is too long for its bookkeeping column '_cdc_{name}_n'")
    for where, column in entries:
        if len(column.encode()) > 63:
            problems.append(f"{where}: column '{column}' would be longer than Postgres' 63-byte identifier limit")
        elif column.startswith("_cdc_"):
            problems.append(f"{where}: column names starting with '_cdc_' are reserved for cdcsync")
        elif column in owners:
            kind = "a group_by column" if owners[column].startswith("group_by") else "an aggregate column"
            problems.append(f"{where}: '{column}' is already {kind} of {sink.agg_table} (from {owners[column]})")
        else:
            owners[column] = where
