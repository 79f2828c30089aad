"""What every converter shares: the contract of a converter, how a rejected value is reported, the fast JSON
parser, the Connect schema of a column, and the ranges and units of Postgres and Debezium values.

Both formats end in the same converters (:mod:`cdcsync.sources.debezium.converters`): JSON values as they are
parsed, Avro values once :mod:`cdcsync.sources.debezium.avro_values` has turned them into what JsonConverter
would have written. A converter takes ``(value, ctx)`` and returns the Python value for the output Arrow column,
or raises :class:`Reject` (the reason, without the column name) or :class:`Reparse`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from cdcsync.core.temporal import MICROS_PER_DAY, PYTHON_MAX_MICROS, PYTHON_MIN_MICROS

try:  # orjson is ~3x faster than the standard library; both give the same Python values for valid JSON.
    import orjson as _orjson

    fast_loads: Callable[[bytes], Any] = _orjson.loads

    def dumps_compact(value: Any) -> str:
        return _orjson.dumps(value).decode()

except ImportError:  # pragma: no cover - exercised only without orjson
    fast_loads = json.loads

    def dumps_compact(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


Ctx = tuple["dict[str, Any] | None", str, bytes]
"""A converter's context: the message's Connect schema or None, the struct the value is in (``after`` /
``before``, or ``''`` for the message key), and the raw message bytes."""
Converter = Callable[[Any, Ctx], Any]

DEBEZIUM_DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DEBEZIUM_BITS = "io.debezium.data.Bits"

# Microseconds per unit of the integer temporal encodings, by Connect / Debezium logical type name.
# A multiplier below 1 means "divide": nanoseconds -> microseconds is floor division by 1000.
TIMESTAMP_UNITS: dict[str, int] = {
    "io.debezium.time.Timestamp": 1000,
    "org.apache.kafka.connect.data.Timestamp": 1000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": -1000,
}
TIME_UNITS: dict[str, int] = {
    "io.debezium.time.Time": 1000,
    "org.apache.kafka.connect.data.Time": 1000,
    "io.debezium.time.MicroTime": 1,
    "io.debezium.time.NanoTime": -1000,
}

US_PER_DAY = MICROS_PER_DAY
MIN_US = PYTHON_MIN_MICROS  # years 1-9999: where a timestamp can be a Python datetime
MAX_US = PYTHON_MAX_MICROS
INT_RANGES = {"smallint": 2**15, "integer": 2**31, "bigint": 2**63}
"""Postgres integer types by the bound of their range: -bound ... bound - 1."""

_MAX_SHOWN = 60
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def scale_int(value: int, unit: int) -> int:
    """``value`` in microseconds, from a unit of :data:`TIMESTAMP_UNITS` / :data:`TIME_UNITS`."""
    return value * unit if unit > 0 else value // -unit


class Reject(Exception):
    """A value does not convert to its column's type; the message is the reason (without the column name)."""


class Reparse(Exception):
    """A value needs the exact text of a JSON number that the fast parser turned into a double (and the digits
    could not be recovered from the raw bytes): parse the message again with exact decimals."""


def show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        try:
            text = dumps_compact(value)
        except Exception:
            text = repr(value)
    elif isinstance(value, float) and not math.isfinite(value):
        text = repr(value)
    elif isinstance(value, Decimal):
        text = str(value)
    else:
        text = repr(value) if isinstance(value, str) else json.dumps(value)
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 3] + "..."
    return text


def bad(value: Any, expected: str, why: str = "") -> Reject:
    return Reject(f"{show(value)} is not a valid {expected}" + (f" ({why})" if why else ""))


def column_schema(ctx: Ctx, name: str) -> dict[str, Any] | None:
    """The Connect schema of column ``name`` inside field ``struct`` ('' = top level) of the message's schema,
    memoised on the schema dict (which the schema cache shares between messages)."""
    schema, struct, _ = ctx
    if schema is None:
        return None
    memo_key = "\x00cdcsync:" + struct
    by_name = schema.get(memo_key)
    if by_name is None:
        by_name = {}
        fields: Any = schema.get("fields")
        if struct and type(fields) is list:
            fields = next((f.get("fields") for f in fields if type(f) is dict and f.get("field") == struct), None)
        if type(fields) is list:
            for f in fields:
                if type(f) is dict and type(f.get("field")) is str:
                    by_name[f["field"]] = f
        schema[memo_key] = by_name
    found = by_name.get(name)
    return found if type(found) is dict else None


def logical_type(schema: dict[str, Any] | None) -> tuple[str | None, dict[str, Any]]:
    if schema is None:
        return None, {}
    params = schema.get("parameters")
    name = schema.get("name")
    return (name if type(name) is str else None), (params if type(params) is dict else {})


def b64(value: str) -> bytes:
    """Strict base64 (as JsonConverter writes bytes); raises ValueError (binascii.Error) otherwise."""
    return base64.b64decode(value, validate=True)


try:
    binascii.a2b_base64("", strict_mode=True)  # Python >= 3.11: the same check, without the regex

    def b64(value: str) -> bytes:
        """Strict base64 (as JsonConverter writes bytes); raises ValueError (binascii.Error) otherwise."""
        return binascii.a2b_base64(value, strict_mode=True)

except TypeError:  # pragma: no cover - Python 3.10
    pass


def reparse_huge_integer(value: Any) -> None:
    """The fast parser reads integers beyond 64 bits as doubles: have the message parsed again so that the
    value is reported (out of range) with its real digits."""
    if type(value) is float and value.is_integer() and abs(value) >= 2**63:
        raise Reparse()


def has_double(value: Any) -> bool:
    if type(value) is float:
        return True
    if type(value) is dict:
        return any(has_double(v) for v in value.values())
    if type(value) is list:
        return any(has_double(v) for v in value)
    return False


def dumps_exact(value: Any) -> str:
    if isinstance(value, dict):
        items = (json.dumps(str(k), ensure_ascii=False) + ":" + dumps_exact(v) for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps_exact(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def unscaled_decimals(values: list[int | None], arrow_type: Any) -> Any:
    """Unscaled integers (None: null) as a ``decimal128`` array of ``arrow_type``, written as its layout (16-byte
    two's complement) directly: exact at any width, where :class:`~decimal.Decimal` arithmetic rounds to its
    context's 28 digits, and several times faster. OverflowError if one has more digits than the precision."""
    import pyarrow as pa

    limit = 10**arrow_type.precision
    if any(u is not None and not -limit < u < limit for u in values):
        raise OverflowError(f"a value has more than {arrow_type.precision} digits")
    data = b"".join([(0 if u is None else u).to_bytes(16, "little", signed=True) for u in values])
    nulls = values.count(None)
    validity = pa.array([u is not None for u in values], type=pa.bool_()).buffers()[1] if nulls else None
    return pa.Array.from_buffers(arrow_type, len(values), [validity, pa.py_buffer(data)], null_count=nulls)


def describe_json(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_KINDS.get(type(value), type(value).__name__)
