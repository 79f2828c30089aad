"""Debezium's Postgres connector types in JsonConverter output, per logical type and connector mode
(``decimal.handling.mode``, ``time.precision.mode``): exact values in, the right Arrow values out, and bad input
dead-lettered with a reason that names the column, the value and the type."""

from __future__ import annotations

import base64
import dataclasses
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from cdcsync.config import clickhouse_types
from cdcsync.config.types import UnknownTypeError, parse_pg_type
from cdcsync.db.pgcopy import array_literal, arrow_to_copy_csv
from tests.unit.test_debezium_decode import decode, dumps, make_spec

pytestmark = pytest.mark.unit

UTC = timezone.utc


def field(name: str, kind: str, logical: str | None = None, **parameters: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"field": name, "type": kind, "optional": True}
    if logical:
        out["name"] = logical
    if parameters:
        out["parameters"] = {k: str(v) for k, v in parameters.items()}
    return out


def wrapped(fields: list[dict[str, Any]], after: dict[str, Any]) -> bytes:
    row = {"type": "struct", "fields": [field("id", "int64"), *fields], "optional": True, "field": "after"}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, row, field("op", "string")]}
    return dumps({"schema": schema, "payload": {"op": "c", "before": None, "after": {"id": 1, **after}}})


def bare(after: dict[str, Any]) -> bytes:
    return dumps({"op": "c", "before": None, "after": {"id": 1, **after}})


def one(columns: dict[str, str], message: bytes) -> dict[str, Any]:
    rows = decode(make_spec({"id": "bigint", **columns}), [(None, message)])
    assert len(rows) == 1
    return rows[0]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unscaled(value: int) -> str:
    """Connect Decimal bytes: the unscaled value, big-endian two's complement, minimal length."""
    return b64(value.to_bytes(value.bit_length() // 8 + 1, "big", signed=True))


# ---- types ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "sql", "spark"),
    [
        ("integer[]", "integer[]", "array<int>"),
        ("numeric(10, 2)[]", "numeric(10,2)[]", "array<decimal(10,2)>"),
        ("text ARRAY", "text[]", "array<string>"),
        ("int4[][]", "integer[]", "array<int>"),
        ("varchar(5)[3]", "character varying(5)[]", "array<string>"),
        ("timetz", "time with time zone", "string"),
        ("bit(3)", "bit(3)", "string"),
        ("varbit", "bit varying", "string"),
        ("timestamptz[]", "timestamp with time zone[]", "array<timestamp>"),
    ],
)
def test_new_postgres_types_parse(text: str, sql: str, spark: str) -> None:
    pg = parse_pg_type(text)
    assert (pg.sql, pg.spark_type) == (sql, spark)
    assert parse_pg_type(pg.sql) == pg  # canonical spelling round-trips


@pytest.mark.parametrize(("text", "problem"), [("foo[]", "not a Postgres type"), ("bit(1,2)", "bit takes no such")])
def test_bad_types_are_named(text: str, problem: str) -> None:
    with pytest.raises(UnknownTypeError, match=problem):
        parse_pg_type(text)


def test_clickhouse_types_of_the_new_types() -> None:
    assert clickhouse_types.base_type(parse_pg_type("numeric(10,2)[]")) == "Array(Nullable(Decimal(10, 2)))"
    assert clickhouse_types.base_type(parse_pg_type("text[]")) == "Array(Nullable(String))"
    assert clickhouse_types.base_type(parse_pg_type("timetz")) == "String"
    assert clickhouse_types.base_type(parse_pg_type("bit varying(4)")) == "String"
    # ClickHouse refuses Nullable(Array(...)): array columns are plain, a NULL array lands as []
    assert clickhouse_types.column_type(parse_pg_type("integer[]"), key=False) == "Array(Nullable(Int32))"


# ---- decimals: decimal.handling.mode ---------------------------------------------------------------------------


def test_precise_decimal_bytes_with_scale() -> None:
    message = wrapped(
        [field("amount", "bytes", "org.apache.kafka.connect.data.Decimal", scale=2)], {"amount": unscaled(-123456)}
    )
    assert one({"amount": "numeric(12,2)"}, message)["amount"] == Decimal("-1234.56")


def test_variable_scale_decimal_for_numeric_without_precision() -> None:
    vsd = {"scale": 5, "value": unscaled(123456789012345678901234567890)}
    schema = {
        "field": "n",
        "type": "struct",
        "name": "io.debezium.data.VariableScaleDecimal",
        "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}],
        "optional": True,
    }
    assert one({"n": "numeric"}, wrapped([schema], {"n": vsd}))["n"] == "1234567890123456789012345.67890"
    assert one({"n": "numeric"}, bare({"n": vsd}))["n"] == "1234567890123456789012345.67890"


@pytest.mark.parametrize("message_of", [lambda v: wrapped([field("amount", "string")], {"amount": v}), bare])
def test_string_mode_decimals_are_exact(message_of: Any) -> None:
    message = message_of({"amount": "12345678901234567.89"} if message_of is bare else "12345678901234567.89")
    assert one({"amount": "numeric(20,2)"}, message)["amount"] == Decimal("12345678901234567.89")


def test_double_mode_keeps_the_digits_debezium_wrote() -> None:
    raw = wrapped([field("amount", "double")], {"amount": 0.1}).replace(b'"amount":0.1', b'"amount":0.10')
    assert one({"amount": "numeric(12,2)"}, raw)["amount"] == Decimal("0.10")


def test_decimal_that_does_not_fit_is_a_dead_letter() -> None:
    message = wrapped(
        [field("amount", "bytes", "org.apache.kafka.connect.data.Decimal", scale=3)], {"amount": unscaled(12345)}
    )
    row = one({"amount": "numeric(12,2)"}, message)
    assert row["_dlq_reason"].startswith("column 'amount': ")
    assert "numeric(12,2)" in row["_dlq_reason"] and "digits after the point" in row["_dlq_reason"]


# ---- time.precision.mode ---------------------------------------------------------------------------------------

STAMP = datetime(2024, 2, 29, 13, 14, 15, 123456, tzinfo=UTC)
EPOCH_US = int(STAMP.timestamp()) * 1_000_000 + 123456
TIME_US = (13 * 3600 + 14 * 60 + 15) * 1_000_000 + 123456


@pytest.mark.parametrize(
    ("mode", "logical", "kind", "value", "expected"),
    [
        ("adaptive", "io.debezium.time.MicroTimestamp", "int64", EPOCH_US, STAMP),
        ("adaptive(3)", "io.debezium.time.Timestamp", "int64", EPOCH_US // 1000, STAMP.replace(microsecond=123000)),
        (
            "connect",
            "org.apache.kafka.connect.data.Timestamp",
            "int64",
            EPOCH_US // 1000,
            STAMP.replace(microsecond=123000),
        ),
        ("nano", "io.debezium.time.NanoTimestamp", "int64", EPOCH_US * 1000 + 999, STAMP),
    ],
)
def test_timestamp_modes(mode: str, logical: str, kind: str, value: int, expected: datetime) -> None:
    row = one({"t": "timestamp"}, wrapped([field("t", kind, logical)], {"t": value}))
    assert row["t"] == expected.replace(tzinfo=None), mode


@pytest.mark.parametrize(
    ("logical", "value", "expected"),
    [
        ("io.debezium.time.MicroTime", TIME_US, "13:14:15.123456"),  # adaptive (time(4-6)), adaptive_time_microseconds
        ("io.debezium.time.Time", TIME_US // 1000, "13:14:15.123000"),  # adaptive, time(0-3)
        ("org.apache.kafka.connect.data.Time", TIME_US // 1000, "13:14:15.123000"),  # connect
        ("io.debezium.time.NanoTime", TIME_US * 1000 + 7, "13:14:15.123456"),
    ],
)
def test_time_modes(logical: str, value: int, expected: str) -> None:
    assert one({"t": "time"}, wrapped([field("t", "int64", logical)], {"t": value}))["t"] == expected


@pytest.mark.parametrize(
    ("logical", "kind"), [("io.debezium.time.Date", "int32"), ("org.apache.kafka.connect.data.Date", "int32")]
)
def test_date_modes(logical: str, kind: str) -> None:
    assert one({"d": "date"}, wrapped([field("d", kind, logical)], {"d": 19782}))["d"] == date(2024, 2, 29)


def test_zoned_timestamp() -> None:
    message = wrapped([field("t", "string", "io.debezium.time.ZonedTimestamp")], {"t": "2024-02-29T13:14:15.123456Z"})
    assert one({"t": "timestamptz"}, message)["t"] == STAMP


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("13:14:15.123456Z", "13:14:15.123456+00"),
        ("13:14:15Z", "13:14:15+00"),
        ("13:14:15.1234567Z", "13:14:15.123456+00"),  # truncated to microseconds, like Postgres' precision
        ("01:02:03+05:30", "01:02:03+05:30"),
        ("24:00:00Z", "24:00:00+00"),
    ],
)
def test_zoned_time(value: str, expected: str) -> None:
    message = wrapped([field("t", "string", "io.debezium.time.ZonedTime")], {"t": value})
    assert one({"t": "timetz"}, message)["t"] == expected
    assert one({"t": "timetz"}, bare({"t": value}))["t"] == expected


@pytest.mark.parametrize("value", ["13:14:15", "25:00:00Z", "13:61:00Z", "noon", 5])
def test_bad_zoned_time_is_a_dead_letter(value: Any) -> None:
    row = one({"t": "time with time zone"}, bare({"t": value}))
    assert row["_dlq_reason"].startswith("column 't': ") and "time with time zone" in row["_dlq_reason"]


# ---- json, uuid, enum, bytea -----------------------------------------------------------------------------------


def test_json_uuid_enum_and_bytea() -> None:
    message = wrapped(
        [
            field("j", "string", "io.debezium.data.Json"),
            field("u", "string", "io.debezium.data.Uuid"),
            field("e", "string", "io.debezium.data.Enum", allowed="red,green"),
            field("b", "bytes"),
        ],
        {"j": '{"a": [1, 2.50]}', "u": "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "e": "green", "b": b64(b"\x00\xff")},
    )
    row = one({"j": "jsonb", "u": "uuid", "e": "text", "b": "bytea"}, message)
    assert (row["j"], row["u"], row["e"], row["b"]) == (
        '{"a": [1, 2.50]}',
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "green",
        b"\x00\xff",
    )


@pytest.mark.parametrize(("column", "value"), [("u", "not-a-uuid"), ("b", "%%%")])
def test_bad_uuid_or_bytea_is_a_dead_letter(column: str, value: str) -> None:
    row = one({"u": "uuid", "b": "bytea"}, bare({column: value}))
    assert row["_dlq_reason"].startswith(f"column '{column}': '{value}' is not a valid")


# ---- bits -----------------------------------------------------------------------------------------------------


def bits_bytes(text: str) -> str:
    """What Debezium writes for a bit string: the last character in the lowest bit, little-endian, minimal."""
    number = int(text, 2)
    return b64(number.to_bytes(max(1, (number.bit_length() + 7) // 8), "little"))


@pytest.mark.parametrize(
    ("declared", "text"),
    [("bit(12)", "000010100001"), ("bit(3)", "000"), ("bit(17)", "10000000000000001"), ("bit varying(20)", "1011")],
)
def test_bits(declared: str, text: str) -> None:
    message = wrapped([field("b", "bytes", "io.debezium.data.Bits", length=12)], {"b": bits_bytes(text)})
    assert one({"b": declared}, message)["b"] == text
    assert one({"b": declared}, bare({"b": bits_bytes(text)}))["b"] == text


def test_one_bit_arrives_as_a_boolean() -> None:
    assert one({"b": "bit"}, wrapped([field("b", "boolean")], {"b": True}))["b"] == "1"
    assert one({"b": "bit(1)"}, bare({"b": False}))["b"] == "0"


@pytest.mark.parametrize(
    ("declared", "value", "why"),
    [
        ("bit(3)", bits_bytes("1111"), "more than bit(3)"),
        ("bit(3)", "!!", "not base64"),
        ("bit(3)", 3, "expected Bits"),
    ],
)
def test_bad_bits_are_dead_letters(declared: str, value: Any, why: str) -> None:
    row = one({"b": declared}, bare({"b": value}))
    assert row["_dlq_reason"].startswith("column 'b': ") and why in row["_dlq_reason"]


# ---- arrays ---------------------------------------------------------------------------------------------------


def test_arrays_of_integers_text_and_decimals() -> None:
    decimal_items = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}
    message = wrapped(
        [
            {"field": "ints", "type": "array", "items": {"type": "int32", "optional": True}, "optional": True},
            {"field": "texts", "type": "array", "items": {"type": "string", "optional": True}, "optional": True},
            {"field": "amounts", "type": "array", "items": {**decimal_items, "optional": True}, "optional": True},
        ],
        {"ints": [1, None, -3], "texts": ["a", "", None, 'q"\\'], "amounts": [unscaled(150), None, unscaled(-1)]},
    )
    row = one({"ints": "integer[]", "texts": "text[]", "amounts": "numeric(10,2)[]"}, message)
    assert row["ints"] == [1, None, -3]
    assert row["texts"] == ["a", "", None, 'q"\\']
    assert row["amounts"] == [Decimal("1.50"), None, Decimal("-0.01")]


def test_bare_arrays_and_string_mode_decimal_arrays() -> None:
    row = one(
        {"amounts": "numeric(10,2)[]", "days": "date[]", "empty": "integer[]"},
        bare({"amounts": ["1.5", "2.25"], "days": [19782, None], "empty": []}),
    )
    assert row["amounts"] == [Decimal("1.50"), Decimal("2.25")]
    assert row["days"] == [date(2024, 2, 29), None]
    assert row["empty"] == []


@pytest.mark.parametrize(
    ("declared", "value", "why"),
    [
        ("integer[]", [1, "x"], "element 2: 'x' is not a valid integer"),
        ("integer[]", [[1], [2]], "multidimensional arrays are not supported"),
        ("integer[]", 5, "expected a JSON array"),
        ("numeric(3,1)[]", ["123.4"], "element 1: '123.4' does not fit numeric(3,1)"),
        ("text[]", "__debezium_unavailable_value", "unchanged TOASTed array"),
    ],
)
def test_bad_arrays_are_dead_letters(declared: str, value: Any, why: str) -> None:
    row = one({"a": declared}, bare({"a": value}))
    assert row["_dlq_reason"].startswith("column 'a': ") and why in row["_dlq_reason"], row["_dlq_reason"]


def test_arrays_travel_to_copy_as_postgres_array_literals() -> None:
    assert array_literal([1, None, 'a"b\\c', Decimal("1.50"), True, b"\x01"]) == (
        '{"1",NULL,"a\\"b\\\\c","1.50","t","\\\\x01"}'
    )
    column = pa.array([[1, None], None, []], type=pa.list_(pa.int32()))
    assert arrow_to_copy_csv([column]) == b'"{""1"",NULL}"\n\n"{}"\n'


def test_variable_scale_zero_keeps_its_scale() -> None:
    assert one({"n": "numeric"}, bare({"n": {"scale": 3, "value": unscaled(0)}}))["n"] == "0.000"
    assert one({"n": "numeric"}, bare({"n": "0.00"}))["n"] == "0.00"


# ---- declared precision and time.precision.mode without schemas --------------------------------------------------


def bare_spec_row(columns: dict[str, str], after: dict[str, Any], mode: str) -> dict[str, Any]:
    spec = make_spec({"id": "bigint", **columns})
    spec = dataclasses.replace(spec, time_precision_mode=mode)
    rows = decode(spec, [(None, bare(after))])
    assert len(rows) == 1
    return rows[0]


@pytest.mark.parametrize(
    ("mode", "declared", "value", "expected"),
    [
        ("adaptive", "timestamp(3)", EPOCH_US // 1000, STAMP.replace(microsecond=123000)),
        ("adaptive", "timestamp", EPOCH_US, STAMP),
        ("adaptive_time_microseconds", "timestamp(3)", EPOCH_US // 1000, STAMP.replace(microsecond=123000)),
        ("connect", "timestamp", EPOCH_US // 1000, STAMP.replace(microsecond=123000)),
    ],
)
def test_bare_timestamps_follow_the_declared_precision_and_mode(
    mode: str, declared: str, value: int, expected: datetime
) -> None:
    assert bare_spec_row({"t": declared}, {"t": value}, mode)["t"] == expected.replace(tzinfo=None)


@pytest.mark.parametrize(
    ("mode", "declared", "value", "expected"),
    [
        ("adaptive", "time(3)", TIME_US // 1000, "13:14:15.123000"),
        ("adaptive", "time", TIME_US, "13:14:15.123456"),
        ("adaptive_time_microseconds", "time(0)", (TIME_US // 1_000_000) * 1_000_000, "13:14:15"),
        ("connect", "time", TIME_US // 1000, "13:14:15.123000"),
    ],
)
def test_bare_times_follow_the_declared_precision_and_mode(mode: str, declared: str, value: int, expected: str) -> None:
    assert bare_spec_row({"t": declared}, {"t": value}, mode)["t"] == expected


@pytest.mark.parametrize(
    ("declared", "value"),
    [("time(0)", "13:14:15.5"), ("timestamp(3)", "2024-02-29T13:14:15.123456"), ("timetz(0)", "13:14:15.1Z")],
)
def test_values_finer_than_the_declared_precision_are_dead_letters(declared: str, value: str) -> None:
    row = one({"t": declared}, bare({"t": value}))
    assert row["_dlq_reason"].startswith("column 't': ") and "more fractional-second digits" in row["_dlq_reason"]
