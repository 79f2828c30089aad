"""The converter of a column, by its declared Postgres type; arrays of any of them.

Converters are built once per column and spec (:class:`~cdcsync.sources.debezium.plan.RowPlan`), so the
decisions that depend on the type alone (ranges, scale, length) are taken here, not per value.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from cdcsync.config.toast import UNAVAILABLE_PLACEHOLDER
from cdcsync.config.types import PgType
from cdcsync.core.errors import DecodeError
from cdcsync.sources.debezium.numbers import (
    float_converter,
    int_converter,
    numeric_converter,
)
from cdcsync.sources.debezium.temporal import (
    date_converter,
    interval_converter,
    time_converter,
    timestamp_converter,
    timetz_converter,
)
from cdcsync.sources.debezium.text import (
    bits_converter,
    bool_converter,
    bytea_converter,
    hstore_converter,
    text_converter,
    uuid_converter,
)
from cdcsync.sources.debezium.values import (
    INT_RANGES,
    Converter,
    Ctx,
    Reject,
    bad,
    column_schema,
)


def _array_converter(name: str, pg: PgType, source_id: str, time_mode: str | None) -> Converter:
    """Arrays: a JSON list, each element read by the element type's converter with the schema's ``items`` as
    its Connect schema (so a ``numeric(10,2)[]`` element may be Decimal bytes with the array's scale). Decimal
    elements become ``Decimal`` for Arrow's list of decimal128; one-dimensional arrays only."""
    assert pg.element is not None
    element = pg.element
    convert_element = converter_for(name, element, source_id, time_mode)
    decimal_scale = -1
    if element.spark_type.startswith("decimal"):
        decimal_scale = element.args[1] if len(element.args) > 1 else 0
    expected = pg.sql
    memo_key = "\x00cdcsync:items"

    def element_ctx(ctx: Ctx) -> Ctx:
        column = column_schema(ctx, name) if ctx[0] is not None else None
        if column is None:
            return (None, "", b"")
        synthetic = column.get(memo_key)
        if synthetic is None:
            items = column.get("items")
            synthetic = {"fields": [dict(items, field=name) if type(items) is dict else {"field": name}]}
            column[memo_key] = synthetic
        return (synthetic, "", b"")

    def convert(value: Any, ctx: Ctx) -> Any:
        if type(value) is not list:
            if value is None:
                return None
            if value == UNAVAILABLE_PLACEHOLDER:
                raise bad(
                    value,
                    expected,
                    "an unchanged TOASTed array of a type Debezium has no placeholder for; use REPLICA IDENTITY FULL",
                )
            raise bad(value, expected, "expected a JSON array")
        inner = element_ctx(ctx)
        out: list[Any] = []
        for item in value:
            if type(item) is list:
                raise bad(value, expected, "multidimensional arrays are not supported")
            try:
                converted = convert_element(item, inner)
            except Reject as error:
                raise Reject(f"element {len(out) + 1}: {error}") from None
            if decimal_scale >= 0 and type(converted) is int:
                converted = Decimal(f"{converted}E-{decimal_scale}")
            out.append(converted)
        return out

    return convert


def converter_for(name: str, pg: PgType, source_id: str, time_mode: str | None = None) -> Converter:
    """The converter of one column; ``time_mode`` is the connector's ``time.precision.mode`` for integer times in
    messages without schemas (None: they are microseconds)."""
    kind = pg.name
    if kind == "array":
        return _array_converter(name, pg, source_id, time_mode)
    if kind == "time with time zone":
        return timetz_converter(pg)
    if kind in ("bit", "bit varying"):
        return bits_converter(name, pg)
    if kind in INT_RANGES:
        return int_converter(pg)
    if kind in ("real", "double precision"):
        return float_converter(pg)
    if kind == "numeric":
        return numeric_converter(name, pg)
    if kind == "boolean":
        return bool_converter(pg)
    if kind in ("text", "character varying", "character", "json", "jsonb"):
        return text_converter(pg)
    if kind == "uuid":
        return uuid_converter(pg)
    if kind == "hstore":
        return hstore_converter(pg)
    if kind == "bytea":
        return bytea_converter(pg)
    if kind == "date":
        return date_converter(pg)
    if kind in ("timestamp without time zone", "timestamp with time zone"):
        return timestamp_converter(name, pg, time_mode)
    if kind == "time without time zone":
        return time_converter(name, pg, time_mode)
    if kind == "interval":
        return interval_converter(pg)
    raise DecodeError(f"source '{source_id}': column '{name}': type {pg.sql} is not supported by the JSON decoder")
