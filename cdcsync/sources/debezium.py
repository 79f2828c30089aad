"""Decode Debezium JsonConverter change events: Kafka-shaped Arrow batches in, typed change rows out.

:func:`decode_batches` is the body of a Spark ``mapInArrow`` call, so everything here runs on executors: pure
Python plus pyarrow, picklable (a :class:`DecodeSpec` is a frozen dataclass of tuples), and it never raises for
bad input. A message that cannot be decoded becomes a *dead-letter row*: business and ``_cdc_*`` value columns
null, ``_cdc_topic`` / ``_cdc_partition`` / ``_cdc_offset`` set, ``_dlq_reason`` saying what is wrong and
``_dlq_key`` / ``_dlq_value`` holding the raw bytes. Good rows have the three ``_dlq_*`` columns null.
Tombstones (null values) produce no row at all.

``format: avro`` specs go to :mod:`cdcsync.sources.avro`, which feeds Avro values into this module's converters
and row decoder, so both formats produce identical rows and dead letters.

Both JsonConverter shapes are understood: ``{"schema": ..., "payload": ...}`` (``schemas.enable=true``; the
schema's logical type names and parameters decide how a value is read, e.g. the scale of a Connect ``Decimal``)
and the bare payload (``schemas.enable=false``; values are read by the declared Postgres type alone).

Decisions worth knowing (README material):

* Values are checked against the declared type and never rounded silently: an integer out of the column's range,
  a decimal with more digits than ``numeric(p,s)`` allows, a ``varchar(n)`` that is too long, a text with a NUL
  character (Postgres cannot store it) all become dead letters naming the column, the value and the type.
* Without the schema wrapper a string in a ``numeric`` column is read as a decimal literal; Connect ``Decimal``
  bytes (base64) need the wrapper to know their scale, so run Debezium with ``decimal.handling.mode=string``
  (or keep schemas enabled) when schemas are off.
* JSON numbers in ``numeric`` columns are read exactly from the message text (a fast JSON parser hands them over
  as doubles; the digits are recovered from the raw bytes, or the message is re-parsed with ``Decimal`` floats).
* Timestamps and times are kept to the microsecond (Postgres' precision); finer digits are truncated. A
  ``timestamp without time zone`` given as a string with an offset keeps its wall-clock time, as a Postgres cast
  does; a ``timestamptz`` string without an offset is taken as UTC. Dates and timestamps must lie in years
  1-9999.
* ``_cdc_version`` is ``source.lsn`` when the connector gives an integer LSN, else the Kafka offset, minus
  :data:`SNAPSHOT_SHIFT` (2**62) for snapshot reads so that they never outrank a streamed change;
  ``_cdc_ts`` is ``source.ts_ms``, else the payload's ``ts_ms``, else the Kafka message timestamp.
* ``character`` without a length is ``character(1)``, as in Postgres.

Speed (``benchmarks/decode.py``): messages are parsed with orjson when it is installed (else the standard
library); the Connect schema of a wrapped message is parsed once per distinct schema, not per message; each spec
gets a generated row decoder with the common cases inlined; decimals travel as unscaled integers into
``decimal128``; the cyclic garbage collector is paused while a batch is decoded.
"""

from __future__ import annotations

import base64
import binascii
import gc
import json
import math
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from cdcsync.config.types import PgType
from cdcsync.core.errors import DecodeError

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.config.pipeline import KafkaSource
    from cdcsync.sources.avro import SchemaRegistryAccess

try:  # orjson is ~3x faster than the standard library; both give the same Python values for valid JSON.
    import orjson as _orjson

    _fast_loads: Callable[[bytes], Any] = _orjson.loads

    def _dumps_compact(value: Any) -> str:
        return _orjson.dumps(value).decode()

except ImportError:  # pragma: no cover - exercised only without orjson
    _orjson = None  # type: ignore[assignment]
    _fast_loads = json.loads

    def _dumps_compact(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# Metadata and dead-letter columns, in output order, with their Spark types.
CDC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_cdc_op", "string"),
    ("_cdc_version", "bigint"),
    ("_cdc_ts", "timestamp"),
    ("_cdc_topic", "string"),
    ("_cdc_partition", "int"),
    ("_cdc_offset", "bigint"),
)
DLQ_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_dlq_reason", "string"),
    ("_dlq_key", "binary"),
    ("_dlq_value", "binary"),
)

_MAX_SHOWN = 60

_DEBEZIUM_DECIMAL = "org.apache.kafka.connect.data.Decimal"

# Microseconds per unit of the integer temporal encodings, by Connect / Debezium logical type name.
# A multiplier below 1 means "divide": nanoseconds -> microseconds is floor division by 1000.
_TIMESTAMP_UNITS: dict[str, int] = {
    "io.debezium.time.Timestamp": 1000,
    "org.apache.kafka.connect.data.Timestamp": 1000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": -1000,
}
_TIME_UNITS: dict[str, int] = {
    "io.debezium.time.Time": 1000,
    "org.apache.kafka.connect.data.Time": 1000,
    "io.debezium.time.MicroTime": 1,
    "io.debezium.time.NanoTime": -1000,
}

_US_PER_DAY = 86_400_000_000
_MIN_DAYS = (date(1, 1, 1) - date(1970, 1, 1)).days  # -719162
_MAX_DAYS = (date(9999, 12, 31) - date(1970, 1, 1)).days  # 2932896
_MIN_US = _MIN_DAYS * _US_PER_DAY
_MAX_US = (_MAX_DAYS + 1) * _US_PER_DAY - 1
_MIN_TS_MS = _MIN_US // 1000
_MAX_TS_MS = _MAX_US // 1000
_MAX_BIGINT = 2**63 - 1
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_US = timedelta(microseconds=1)
_FLOAT32_MAX = 3.4028234663852886e38

_DECIMAL_PARTS_RE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?")
_ISO_DATE_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?")
_ISO_TS_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:[.,]([0-9]+))?)?"
    r"\s*(Z|z|[+-][0-9]{2}(?::?[0-9]{2}(?::?[0-9]{2})?)?)?"
)
_TIME_RE = re.compile(r"([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?")
_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_NUMERIC_WORDS = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}
_INT_RANGES = {"smallint": 2**15, "integer": 2**31, "bigint": 2**63}


# --------------------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeSpec:
    """What to decode: the source's business columns (declared order) and where its primary key comes from."""

    source_id: str
    columns: tuple[tuple[str, PgType], ...]
    primary_key: tuple[str, ...] | None = None
    """Key columns; ``None`` takes them from the fields of the Kafka message key."""
    format: str = "json"
    """``json`` (JsonConverter, this module) or ``avro`` (Confluent wire format, :mod:`cdcsync.sources.avro`)."""
    schema_registry: SchemaRegistryAccess | None = None
    """Where ``avro`` writer schemas come from (its secrets stay out of ``repr``); None for ``json``."""
    time_precision_mode: str = "adaptive"
    """The connector's ``time.precision.mode``: the unit of integer times in JSON messages without schemas."""
    detect_schema_changes: bool = False
    """Stop at a message whose schema (JSON wrapper, Avro writer schema) has a field the columns lack, or a
    recorded column of another type (:func:`schema_change_of`); the runtime sets it for every source."""
    schema_types: tuple[tuple[str, str], ...] = ()
    """Column -> the type its schema mapped to when ``cdcsync init`` read it (recorded in the migrations)."""

    @classmethod
    def from_source(
        cls,
        source_id: str,
        source: KafkaSource,
        schema_registry: SchemaRegistryAccess | None = None,
        schema_types: tuple[tuple[str, str], ...] = (),
    ) -> DecodeSpec:
        primary_key = tuple(source.primary_key) if source.primary_key else None
        return cls(
            source_id=source_id,
            columns=tuple(source.column_types().items()),
            primary_key=primary_key,
            format=source.format,
            # Only Avro sources carry the registry (and its credentials) to the executors.
            schema_registry=schema_registry if source.format == "avro" else None,
            time_precision_mode=source.time_precision_mode,
            detect_schema_changes=True,
            schema_types=schema_types,
        )


def _quote_ddl(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def output_spark_schema(spec: DecodeSpec, *, dead_letters: bool = True) -> str:
    """Spark DDL of :func:`decode_batches`' output: business columns, ``_cdc_*``, then ``_dlq_*`` (unless
    ``dead_letters`` is false: the changes alone, as :class:`~cdcsync.sources.kafka.DecodeTask` passes them on).

    Also checks the spec (every type decodable, key columns declared) so that a bad one fails on the driver
    with a :class:`~cdcsync.core.errors.DecodeError`, before Spark ships it to executors."""
    _plan_for(spec)
    return ", ".join(f"{_quote_ddl(name)} {spark_type}" for name, spark_type in _output_fields(spec, dead_letters))


def _output_fields(spec: DecodeSpec, dead_letters: bool) -> list[tuple[str, str]]:
    fields = [(name, pg_type.spark_type) for name, pg_type in spec.columns]
    return [*fields, *CDC_COLUMNS, *(DLQ_COLUMNS if dead_letters else ())]


_DECIMAL_TYPE_RE = re.compile(r"decimal\((\d+),(\d+)\)")


def _arrow_type(spark_type: str) -> pa.DataType:
    import pyarrow as pa

    simple = {
        "smallint": pa.int16(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "string": pa.string(),
        "binary": pa.binary(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "timestamp_ntz": pa.timestamp("us"),
    }
    if spark_type in simple:
        return simple[spark_type]
    match = _DECIMAL_TYPE_RE.fullmatch(spark_type)
    if match:
        return pa.decimal128(int(match.group(1)), int(match.group(2)))
    if spark_type.startswith("array<") and spark_type.endswith(">"):
        return pa.list_(_arrow_type(spark_type[6:-1]))
    raise DecodeError(f"Spark type '{spark_type}' has no Arrow counterpart in the decoder")


def output_arrow_schema(spec: DecodeSpec, *, dead_letters: bool = True) -> pa.Schema:
    """The Arrow schema of the batches :func:`decode_batches` yields; matches :func:`output_spark_schema`."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(name, _arrow_type(spark_type), nullable=True)
            for name, spark_type in _output_fields(spec, dead_letters)
        ]
    )


def decode_batches(batches: Iterator[pa.RecordBatch], spec: DecodeSpec) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: Kafka source batches (key, value, topic, partition, offset, timestamp, ...) in,
    decoded change rows and dead letters out (schema :func:`output_arrow_schema`). Never raises for bad input."""
    if spec.format == "avro":
        from cdcsync.sources.avro import decode_avro_batches

        yield from decode_avro_batches(batches, spec)
        return
    plan = _plan_for(spec)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        out = plan.decode_batch(batch)
        if out.num_rows:
            yield out


# --------------------------------------------------------------------------------------------------------------
# Value conversion
# --------------------------------------------------------------------------------------------------------------


class _Reject(Exception):
    """A value does not convert to its column's type; the message is the reason (without the column name)."""


class _Reparse(Exception):
    """A value needs the exact text of a JSON number that the fast parser turned into a double (and the digits
    could not be recovered from the raw bytes): parse the message again with exact decimals."""


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        try:
            text = _dumps_compact(value)
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


def _bad(value: Any, expected: str, why: str = "") -> _Reject:
    return _Reject(f"{_show(value)} is not a valid {expected}" + (f" ({why})" if why else ""))


def _column_schema(ctx: _Ctx, name: str) -> dict[str, Any] | None:
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


def _logical(schema: dict[str, Any] | None) -> tuple[str | None, dict[str, Any]]:
    if schema is None:
        return None, {}
    params = schema.get("parameters")
    name = schema.get("name")
    return (name if type(name) is str else None), (params if type(params) is dict else {})


def _b64(value: str) -> bytes:
    """Strict base64 (as JsonConverter writes bytes); raises ValueError (binascii.Error) otherwise."""
    return base64.b64decode(value, validate=True)


try:
    binascii.a2b_base64("", strict_mode=True)  # Python >= 3.11: the same check, without the regex

    def _b64(value: str) -> bytes:
        """Strict base64 (as JsonConverter writes bytes); raises ValueError (binascii.Error) otherwise."""
        return binascii.a2b_base64(value, strict_mode=True)

except TypeError:  # pragma: no cover - Python 3.10
    pass


# A converter takes (JSON value, context) and returns the Python value for the output Arrow column, or raises
# _Reject. The context is (the message's Connect schema or None, the struct the value is in: "after" / "before",
# or "" for the message key, the raw message bytes).
_Ctx = tuple["dict[str, Any] | None", str, bytes]
Converter = Callable[[Any, _Ctx], Any]


def _reparse_huge_integer(value: Any) -> None:
    """The fast parser reads integers beyond 64 bits as doubles: have the message parsed again so that the
    value is reported (out of range) with its real digits."""
    if type(value) is float and value.is_integer() and abs(value) >= 2**63:
        raise _Reparse()


def _has_double(value: Any) -> bool:
    if type(value) is float:
        return True
    if type(value) is dict:
        return any(_has_double(v) for v in value.values())
    if type(value) is list:
        return any(_has_double(v) for v in value)
    return False


def _int_converter(pg: PgType) -> Converter:
    bound = _INT_RANGES[pg.name]
    low, high = -bound, bound - 1
    expected = pg.sql

    def convert(value: Any, ctx: _Ctx) -> Any:
        if type(value) is int:
            if low <= value <= high:
                return value
            raise _Reject(f"{_show(value)} is out of range for {expected}")
        if value is None:
            return None
        _reparse_huge_integer(value)
        raise _bad(value, expected, "not an integer")

    return convert


def _float_converter(pg: PgType) -> Converter:
    single = pg.name == "real"
    expected = pg.sql

    def convert(value: Any, ctx: _Ctx) -> Any:
        kind = type(value)
        if kind is float:
            result = value
        elif kind is int or kind is Decimal:
            try:
                result = float(value)
            except OverflowError:
                raise _Reject(f"{_show(value)} is out of range for {expected}") from None
            if math.isinf(result):
                raise _Reject(f"{_show(value)} is out of range for {expected}")
        elif kind is str:
            if value not in _FLOAT_WORDS:
                raise _bad(value, expected, "expected a number, 'NaN', 'Infinity' or '-Infinity'")
            return _FLOAT_WORDS[value]
        elif value is None:
            return None
        else:
            raise _bad(value, expected, "not a number")
        if single and math.isfinite(result) and abs(result) > _FLOAT32_MAX:
            raise _Reject(f"{_show(value)} is out of range for {expected}")
        return result

    return convert


_POSTGRES_MAX_INTEGER_DIGITS = 131_072
_POSTGRES_MAX_FRACTION_DIGITS = 16_383
_MAX_SHIFT = 1_100  # beyond any Postgres numeric precision (1000): rejected without computing 10**shift


def _text_parts(text: str) -> tuple[int, int]:
    match = _DECIMAL_PARTS_RE.fullmatch(text)
    if match is None or not (match.group(2) or match.group(3)):
        raise ValueError(text)
    whole, fraction, exponent = match.group(2, 3, 4)
    coefficient = int((whole or "") + (fraction or "") or "0")
    return (-coefficient if match.group(1) == "-" else coefficient), (int(exponent) if exponent else 0) - len(
        fraction or ""
    )


def _decimal_parts(
    value: Any, ctx: _Ctx, name: str, json_name: bytes, number_pattern: re.Pattern[bytes], expected: str
) -> tuple[int, int] | str:
    """A Debezium numeric value as (coefficient, exponent), or 'NaN' / 'Infinity' / '-Infinity'."""
    kind = type(value)
    if kind is int:
        return value, 0
    if kind is float:  # a JSON number, which the fast parser read as a double: take its digits from the bytes
        parts = _exact_number(ctx[2], json_name, number_pattern, value)
        if parts is None:
            raise _Reparse()
        return parts
    try:
        if kind is str:
            logical, params = _logical(_column_schema(ctx, name))
            if logical == _DEBEZIUM_DECIMAL:
                try:
                    return int.from_bytes(_b64(value), "big", signed=True), -int(params.get("scale", 0))
                except ValueError:
                    raise _bad(value, expected, "not base64 Connect Decimal bytes with a scale") from None
            if value in _NUMERIC_WORDS:
                return _NUMERIC_WORDS[value]
            return _text_parts(value)
        if kind is Decimal:
            if not value.is_finite():
                return "NaN" if value.is_nan() else ("-Infinity" if value.is_signed() else "Infinity")
            sign, digits, exponent = value.as_tuple()
            coefficient = int("".join(map(str, digits)) or "0")
            return (-coefficient if sign else coefficient), int(exponent)
        if kind is dict:  # io.debezium.data.VariableScaleDecimal {scale, value}
            scale, digits = value.get("scale"), value.get("value")
            if type(scale) is int and type(digits) is str:
                return int.from_bytes(_b64(digits), "big", signed=True), -scale
            raise _bad(value, expected, "not a VariableScaleDecimal {scale, value}")
    except ValueError:  # includes binascii.Error and Python's limit on digits in int(str)
        raise _bad(value, expected, "not a decimal number") from None
    raise _bad(value, expected, "not a number")


def _unscaled_text(unscaled: int, scale: int) -> str:
    if scale <= 0:
        return str(unscaled * 10**-scale)
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    return ("-" if unscaled < 0 else "") + digits[:-scale] + "." + digits[-scale:]


def _numeric_converter(name: str, pg: PgType) -> Converter:
    """Decimal columns yield the unscaled integer at the column's scale (built into decimal128 per batch);
    numeric columns without a Spark decimal counterpart yield the exact decimal text."""
    expected = pg.sql
    spark_decimal = pg.spark_type.startswith("decimal")
    json_name = _dumps_compact(name).encode() + b":"
    number_pattern = _number_pattern(json_name)

    if not pg.args:  # unconstrained numeric

        def convert_free(value: Any, ctx: _Ctx) -> Any:
            if value is None:
                return None
            parts = _decimal_parts(value, ctx, name, json_name, number_pattern, expected)
            if isinstance(parts, str):
                return parts
            coefficient, exponent = parts
            if coefficient == 0:  # keeps its scale, as Postgres does (0.000)
                return _unscaled_text(0, -exponent) if exponent < 0 else "0"
            digits = len(str(abs(coefficient)))
            if digits + exponent > _POSTGRES_MAX_INTEGER_DIGITS or -exponent > _POSTGRES_MAX_FRACTION_DIGITS:
                raise _Reject(f"{_show(value)} is out of range for numeric")
            return _unscaled_text(coefficient, -exponent) if exponent < 0 else str(coefficient * 10**exponent)

        return convert_free

    precision = pg.args[0]
    scale = pg.args[1] if len(pg.args) > 1 else 0
    limit = 10**precision
    powers = [10**k for k in range(precision + 1)]

    def convert(value: Any, ctx: _Ctx) -> Any:
        if value is None:
            return None
        parts = _decimal_parts(value, ctx, name, json_name, number_pattern, expected)
        if isinstance(parts, str):
            if parts == "NaN" and not spark_decimal:
                return "NaN"
            raise _Reject(f"{_show(value)} does not fit {expected} (not a finite number)")
        coefficient, exponent = parts
        shift = exponent + scale
        if shift >= 0:
            if coefficient == 0:
                return 0 if spark_decimal else _unscaled_text(0, scale)
            if shift > precision:
                raise _Reject(f"{_show(value)} does not fit {expected} (more than {precision - scale} integer digits)")
            unscaled = coefficient * powers[shift]
        else:
            if -shift > _MAX_SHIFT:
                remainder = coefficient
                unscaled = 0
            else:
                unscaled, remainder = divmod(coefficient, 10**-shift)
            if remainder:
                raise _Reject(f"{_show(value)} does not fit {expected} (more than {scale} digits after the point)")
        if not -limit < unscaled < limit:
            raise _Reject(f"{_show(value)} does not fit {expected} (more than {precision - scale} integer digits)")
        return unscaled if spark_decimal else _unscaled_text(unscaled, scale)

    return convert


def _bool_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: _Ctx) -> Any:
        if value is True or value is False or value is None:
            return value
        raise _bad(value, "boolean", "expected true or false")

    return convert


def _json_text(value: Any) -> str:
    """Compact JSON text of a parsed value (Decimals from the exact re-parse written as they came)."""
    try:
        return _dumps_compact(value)
    except Exception:
        return _dumps_exact(value)


def _dumps_exact(value: Any) -> str:
    if isinstance(value, dict):
        items = (json.dumps(str(k), ensure_ascii=False) + ":" + _dumps_exact(v) for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dumps_exact(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _text_converter(pg: PgType) -> Converter:
    expected = pg.sql
    is_json = pg.name in ("json", "jsonb")
    max_length = pg.args[0] if pg.args and pg.name in ("character varying", "character") else None
    if pg.name == "character" and not pg.args:
        max_length = 1  # Postgres: character without a length is character(1)

    def convert(value: Any, ctx: _Ctx) -> Any:
        kind = type(value)
        if kind is str:
            text = value
        elif value is None:
            return None
        elif kind is dict or kind is list:
            if _has_double(value):  # keep the numbers' exact text (12.50 stays 12.50): parse exactly
                raise _Reparse()
            try:
                text = _json_text(value)
            except ValueError:
                raise _bad(value, expected, "not representable as JSON") from None
        elif kind is bool:
            text = "true" if value else "false"
        elif kind is int or kind is Decimal:
            text = str(value)
        elif kind is float:
            if is_json and not math.isfinite(value):
                raise _bad(value, expected, "NaN and Infinity are not JSON")
            text = repr(value) if math.isfinite(value) else _show(value)
        else:
            raise _bad(value, expected)
        if "\x00" in text:
            raise _bad(value, expected, "Postgres text cannot contain NUL characters")
        if is_json and text == UNAVAILABLE_PLACEHOLDER:
            return UNAVAILABLE_JSON  # an unchanged TOASTed json column: valid JSON, so that it reaches the merge
        if max_length is not None and len(text) > max_length:
            if text[max_length:].strip(" "):
                raise _Reject(f"{_show(value)} is longer than {expected} allows")
            text = text[:max_length]  # Postgres also cuts excess trailing spaces silently
        return text

    return convert


def _uuid_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: _Ctx) -> Any:
        if type(value) is str:
            try:
                return str(uuid.UUID(value))
            except ValueError:
                raise _bad(value, "uuid") from None
        if value is None:
            return None
        raise _bad(value, "uuid", "expected a string")

    return convert


def _bytea_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: _Ctx) -> Any:
        if type(value) is str:
            try:
                return _b64(value)
            except (ValueError, binascii.Error):
                raise _bad(value, "bytea", "expected base64 as JsonConverter writes bytes") from None
        if value is None or type(value) is bytes:  # bytes: Avro, already binary
            return value
        raise _bad(value, "bytea", "expected a base64 string")

    return convert


def _date_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: _Ctx) -> Any:
        kind = type(value)
        if kind is int:
            days = value
        elif kind is str:
            match = _ISO_DATE_RE.fullmatch(value)
            if not match:
                raise _bad(value, "date", "expected days since 1970-01-01 or an ISO date")
            try:
                days = date(int(match[1]), int(match[2]), int(match[3])).toordinal() - 719163
            except ValueError:
                raise _bad(value, "date") from None
        elif value is None:
            return None
        else:
            _reparse_huge_integer(value)
            raise _bad(value, "date", "expected days since 1970-01-01 or an ISO date")
        if not _MIN_DAYS <= days <= _MAX_DAYS:
            raise _Reject(f"{_show(value)} is out of range for date (years 1-9999)")
        return days

    return convert


def _scale_int(value: int, unit: int) -> int:
    return value * unit if unit > 0 else value // -unit


def _parse_iso_timestamp(text: str, *, keep_wall_clock: bool) -> datetime:
    """An ISO-8601 timestamp string as a datetime that pyarrow stores correctly: aware ones are converted to
    UTC by pyarrow for ``timestamptz``; naive ones are taken as UTC. Raises ValueError."""
    if text[-1:] == "Z":  # UTC, as Debezium writes ZonedTimestamp: a naive datetime is UTC to pyarrow, and cheaper
        try:
            parsed = datetime.fromisoformat(text[:-1])
        except ValueError:
            parsed = _parse_iso_timestamp_slow(text)
    else:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            parsed = _parse_iso_timestamp_slow(text)
    if parsed.tzinfo is not None:
        if keep_wall_clock:
            return parsed.replace(tzinfo=None)
        if parsed.year == 1 or parsed.year == 9999:  # the offset may take it out of years 1-9999 in UTC
            micros = (parsed - _EPOCH_UTC) // _ONE_US
            if not _MIN_US <= micros <= _MAX_US:
                raise ValueError(text)
    return parsed


def _parse_iso_timestamp_slow(text: str) -> datetime:
    """ISO forms ``datetime.fromisoformat`` of older Pythons refuses: ``Z``, 1-9 fraction digits, ``+hhmm``."""
    match = _ISO_TS_RE.fullmatch(text.strip())
    if not match:
        raise ValueError(text)
    year, month, day, hour, minute = (int(match[i]) for i in range(1, 6))
    second = int(match[6] or 0)
    micros = int((match[7] or "").ljust(6, "0")[:6])
    tz = None
    offset = match[8]
    if offset:
        if offset in ("Z", "z"):
            tz = timezone.utc
        else:
            digits = offset[1:].replace(":", "")
            delta = timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0), seconds=int(digits[4:6] or 0))
            tz = timezone(-delta if offset[0] == "-" else delta)
    return datetime(year, month, day, hour, minute, second, micros, tzinfo=tz)


def _time_text(micros: int) -> str:
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{hour:02d}:{minute:02d}:{second:02d}"
    return f"{text}.{fraction:06d}" if fraction else text


def _bare_unit(pg: PgType, time_mode: str | None) -> int:
    """Microseconds per unit of an integer time or timestamp in a message without schemas, as the connector's
    ``time.precision.mode`` writes it for a column of this precision (None: microseconds, e.g. for Avro, whose
    values arrive already scaled)."""
    if time_mode is None:
        return 1
    if time_mode == "connect":
        return 1000
    if pg.name == "time without time zone" and time_mode == "adaptive_time_microseconds":
        return 1
    return 1000 if pg.fraction_digits <= 3 else 1


def _precision_check(pg: PgType) -> int:
    """1, or the step (in microseconds) a value of a ``time(p)``/``timestamp(p)`` column must be a multiple of:
    Postgres would round finer digits on COPY, and nothing is rounded silently."""
    return 10 ** (6 - pg.fraction_digits)


def _too_fine(value: Any, expected: str) -> _Reject:
    return _Reject(f"{_show(value)} has more fractional-second digits than {expected} keeps")


def _timestamp_column(name: str, pg: PgType, time_mode: str | None = None) -> Converter:
    with_tz = pg.name == "timestamp with time zone"
    expected = pg.sql
    bare_unit = 1 if with_tz else _bare_unit(pg, time_mode)
    step = _precision_check(pg)

    def convert(value: Any, ctx: _Ctx) -> Any:
        kind = type(value)
        if kind is str:
            try:  # years 1-9999 by construction
                parsed = _parse_iso_timestamp(value, keep_wall_clock=not with_tz)
            except (ValueError, OverflowError):
                raise _bad(value, expected, "not an ISO-8601 timestamp") from None
            if step > 1 and parsed.microsecond % step:
                raise _too_fine(value, expected)
            return parsed
        if kind is int:
            if ctx[0] is not None:
                micros = _scale_int(value, _TIMESTAMP_UNITS.get(_logical(_column_schema(ctx, name))[0] or "", 1))
            else:
                micros = value * bare_unit
        elif value is None:
            return None
        else:
            _reparse_huge_integer(value)
            raise _bad(value, expected, "expected an epoch integer or an ISO-8601 string")
        if not _MIN_US <= micros <= _MAX_US:
            raise _Reject(f"{_show(value)} is out of range for {expected} (years 1-9999)")
        if step > 1 and micros % step:
            raise _too_fine(value, expected)
        return micros

    return convert


def _time_column(name: str, pg: PgType, time_mode: str | None = None) -> Converter:
    expected = pg.sql
    bare_unit = _bare_unit(pg, time_mode)
    step = _precision_check(pg)

    def convert(value: Any, ctx: _Ctx) -> Any:
        kind = type(value)
        if kind is int:
            if ctx[0] is not None:
                micros = _scale_int(value, _TIME_UNITS.get(_logical(_column_schema(ctx, name))[0] or "", 1))
            else:
                micros = value * bare_unit
            if not 0 <= micros <= _US_PER_DAY:
                raise _Reject(f"{_show(value)} is out of range for {expected}")
        elif kind is str:
            match = _TIME_RE.fullmatch(value)
            micros = -1
            if match:
                hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
                total = ((hour * 60 + minute) * 60 + second) * 1_000_000 + int((match[4] or "").ljust(6, "0")[:6])
                if minute < 60 and second < 60 and total <= _US_PER_DAY:
                    micros = total
            if micros < 0:
                raise _bad(value, expected, "expected HH:MM[:SS[.ffffff]] or microseconds since midnight")
        elif value is None:
            return None
        else:
            _reparse_huge_integer(value)
            raise _bad(value, expected, "expected microseconds since midnight or HH:MM:SS")
        if step > 1 and micros % step:
            raise _too_fine(value, expected)
        return _time_text(micros)

    return convert


def _interval_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: _Ctx) -> Any:
        if type(value) is str:  # io.debezium.time.Interval: ISO-8601 duration, which Postgres reads as is
            if "\x00" in value:
                raise _bad(value, "interval")
            return value
        if type(value) is int:  # io.debezium.time.MicroDuration
            return f"{value} microseconds"
        if value is None:
            return None
        raise _bad(value, "interval", "expected microseconds or an ISO-8601 duration")

    return convert


_TIMETZ_RE = re.compile(
    r"([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?\s*(Z|z|[+-][0-9]{2}(?::?[0-9]{2}(?::?[0-9]{2})?)?)"
)
_DEBEZIUM_BITS = "io.debezium.data.Bits"


def _timetz_converter(pg: PgType) -> Converter:
    """``time with time zone`` from io.debezium.time.ZonedTime (``HH:MM:SS[.f]Z``, Debezium converts it to UTC)
    or any ``HH:MM[:SS[.f]]±hh[:mm]``. Written back with its offset, fraction truncated to microseconds."""
    expected = pg.sql
    step = _precision_check(pg)

    def convert(value: Any, ctx: _Ctx) -> Any:
        if type(value) is str:
            match = _TIMETZ_RE.fullmatch(value.strip())
            if match:
                hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
                micros = int((match[4] or "").ljust(6, "0")[:6])
                total = ((hour * 60 + minute) * 60 + second) * 1_000_000 + micros
                offset = match[5]
                offset_hours = 0 if offset in ("Z", "z") else int(offset[1:3])
                if minute < 60 and second < 60 and total <= _US_PER_DAY and offset_hours <= 15:
                    if step > 1 and total % step:
                        raise _too_fine(value, expected)
                    zone = "+00" if offset in ("Z", "z") else offset
                    return _time_text(total) + zone
            raise _bad(value, expected, "expected HH:MM:SS[.ffffff] with a UTC offset, as ZonedTime writes it")
        if value is None:
            return None
        raise _bad(value, expected, "expected a ZonedTime string")

    return convert


def _bits_converter(name: str, pg: PgType) -> Converter:
    """``bit(n)`` / ``bit varying(n)`` from io.debezium.data.Bits: base64 bytes, little-endian, the last bit of
    the string in the lowest bit of the first byte, trailing zero bytes dropped. ``bit(n)`` gets its leading zeros
    back from n; a ``bit varying`` value cannot (Debezium drops them), so it comes back without them. A one-bit
    column arrives as a boolean. Written as the Postgres bit-string literal (``0101``)."""
    expected = pg.sql
    width = None
    if pg.name == "bit":
        width = pg.args[0] if pg.args else 1  # Postgres: bit without a length is bit(1)
    limit = width if width is not None else (pg.args[0] if pg.args else None)

    def convert(value: Any, ctx: _Ctx) -> Any:
        if value is True or value is False:
            bits = "1" if value else "0"
        elif type(value) is str:
            logical = _logical(_column_schema(ctx, name))[0] if ctx[0] is not None else _DEBEZIUM_BITS
            if logical == _DEBEZIUM_BITS:
                try:
                    number = int.from_bytes(_b64(value), "little")
                except ValueError:
                    raise _bad(value, expected, "not base64 Bits bytes") from None
                bits = format(number, "b") if width is None else format(number, "b").rjust(width, "0")
            elif value and not value.strip("01"):
                bits = value
            else:
                raise _bad(value, expected, "expected Bits bytes or a string of 0s and 1s")
        elif value is None:
            return None
        else:
            raise _bad(value, expected, "expected Bits bytes (base64) or a boolean")
        if limit is not None and len(bits) > limit:
            raise _Reject(f"{_show(value)} has {len(bits)} bits, more than {expected} holds")
        if width is not None and len(bits) < width:
            bits = bits.rjust(width, "0")
        return bits

    return convert


def _array_converter(name: str, pg: PgType, source_id: str, time_mode: str | None) -> Converter:
    """Arrays: a JSON list, each element read by the element type's converter with the schema's ``items`` as
    its Connect schema (so a ``numeric(10,2)[]`` element may be Decimal bytes with the array's scale). Decimal
    elements become ``Decimal`` for Arrow's list of decimal128; one-dimensional arrays only."""
    assert pg.element is not None
    element = pg.element
    convert_element = _converter_for(name, element, source_id, time_mode)
    decimal_scale = -1
    if element.spark_type.startswith("decimal"):
        decimal_scale = element.args[1] if len(element.args) > 1 else 0
    expected = pg.sql
    memo_key = "\x00cdcsync:items"

    def element_ctx(ctx: _Ctx) -> _Ctx:
        column = _column_schema(ctx, name) if ctx[0] is not None else None
        if column is None:
            return (None, "", b"")
        synthetic = column.get(memo_key)
        if synthetic is None:
            items = column.get("items")
            synthetic = {"fields": [dict(items, field=name) if type(items) is dict else {"field": name}]}
            column[memo_key] = synthetic
        return (synthetic, "", b"")

    def convert(value: Any, ctx: _Ctx) -> Any:
        if type(value) is not list:
            if value is None:
                return None
            if value == UNAVAILABLE_PLACEHOLDER:
                raise _bad(
                    value,
                    expected,
                    "an unchanged TOASTed array of a type Debezium has no placeholder for; use REPLICA IDENTITY FULL",
                )
            raise _bad(value, expected, "expected a JSON array")
        inner = element_ctx(ctx)
        out: list[Any] = []
        for item in value:
            if type(item) is list:
                raise _bad(value, expected, "multidimensional arrays are not supported")
            try:
                converted = convert_element(item, inner)
            except _Reject as error:
                raise _Reject(f"element {len(out) + 1}: {error}") from None
            if decimal_scale >= 0 and type(converted) is int:
                converted = Decimal(f"{converted}E-{decimal_scale}")
            out.append(converted)
        return out

    return convert


def _converter_for(name: str, pg: PgType, source_id: str, time_mode: str | None = None) -> Converter:
    """The converter of one column; ``time_mode`` is the connector's ``time.precision.mode`` for integer times in
    messages without schemas (None: they are microseconds)."""
    kind = pg.name
    if kind == "array":
        return _array_converter(name, pg, source_id, time_mode)
    if kind == "time with time zone":
        return _timetz_converter(pg)
    if kind in ("bit", "bit varying"):
        return _bits_converter(name, pg)
    if kind in _INT_RANGES:
        return _int_converter(pg)
    if kind in ("real", "double precision"):
        return _float_converter(pg)
    if kind == "numeric":
        return _numeric_converter(name, pg)
    if kind == "boolean":
        return _bool_converter(pg)
    if kind in ("text", "character varying", "character", "json", "jsonb"):
        return _text_converter(pg)
    if kind == "uuid":
        return _uuid_converter(pg)
    if kind == "bytea":
        return _bytea_converter(pg)
    if kind == "date":
        return _date_converter(pg)
    if kind in ("timestamp without time zone", "timestamp with time zone"):
        return _timestamp_column(name, pg, time_mode)
    if kind == "time without time zone":
        return _time_column(name, pg, time_mode)
    if kind == "interval":
        return _interval_converter(pg)
    raise DecodeError(f"source '{source_id}': column '{name}': type {pg.sql} is not supported by the JSON decoder")


# --------------------------------------------------------------------------------------------------------------
# Connect schemas -> column types (introspection) and schema changes
# --------------------------------------------------------------------------------------------------------------

_VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
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
    _VARIABLE_SCALE_DECIMAL: "numeric",
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
        return f"{_show(schema)} is not a Connect schema"
    base, name = schema.get("type"), schema.get("name")
    logical, params = _logical(schema)
    if base == "array":
        items = schema.get("items")
        element = connect_pg_type(items)
        if isinstance(element, str):
            return f"array of {element}"
        if element.is_array:
            return "arrays of arrays are not supported"
        return PgType("array", (), element)
    if logical is not None:
        if logical == _DEBEZIUM_DECIMAL:
            scale, precision = _int_param(params, "scale"), _int_param(params, "connect.decimal.precision")
            if scale is None or scale < 0 or (precision is not None and not 0 < precision >= scale):
                return f"Decimal parameters {_show(params)} are not a Postgres numeric"
            return PgType("numeric", (precision, scale)) if precision else PgType("numeric")
        if logical in _TIMESTAMP_UNITS:
            return PgType("timestamp without time zone", (3,) if _TIMESTAMP_UNITS[logical] == 1000 else ())
        if logical in _TIME_UNITS:
            return PgType("time without time zone", (3,) if _TIME_UNITS[logical] == 1000 else ())
        if logical in _CONNECT_DATES:
            return PgType("date")
        if logical == _DEBEZIUM_BITS:
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


SCHEMA_CHANGE_MARKER = "[cdcsync:schema-change]"
"""Starts a decode result that is not a dead letter but a schema change: the batch must stop (see
:func:`schema_change_of` and :class:`cdcsync.sources.kafka.DecodeTask`)."""


def schema_change_of(spec: DecodeSpec, fields: list[dict[str, Any]]) -> str | None:
    """The schema-change reason for a message whose row has these Connect field schemas, or None.

    A change is a field the source's columns lack (a column added at the source), or a column whose recorded
    schema type (``spec.schema_types``: what ``cdcsync init`` read) differs from the type the field maps to now.
    A column the schema lacks is no change: Debezium stops sending a dropped column, and it lands as NULL. The
    reason is the marker followed by one line of JSON: every field with its type (or why it has none), the
    added ones and the changed ones."""
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
    detail = {"fields": mapped, "added": added, "changed": changed}
    return f"{SCHEMA_CHANGE_MARKER} {json.dumps(detail, separators=(',', ':'))}"


# --------------------------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------------------------

_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
_WRAPPED_PREFIX = b'{"schema":'
_PAYLOAD_MARK = b',"payload":'
_SCHEMA_CACHE: dict[bytes, dict[str, Any]] = {}
_SCHEMA_CACHE_SIZE = 256
_RECENT_SCHEMAS: list[tuple[bytes, dict[str, Any]]] = []  # (b'{"schema":' + schema bytes, parsed), newest first
_RECENT_SCHEMAS_SIZE = 8


def _loads_exact(raw: bytes, what: str) -> tuple[Any, str | None]:
    """Parse with the standard library (exact Decimals for non-integers, NaN/Infinity literals accepted);
    returns (object, None) or (None, reason)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, f"{what} is not valid UTF-8 (byte 0x{raw[error.start]:02x} at position {error.start})"
    try:
        return json.loads(text, parse_float=Decimal), None
    except json.JSONDecodeError as error:
        return None, f"{what} is not JSON: {error.msg} at line {error.lineno} column {error.colno}"
    except ValueError as error:  # e.g. an integer with more digits than Python converts
        return None, f"{what} is not usable JSON: {error}"
    except RecursionError:
        return None, f"{what} is not usable JSON: nested too deeply"


def _loads(raw: bytes, what: str) -> tuple[Any, str | None]:
    try:
        return _fast_loads(raw), None
    except Exception:  # invalid JSON, or a number the fast parser refuses: let the exact parser decide
        return _loads_exact(raw, what)


def _fast_wrapped(raw: bytes) -> tuple[dict[str, Any], Any] | None:
    """(schema, payload) of a compact ``{"schema":...,"payload":...}`` message (``raw`` starts with
    ``_WRAPPED_PREFIX``), parsing each distinct schema once. None means: take the general path.

    JsonConverter writes the schema first, byte-identical for every message of a table. A message that starts
    with the exact bytes of a schema seen before, followed by ``,"payload":``, has that schema (it is a complete
    JSON value, so it fixes the structure); that check is a memcmp. Otherwise the schema ends at the first
    ``,"payload":``: a false one inside the schema leaves an unbalanced prefix that does not parse."""
    if not raw.endswith(b"}"):
        return None
    schema: dict[str, Any] | None = None
    for prefix, known in _RECENT_SCHEMAS:
        if raw.startswith(prefix) and raw.startswith(_PAYLOAD_MARK, len(prefix)):
            schema, split = known, len(prefix)
            break
    if schema is None:
        split = raw.find(_PAYLOAD_MARK, 10)
        if split < 0:
            return None
        schema_bytes = raw[10:split]
        cached = _SCHEMA_CACHE.get(schema_bytes)
        if cached is None:
            try:
                cached = _fast_loads(schema_bytes)
            except Exception:
                return None
            if type(cached) is not dict:
                return None
            if len(_SCHEMA_CACHE) >= _SCHEMA_CACHE_SIZE:
                _SCHEMA_CACHE.clear()
            _SCHEMA_CACHE[schema_bytes] = cached
        schema = cached
        _RECENT_SCHEMAS.insert(0, (raw[:split], schema))
        del _RECENT_SCHEMAS[_RECENT_SCHEMAS_SIZE:]
    try:
        payload = _fast_loads(raw[split + 11 : -1])
    except Exception:
        return None
    return schema, payload


def _unwrap(document: Any, what: str) -> tuple[dict[str, Any] | None, dict[str, Any]] | str:
    """(schema or None, payload object) of a parsed message, or the reason it is not one."""
    if type(document) is not dict:
        return f"{what} is {_describe_json(document)}, not a JSON object"
    if "schema" in document or "payload" in document:
        if "payload" not in document:
            return f"{what} has a 'schema' but no 'payload'"
        payload = document["payload"]
        schema = document.get("schema")
        if type(payload) is not dict:
            return f"{what} 'payload' is {_describe_json(payload)}, not a JSON object"
        return (schema if type(schema) is dict else None), payload
    return None, document


def _describe_json(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_KINDS.get(type(value), type(value).__name__)


_JSON_NUMBER = rb"[ \t\n\r]*(-?([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?)"
_JSON_NUMBER_AT = re.compile(_JSON_NUMBER)


def _number_pattern(json_name: bytes) -> re.Pattern[bytes]:
    """Finds the number tokens of every ``"name":<number>`` in a raw JSON message."""
    return re.compile(re.escape(json_name) + _JSON_NUMBER)


def _exact_number(raw: bytes, json_name: bytes, pattern: re.Pattern[bytes], parsed: float) -> tuple[int, int] | None:
    """(coefficient, exponent) of the JSON number that the fast parser read as the double ``parsed``, from its
    text in ``raw``; None when that is not certain.

    A ``"name":`` key cannot occur inside a JSON string (its quotes would be escaped), so when the raw message
    holds it once, the number after it is this value. Otherwise (``before`` and ``after`` both hold the field,
    or another column's JSON has such a key) every ``"name":<number>`` is considered: the tokens that round to
    ``parsed`` must all be the same text."""
    at = raw.find(json_name)
    if at >= 0 and raw.find(json_name, at + len(json_name)) < 0:
        match = _JSON_NUMBER_AT.match(raw, at + len(json_name))
        if match is not None:
            return _number_parts(match)
        return None
    found: re.Match[bytes] | None = None
    for match in pattern.finditer(raw):
        token = match.group(1)
        if found is not None and token == found.group(1):
            continue
        try:
            if float(token) != parsed:
                continue
        except (ValueError, OverflowError):
            return None
        if found is not None:
            return None
        found = match
    return None if found is None else _number_parts(found)


def _number_parts(match: re.Match[bytes]) -> tuple[int, int] | None:
    """(coefficient, exponent) from a ``_JSON_NUMBER_AT`` / ``_number_pattern`` match."""
    whole, fraction, exponent = match.group(2, 3, 4)
    try:
        coefficient = int(whole + fraction) if fraction else int(whole)
        shift = int(exponent) if exponent else 0
    except ValueError:  # more digits than Python converts
        return None
    if fraction:
        shift -= len(fraction)
    return (-coefficient if match.group(1)[:1] == b"-" else coefficient), shift


def _bad_op(op: Any) -> str:
    if op is None:
        return "no 'op' field: not a Debezium change event"
    return f"unsupported op {_show(op)}; expected one of c, u, d, r, t"


def _bad_row(op: str, struct: str, row: Any) -> str:
    if row is None:
        return f"op '{op}' has no 'after' row"
    return f"'{struct}' is {_describe_json(row)}, not an object"


# Inline tests for values that are already what the output column holds, so that the common case costs no
# function call; everything else goes through the column's converter.
_INLINE_CHECKS: dict[str, str] = {
    "double precision": "type({v}) is float",
    "boolean": "{v} is True or {v} is False",
    "text": 'type({v}) is str and "\\x00" not in {v}',
}

_PAYLOAD_DECODER_TAIL = """
    version = ts = None
    source = payload.get("source")
    if type(source) is dict:
        lsn = source.get("lsn")
        if type(lsn) is int and 0 <= lsn <= MAX_BIGINT:
            version = lsn
        ts_ms = source.get("ts_ms")
        if type(ts_ms) is int and MIN_TS_MS <= ts_ms <= MAX_TS_MS:
            ts = ts_ms * 1000
    if ts is None:
        ts_ms = payload.get("ts_ms")
        if type(ts_ms) is int and MIN_TS_MS <= ts_ms <= MAX_TS_MS:
            ts = ts_ms * 1000
    if op == 'r' and version is not None:
        version -= SNAPSHOT_SHIFT
    values.append(op)
    values.append(version)
    values.append(ts)
    return values
"""


UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
"""What Debezium sends for a TOASTed column an update left unchanged (``unavailable.value.placeholder``). It
travels to the staging table as is (text, bytea as its UTF-8 bytes, json as :data:`UNAVAILABLE_JSON`); the
merge keeps the stored value instead of writing it (``templates/postgres/runtime/merge_*.sql.j2``)."""
UNAVAILABLE_JSON = f'"{UNAVAILABLE_PLACEHOLDER}"'

SNAPSHOT_SHIFT = 1 << 62
"""Subtracted from the version of snapshot reads (op ``r``), so that any streamed change outranks them.

Debezium stamps every snapshot row with the LSN at which the snapshot started, and a change streamed right
after it can carry that very LSN (a tie), or even a lower one (a transaction that began before the snapshot and
committed after it). Either way the streamed change is the newer state. Among snapshot reads, a later snapshot
still outranks an earlier one.
"""


def _compile_payload_decoder(plan: _Plan) -> Callable[[dict[str, Any], Any, bytes, Any], list[Any] | str]:
    """Generate ``decode_payload(payload, schema, raw, key_raw) -> row list | reason`` for one spec.

    The per-column loop is unrolled and the common already-right values (an in-range int for an integer
    column, a str for text, ...) are accepted inline, which saves a loop step and a function call per column
    and message. Column names only ever appear as ``repr`` literals, so any name is safe."""
    namespace: dict[str, Any] = {
        "Reject": _Reject,
        "EMPTY": {},
        "bad_op": _bad_op,
        "bad_row": _bad_row,
        "key_from_message": plan._key_from_message,
        "key_fallback": plan._key_fallback,
        "MAX_BIGINT": _MAX_BIGINT,
        "SNAPSHOT_SHIFT": SNAPSHOT_SHIFT,
        "MIN_TS_MS": _MIN_TS_MS,
        "MAX_TS_MS": _MAX_TS_MS,
    }
    lines = [
        "def decode_payload(payload, schema, raw, key_raw):",
        "    op = payload.get('op')",
        "    if op == 'c' or op == 'u' or op == 'r':",
        "        struct = 'after'",
        "    elif op == 'd':",
        "        struct = 'before'",
        "    elif op == 't':",
        "        return decode_truncate(payload)",
        "    else:",
        "        return bad_op(op)",
        "    row = payload.get(struct)",
        "    if type(row) is not dict:",
        "        if row is not None or struct == 'after':",
        "            return bad_row(op, struct, row)",
        "        row = EMPTY",
        "    ctx = (schema, struct, raw)",
    ]
    for i, ((name, pg), convert) in enumerate(zip(plan.spec.columns, plan.converters, strict=True)):
        v = f"v{i}"
        namespace[f"c{i}"] = convert
        namespace[f"m{i}"] = f"column '{name}': "
        if pg.name in _INT_RANGES:
            bound = _INT_RANGES[pg.name]
            check: str | None = f"type({v}) is int and {-bound} <= {v} <= {bound - 1}"
        elif pg.name == "character varying" and not pg.args:
            check = _INLINE_CHECKS["text"].format(v=v)
        else:
            template = _INLINE_CHECKS.get(pg.name)
            check = template.format(v=v) if template else None
        lines.append(f"    {v} = row.get({name!r})")
        lines.append(f"    if {v} is not None" + (f" and not ({check}):" if check else ":"))
        lines += [
            "        try:",
            f"            {v} = c{i}({v}, ctx)",
            "        except Reject as error:",
            f"            return m{i} + str(error)",
        ]
    lines.append("    values = [" + ", ".join(f"v{i}" for i in range(len(plan.names))) + "]")
    if plan.pk_index is None:
        lines += [
            "    reason = key_from_message(values, key_raw)",
            "    if reason is not None:",
            "        return reason",
        ]
    else:
        lines += [
            "    if " + " or ".join(f"v{i} is None" for i in plan.pk_index) + ":",
            "        reason = key_fallback(values, key_raw)",
            "        if reason is not None:",
            "            return reason",
        ]
    source = "\n".join(lines) + "\n" + _PAYLOAD_DECODER_TAIL
    # A truncate (op 't') has no row and no key: every business column is null; the sinks apply it by version.
    source += f"\ndef decode_truncate(payload):\n    op = 't'\n    values = [None] * {len(plan.names)}\n"
    source += _PAYLOAD_DECODER_TAIL
    exec(compile(source, f"<cdcsync decoder for source {plan.spec.source_id!r}>", "exec"), namespace)
    return namespace["decode_payload"]


class _Plan:
    """Per-spec precomputation: converters, key handling and output types (cached per executor process)."""

    def __init__(self, spec: DecodeSpec) -> None:
        import pyarrow as pa

        self.spec = spec
        self.names = [name for name, _ in spec.columns]
        if len(set(self.names)) != len(self.names):
            raise DecodeError(f"source '{spec.source_id}': a column is declared twice")
        self.index = {name: i for i, name in enumerate(self.names)}
        time_mode = spec.time_precision_mode if spec.format == "json" else None  # Avro values arrive scaled
        self.converters = [_converter_for(name, pg, spec.source_id, time_mode) for name, pg in spec.columns]
        self.columns = list(zip(self.names, self.converters, strict=True))
        if spec.primary_key is not None:
            missing = [k for k in spec.primary_key if k not in self.index]
            if missing:
                raise DecodeError(f"source '{spec.source_id}': primary key column '{missing[0]}' is not declared")
            self.pk_index: list[int] | None = [self.index[k] for k in spec.primary_key]
        else:
            self.pk_index = None
        self.schema = output_arrow_schema(spec)
        width = len(self.names) + 3  # business columns, then _cdc_op, _cdc_version, _cdc_ts
        self.row_types = [self.schema.field(i).type for i in range(width)]
        self.null_row = [None] * width
        self.pa = pa
        self._schema_checks: dict[int, tuple[dict[str, Any], str | None]] = {}
        self._decode_payload = _compile_payload_decoder(self)

    # ---- one message -----------------------------------------------------------------------------------------

    def decode_message(self, raw: bytes, key_raw: bytes | None) -> list[Any] | str:
        """The output row ([business..., op, version or None, ts or None]) or a dead-letter reason."""
        schema: dict[str, Any] | None = None
        parts = _fast_wrapped(raw) if raw.startswith(_WRAPPED_PREFIX) else None
        if parts is not None:
            schema, payload = parts
        else:
            try:
                payload = _fast_loads(raw)
            except Exception:  # not JSON, or JSON the fast parser refuses: the exact parser decides
                return self._decode_exactly(raw, key_raw)
            if type(payload) is not dict or "schema" in payload or "payload" in payload:
                unwrapped = _unwrap(payload, "value")
                if isinstance(unwrapped, str):
                    return unwrapped
                schema, payload = unwrapped
        if type(payload) is not dict:
            return f"value 'payload' is {_describe_json(payload)}, not a JSON object"
        if schema is not None and self.spec.detect_schema_changes:
            change = self._schema_change(schema)
            if change is not None:
                return change
        try:
            return self._decode_payload(payload, schema, raw, key_raw)
        except _Reparse:
            return self._decode_exactly(raw, key_raw)

    def _schema_change(self, schema: dict[str, Any]) -> str | None:
        """:func:`schema_change_of` for a message's envelope schema, once per distinct schema (the schema object
        is kept with its result, so its id cannot be reused while the entry lives)."""
        found = self._schema_checks.get(id(schema))
        if found is None or found[0] is not schema:
            fields = row_fields(schema)
            found = (schema, schema_change_of(self.spec, fields) if fields is not None else None)
            if len(self._schema_checks) >= _SCHEMA_CACHE_SIZE:
                self._schema_checks.clear()
            self._schema_checks[id(schema)] = found
        return found[1]

    def _decode_exactly(self, raw: bytes, key_raw: bytes | None) -> list[Any] | str:
        """The slow path: the standard library parser, with exact Decimals for every non-integer number."""
        document, reason = _loads_exact(raw, "value")
        if reason is not None:
            return reason
        unwrapped = _unwrap(document, "value")
        if isinstance(unwrapped, str):
            return unwrapped
        schema, payload = unwrapped
        if schema is not None and self.spec.detect_schema_changes:
            change = self._schema_change(schema)
            if change is not None:
                return change
        try:
            return self._decode_payload(payload, schema, raw, key_raw)
        except _Reparse:  # pragma: no cover - exact parsing yields no doubles
            return "value: a number could not be read exactly"

    # ---- the primary key -------------------------------------------------------------------------------------

    def _parse_key(
        self, key_raw: bytes | None, exact: bool
    ) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
        """(key columns, key schema, None) or ({}, None, reason)."""
        if key_raw is None:
            return {}, None, "message has no key"
        parts = _fast_wrapped(key_raw) if not exact and key_raw.startswith(_WRAPPED_PREFIX) else None
        if parts is None:
            document, reason = _loads_exact(key_raw, "message key") if exact else _loads(key_raw, "message key")
            if reason is not None:
                return {}, None, reason
            if type(document) is dict and ("schema" in document or "payload" in document):
                parts = _unwrap(document, "message key")  # type: ignore[assignment]
                if type(parts) is str:
                    return {}, None, parts
            else:
                parts = None, document  # type: ignore[assignment]
        schema, key = parts  # type: ignore[misc]
        if type(key) is not dict:
            return {}, None, f"message key is {_describe_json(key)}, not a JSON object of key columns"
        return key, schema, None

    def _key_fallback(self, values: list[Any], key_raw: bytes | None) -> str | None:
        """Fill null declared key columns from the message key."""
        try:
            return self._key_fallback_once(values, key_raw, exact=False)
        except _Reparse:
            return self._key_fallback_once(values, key_raw, exact=True)

    def _key_fallback_once(self, values: list[Any], key_raw: bytes | None, exact: bool) -> str | None:
        assert self.pk_index is not None
        missing = [i for i in self.pk_index if values[i] is None]
        key, schema, reason = self._parse_key(key_raw, exact)
        if reason is not None:
            return f"primary key column '{self.names[missing[0]]}' is null ({reason})"
        for i in missing:
            name = self.names[i]
            value = key.get(name)
            if value is not None:
                try:
                    values[i] = self.converters[i](value, (schema, "", key_raw or b""))
                except _Reject as error:
                    return f"message key column '{name}': {error}"
            if values[i] is None:
                return f"primary key column '{name}' is null"
        return None

    def _key_from_message(self, values: list[Any], key_raw: bytes | None) -> str | None:
        """No declared primary key: the message key's fields are the key columns and override the row's."""
        try:
            return self._key_from_message_once(values, key_raw, exact=False)
        except _Reparse:
            return self._key_from_message_once(values, key_raw, exact=True)

    def _key_from_message_once(self, values: list[Any], key_raw: bytes | None, exact: bool) -> str | None:
        key, schema, reason = self._parse_key(key_raw, exact)
        if reason is not None:
            return f"{reason}, and the source declares no primary_key to take the key from"
        if not key:
            return "message key has no fields, and the source declares no primary_key"
        index = self.index
        for name, value in key.items():
            if name not in index:
                return f"message key field '{name}' is not a declared column of source '{self.spec.source_id}'"
            if value is None:
                return f"primary key column '{name}' is null"
            i = index[name]
            try:
                values[i] = self.converters[i](value, (schema, "", key_raw or b""))
            except _Reject as error:
                return f"message key column '{name}': {error}"
        return None

    # ---- one batch -------------------------------------------------------------------------------------------

    def decode_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        # Decoding allocates many short-lived containers while the output rows accumulate; the cyclic garbage
        # collector would rescan those rows again and again, and nothing here creates reference cycles.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._decode_batch(batch)
        finally:
            if collecting:
                gc.enable()

    def _decode_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        pa = self.pa
        names = batch.schema.names
        values_in = batch.column(names.index("value")).to_pylist()
        keys_in = batch.column(names.index("key")).to_pylist() if "key" in names else [None] * len(values_in)
        offsets_in: list[Any] | None = None
        kafka_ts: list[Any] | None = None

        rows: list[list[Any]] = []
        sources: list[int] = []
        dead: list[tuple[int, str]] = []  # (output row, reason)
        decode = self.decode_message
        null_row = self.null_row
        for i, raw in enumerate(values_in):
            if raw is None:  # tombstone
                continue
            try:
                result = decode(raw, keys_in[i])
            except Exception as error:  # a decoder bug must not fail the query: dead-letter the message
                result = f"decoder error: {type(error).__name__}: {error}"[:300]
            sources.append(i)
            if type(result) is list:
                if result[-2] is None:
                    if offsets_in is None:
                        offsets_in = batch.column(names.index("offset")).to_pylist()
                    result[-2] = offsets_in[i] - (SNAPSHOT_SHIFT if result[-3] == "r" else 0)
                if result[-1] is None:
                    if kafka_ts is None:
                        kafka_ts = self._kafka_micros(batch)
                    result[-1] = kafka_ts[i]
                rows.append(result)
            else:
                dead.append((len(rows), result))  # type: ignore[arg-type]
                rows.append(null_row)

        count = len(rows)
        try:
            arrays = self._arrays(rows)
        except Exception:  # a converter bug, not bad input: find the rows Arrow refuses and dead-letter them
            for row_index, row in enumerate(rows):
                try:
                    self._arrays([row])
                except Exception as error:
                    rows[row_index] = null_row
                    dead.append((row_index, f"decoder error: {type(error).__name__}: {error}"[:300]))
            dead.sort()
            arrays = self._arrays(rows)
        take = pa.array(sources, type=pa.int64())
        for column, arrow_type in (("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())):
            taken = batch.column(names.index(column)).take(take)
            arrays.append(taken if taken.type == arrow_type else taken.cast(arrow_type))
        if dead:
            reasons: list[str | None] = [None] * count
            dead_keys: list[bytes | None] = [None] * count
            dead_values: list[bytes | None] = [None] * count
            for at, reason in dead:
                reasons[at] = reason
                dead_keys[at] = keys_in[sources[at]]
                dead_values[at] = values_in[sources[at]]
            arrays.append(pa.array(reasons, type=pa.string()))
            arrays.append(pa.array(dead_keys, type=pa.binary()))
            arrays.append(pa.array(dead_values, type=pa.binary()))
        else:
            arrays.append(pa.nulls(count, type=pa.string()))
            arrays.append(pa.nulls(count, type=pa.binary()))
            arrays.append(pa.nulls(count, type=pa.binary()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _arrays(self, rows: list[list[Any]]) -> list[pa.Array]:
        columns: Any = zip(*rows, strict=True) if rows else ([] for _ in self.row_types)
        return [self._array(column, t) for column, t in zip(columns, self.row_types, strict=True)]

    def _array(self, column: Any, arrow_type: pa.DataType) -> pa.Array:
        pa = self.pa
        if not pa.types.is_decimal(arrow_type):
            return pa.array(column, type=arrow_type)
        # Decimal columns hold unscaled integers: 16-byte two's complement is the decimal128 layout itself.
        try:
            unscaled = pa.array(column, type=pa.int64())
        except OverflowError:
            scale = arrow_type.scale
            decimals = [None if u is None else Decimal(f"{u}E-{scale}") for u in column]  # exact, unlike scaleb
            return pa.array(decimals, type=arrow_type)
        return unscaled.cast(pa.decimal128(38, 0)).view(arrow_type)

    def _kafka_micros(self, batch: pa.RecordBatch) -> list[Any]:
        pa = self.pa
        names = batch.schema.names
        if "timestamp" not in names:
            return [None] * batch.num_rows
        column = batch.column(names.index("timestamp"))
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
        micros = column.cast(pa.int64()).to_pylist()
        return [m if m is not None and _MIN_US <= m <= _MAX_US else None for m in micros]


@lru_cache(maxsize=64)
def _plan_for(spec: DecodeSpec) -> _Plan:
    if spec.format == "avro":
        from cdcsync.sources.avro import AvroPlan

        return AvroPlan(spec)
    if spec.format != "json":
        raise DecodeError(f"source '{spec.source_id}': format '{spec.format}' is not one of json, avro")
    return _Plan(spec)
