"""Avro values as the converters' input: each value becomes what JsonConverter would have written for it.

The annotations (``connect.name`` first, then ``logicalType``) decide: ``io.debezium.time.{Date, Timestamp,
MicroTimestamp, NanoTimestamp, Time, MicroTime, NanoTime}`` and the Connect / Avro ``date``, ``timestamp-*``,
``time-*`` types are scaled to what the column holds; Connect ``Decimal`` / Avro ``decimal`` bytes and
``io.debezium.data.VariableScaleDecimal`` records become exact decimals; ``ZonedTimestamp``, ``ZonedTime``,
``Json``, ``Uuid``, ``Enum`` and ``Interval`` are strings as in JSON; bytes (``Bits`` too) stay binary for
``bytea`` and become base64 text elsewhere, as JsonConverter writes them; arrays, maps and records become JSON
text for ``text`` / ``json`` columns. Avro ``float`` values are read as the shortest decimal that round-trips
through 32 bits (``0.1``, not ``0.10000000149011612``), as Connect's JsonConverter prints them.
"""

from __future__ import annotations

import base64
import math
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from cdcsync.config.types import PgType
from cdcsync.sources.debezium.avro_schema import avro_annotations, resolve
from cdcsync.sources.debezium.temporal import PGJDBC_TIMESTAMP_INFINITIES
from cdcsync.sources.debezium.values import (
    DEBEZIUM_DECIMAL,
    INT_RANGES,
    TIME_UNITS,
    TIMESTAMP_UNITS,
    US_PER_DAY,
    VARIABLE_SCALE_DECIMAL,
    Reject,
    dumps_exact,
    scale_int,
    show,
)

Translate = Callable[[Any], Any]

_TEXT_KINDS = frozenset({"text", "character varying", "character", "json", "jsonb"})
_TIMESTAMP_KINDS = frozenset({"timestamp without time zone", "timestamp with time zone"})
_INTEGRAL_KINDS = frozenset({*INT_RANGES, "date", "time without time zone", *_TIMESTAMP_KINDS})
_AVRO_TIMESTAMP_UNITS: dict[str, int] = {
    **TIMESTAMP_UNITS,
    "timestamp-millis": 1000,
    "local-timestamp-millis": 1000,
    "timestamp-micros": 1,
    "local-timestamp-micros": 1,
    "timestamp-nanos": -1000,
    "local-timestamp-nanos": -1000,
    "io.debezium.time.Date": US_PER_DAY,
    "org.apache.kafka.connect.data.Date": US_PER_DAY,
    "date": US_PER_DAY,
}
_AVRO_TIME_UNITS: dict[str, int] = {**TIME_UNITS, "time-millis": 1000, "time-micros": 1}
_FLOAT32 = struct.Struct("<f")


def _float32_text(value: float) -> str:
    """The shortest decimal that reads back as this 32-bit float, as Java's ``Float.toString`` finds it."""
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if _FLOAT32.unpack(_FLOAT32.pack(float(text)))[0] == value:
            return text
    return repr(value)  # pragma: no cover - nine significant digits always round-trip a float32


def _decimal_of(unscaled: int, scale: int) -> Decimal:
    return Decimal(f"{unscaled}E{-scale}")  # from text: exact, whatever the digits (Decimal.scaleb rounds)


def _decimal_bytes(scale: int) -> Translate:
    def translate(value: Any) -> Any:
        if type(value) is not bytes:
            return value
        return _decimal_of(int.from_bytes(value, "big", signed=True), scale)

    return translate


def _integral_decimal(scale: int, pg: PgType) -> Translate:
    """A decimal into an integer column: its integer value when it has no fraction (a ``numeric`` key)."""
    to_decimal = _decimal_bytes(scale)

    def translate(value: Any) -> Any:
        number = to_decimal(value)
        if type(number) is Decimal:
            if number != number.to_integral_value():
                raise Reject(f"{show(number)} is not a valid {pg.sql} (not an integer)")
            return int(number)
        return number

    return translate


def _variable_scale_decimal(value: Any) -> Any:
    if type(value) is dict and type(value.get("scale")) is int and type(value.get("value")) is bytes:
        return _decimal_of(int.from_bytes(value["value"], "big", signed=True), value["scale"])
    raise Reject(f"{show(value)} is not a VariableScaleDecimal record {{scale, value}}")


def _base64(value: Any) -> Any:
    return base64.b64encode(value).decode("ascii") if type(value) is bytes else value


def _json_text(value: Any) -> str:
    try:
        return dumps_exact(value)
    except ValueError:
        raise Reject(f"{show(value)} is not representable as JSON (NaN or Infinity)") from None


def _plain_jsonable(value: Any) -> Any:
    """A value of unknown Avro type as JsonConverter would write it: bytes as base64, containers recursively."""
    kind = type(value)
    if kind is bytes:
        return base64.b64encode(value).decode("ascii")
    if kind is dict:
        return {k: _plain_jsonable(v) for k, v in value.items()}
    if kind is list:
        return [_plain_jsonable(v) for v in value]
    return value


def decimal_scale(info: dict[str, Any]) -> int | None:
    """The scale of a Connect ``Decimal`` / Avro ``decimal`` (bytes or fixed), else None."""
    if info.get("connect.name") != DEBEZIUM_DECIMAL and info.get("logicalType") != "decimal":
        return None
    scale = info.get("scale")
    if type(scale) is int:
        return scale
    parameters = info.get("connect.parameters")
    if isinstance(parameters, dict):
        try:
            return int(parameters.get("scale", 0))
        except (TypeError, ValueError):
            return None
    return 0


def _jsonable_for(schema: Any, names: dict[str, Any], namespace: str) -> Translate:
    """Avro value -> JSON-able value, honouring the logical types inside records, arrays and maps."""
    schema, namespace = resolve(schema, names, namespace)
    if isinstance(schema, list):
        live = [b for b in schema if b != "null"]
        if len(live) != 1:
            return _plain_jsonable
        return _jsonable_for(live[0], names, namespace)
    base, logical, info = avro_annotations(schema)
    if base in ("bytes", "fixed"):
        scale = decimal_scale(info)
        return _base64 if scale is None else _decimal_bytes(scale)
    if logical == VARIABLE_SCALE_DECIMAL:
        return _variable_scale_decimal
    if base in ("record", "error"):
        fields = [
            (f["name"], _jsonable_for(f.get("type"), names, namespace))
            for f in info.get("fields", [])
            if isinstance(f, dict) and "name" in f
        ]

        def record(value: Any) -> Any:
            if type(value) is not dict:
                return _plain_jsonable(value)
            return {name: (None if value.get(name) is None else fn(value[name])) for name, fn in fields}

        return record
    if base == "array":
        items = _jsonable_for(info.get("items"), names, namespace)
        return lambda value: [None if v is None else items(v) for v in value] if type(value) is list else value
    if base == "map":
        values = _jsonable_for(info.get("values"), names, namespace)
        return lambda value: (
            {k: None if v is None else values(v) for k, v in value.items()} if type(value) is dict else value
        )
    return _plain_jsonable


def _scaled(unit: int) -> Translate:
    def translate(value: Any) -> Any:
        return scale_int(value, unit) if type(value) is int else value

    return translate


def _scaled_timestamp(unit: int) -> Translate:
    """Scaled to microseconds, except Debezium's ``±infinity``, which is the same number in every unit: the
    converter reads it as it comes (scaled, it would be out of range)."""

    def translate(value: Any) -> Any:
        if type(value) is not int or value in PGJDBC_TIMESTAMP_INFINITIES:
            return value
        return scale_int(value, unit)

    return translate


def _not_integral(pg: PgType) -> Translate:
    def translate(value: Any) -> Any:
        raise Reject(f"{show(value)} is not a valid {pg.sql} (not an integer)")

    return translate


def _float_for(pg: PgType, single: bool) -> Translate | None:
    """Avro float/double into a non-integral column: exact decimals for numeric, Connect's text for floats."""
    kind = pg.name
    if kind == "real":
        return None
    if kind == "numeric":

        def numeric(value: Any) -> Any:
            if type(value) is not float:
                return value
            if not math.isfinite(value):
                return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            return Decimal(_float32_text(value) if single else repr(value))

        return numeric
    if not single:
        return None
    if kind in _TEXT_KINDS:
        return lambda value: _float32_text(value) if type(value) is float and math.isfinite(value) else value
    return lambda value: float(_float32_text(value)) if type(value) is float and math.isfinite(value) else value


def _by_value(pg: PgType) -> Translate:
    """A union of several non-null types: decided per value by its Python type (no logical annotations)."""
    kind = pg.name

    def translate(value: Any) -> Any:
        t = type(value)
        if t is bytes:
            return value if kind == "bytea" else _base64(value)
        if t is float:
            if kind in _INTEGRAL_KINDS:
                raise Reject(f"{show(value)} is not a valid {pg.sql} (not an integer)")
            if kind == "numeric" and math.isfinite(value):
                return Decimal(repr(value))
        if (t is dict or t is list) and kind in _TEXT_KINDS:
            return _json_text(_plain_jsonable(value))
        return value

    return translate


def integer_unit(pg: PgType, logical: str | None) -> int | None:
    """What an Avro int or long with this logical type is scaled by for column ``pg`` (:func:`scale_int`'s unit;
    1: taken as it is), or None for a date column from a timestamp (its day: divided, not scaled)."""
    kind = pg.name
    if kind in _TIMESTAMP_KINDS:
        return _AVRO_TIMESTAMP_UNITS.get(logical or "", 1)
    if kind == "time without time zone":
        return _AVRO_TIME_UNITS.get(logical or "", 1)
    if kind == "date" and logical in _AVRO_TIMESTAMP_UNITS and _AVRO_TIMESTAMP_UNITS[logical] != US_PER_DAY:
        return None
    return 1


def translator(schema: Any, pg: PgType, names: dict[str, Any], namespace: str) -> Translate | None:
    """How a value of Avro type ``schema`` becomes input for the converter of ``pg`` (None: as it is)."""
    schema, namespace = resolve(schema, names, namespace)
    if isinstance(schema, list):
        live = [b for b in schema if b != "null"]
        if not live:
            return None
        if len(live) > 1:
            return _by_value(pg)
        schema, namespace = resolve(live[0], names, namespace)
    base, logical, info = avro_annotations(schema)
    kind = pg.name
    if base in ("bytes", "fixed"):
        scale = decimal_scale(info)
        if scale is not None:
            return _integral_decimal(scale, pg) if kind in INT_RANGES else _decimal_bytes(scale)
        if kind == "bytea":
            return None
        if kind == "uuid":
            return _uuid_from_bytes
        return _base64
    if logical == VARIABLE_SCALE_DECIMAL:
        return _variable_scale_decimal
    if base == "array" and pg.element is not None:  # a Postgres array: each element as its element type's input
        inner = translator(schema.get("items"), pg.element, names, namespace)
        if inner is None:
            return None
        translate_element = inner
        return lambda value: (
            [None if v is None else translate_element(v) for v in value] if type(value) is list else value
        )
    if base in ("record", "error", "array", "map"):
        if kind not in _TEXT_KINDS:
            return None  # the converter refuses a container, naming the column
        jsonable = _jsonable_for(schema, names, namespace)
        return lambda value: _json_text(jsonable(value))
    if base in ("int", "long"):
        unit = integer_unit(pg, logical)
        if unit is None:  # a timestamp into a date column: its day
            micros_per = _AVRO_TIMESTAMP_UNITS[logical or ""]
            return lambda value: scale_int(value, micros_per) // US_PER_DAY if type(value) is int else value
        if unit == 1:
            return None
        return _scaled_timestamp(unit) if kind in _TIMESTAMP_KINDS else _scaled(unit)
    if base in ("float", "double"):
        if kind in _INTEGRAL_KINDS:
            return _not_integral(pg)
        return _float_for(pg, single=base == "float")
    return None  # string, enum, boolean: as JSON has them


def _uuid_from_bytes(value: Any) -> Any:
    if type(value) is bytes:
        if len(value) != 16:
            raise Reject(f"{len(value)} bytes are not a valid uuid (16 bytes)")
        return str(uuid.UUID(bytes=value))
    return value
