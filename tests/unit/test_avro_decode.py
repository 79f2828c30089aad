"""Avro decoding (Confluent wire format): messages built here with fastavro, writer schemas from a fake registry.

The fake stands in for ``SchemaRegistryClient`` only (``get_schema``), so the module's own fetch, retry,
classification and caching code runs; the real HTTP path is in ``tests/integration/test_apicurio_registry.py``.
"""

from __future__ import annotations

import io
import json
import pickle
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal
from functools import partial
from typing import Any

import fastavro
import pytest

from cdcsync.config.pipeline import KafkaSource
from cdcsync.config.types import parse_pg_type
from cdcsync.core.errors import DecodeError, ServiceError
from cdcsync.core.reports import Kind, ReportedFailure
from cdcsync.devstack import workload
from cdcsync.sources.debezium import avro_registry
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess, strip_logical_types
from cdcsync.sources.debezium.dispatch import decode_batches, output_spark_schema
from cdcsync.sources.debezium.spec import DecodeSpec, output_arrow_schema
from tests.unit.test_debezium_decode import TOPIC, kafka_batch

pytestmark = pytest.mark.unit

UTC = timezone.utc


# ---- a fake registry client and message builders -----------------------------------------------------------------


@dataclass
class FakeSchema:
    schema_str: str
    schema_type: str = "AVRO"
    references: list[Any] | None = None


class FakeRegistry:
    """``get_schema`` like SchemaRegistryClient's: 404 as SchemaRegistryError, other failures scripted."""

    def __init__(self) -> None:
        self.schemas: dict[int, FakeSchema] = {}
        self.calls: list[int] = []
        self.failures: list[BaseException] = []
        """Raised, first to last, by the next calls (before answering normally)."""

    def add(self, schema: Any, schema_id: int | None = None, schema_type: str = "AVRO") -> int:
        schema_id = schema_id or (max(self.schemas, default=0) + 1)
        text = schema if isinstance(schema, str) else json.dumps(schema)
        self.schemas[schema_id] = FakeSchema(text, schema_type)
        return schema_id

    def get_schema(self, schema_id: int, *args: Any, **kwargs: Any) -> FakeSchema:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        self.calls.append(schema_id)
        if self.failures:
            raise self.failures.pop(0)
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, f"Schema {schema_id} not found")
        return self.schemas[schema_id]


@pytest.fixture()
def registry() -> Iterator[tuple[FakeRegistry, SchemaRegistryAccess]]:
    """A fake registry behind an access of its own (a unique URL, so the process-wide caches never mix tests)."""
    access = SchemaRegistryAccess(f"http://fake-registry-{uuid.uuid4().hex[:8]}:8081", retry_timeout_s=0.5)
    fake = FakeRegistry()
    avro_registry._CLIENTS[access] = fake
    try:
        yield fake, access
    finally:
        avro_registry._CLIENTS.pop(access, None)


def spec_for(
    access: SchemaRegistryAccess, columns: dict[str, str], primary_key: tuple[str, ...] | None = ("id",)
) -> DecodeSpec:
    return DecodeSpec(
        "things",
        tuple((name, parse_pg_type(t)) for name, t in columns.items()),
        primary_key,
        format="avro",
        schema_registry=access,
    )


def opt(avro_type: Any) -> list[Any]:
    return ["null", avro_type]


def row_schema(fields: Sequence[tuple[str, Any]], name: str = "Value") -> dict[str, Any]:
    return {
        "type": "record",
        "name": name,
        "namespace": "shop.public.things",
        "fields": [
            {"name": n, "type": t, "default": None} if isinstance(t, list) else {"name": n, "type": t}
            for n, t in fields
        ],
    }


def envelope(fields: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """Debezium's Avro envelope: ``after`` refers to the row record ``before`` defines, by name."""
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": "shop.public.things",
        "fields": [
            {"name": "before", "type": opt(row_schema(fields)), "default": None},
            {"name": "after", "type": opt("Value"), "default": None},
            {
                "name": "source",
                "type": {
                    "type": "record",
                    "name": "Source",
                    "namespace": "io.debezium.connector.postgresql",
                    "fields": [
                        {"name": "connector", "type": "string"},
                        {"name": "ts_ms", "type": "long"},
                        {"name": "snapshot", "type": opt({"type": "string", "connect.name": "io.debezium.data.Enum"})},
                        {"name": "lsn", "type": opt("long"), "default": None},
                        {"name": "sequence", "type": opt("string"), "default": None},
                    ],
                },
            },
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": opt("long"), "default": None},
            {
                "name": "transaction",
                "type": opt(
                    {
                        "type": "record",
                        "name": "block",
                        "namespace": "event",
                        "fields": [{"name": "id", "type": "string"}, {"name": "total_order", "type": "long"}],
                    }
                ),
                "default": None,
            },
        ],
    }


KEY_SCHEMA = {
    "type": "record",
    "name": "Key",
    "namespace": "shop.public.things",
    "fields": [{"name": "id", "type": "long"}],
}


def encode(schema_id: int, schema: Any, record: Any, *, magic: int = 0) -> bytes:
    """Wire format; the body written with raw ints and bytes (logical types stripped), as the registry's full
    schema says they are meant."""
    out = io.BytesIO()
    out.write(bytes([magic]) + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(strip_logical_types(schema)), record)
    return out.getvalue()


def change(
    op: str, after: Any = None, before: Any = None, *, lsn: int | None = 1000, ts_ms: int = 1_704_067_200_000
) -> dict:
    sequence = None if lsn is None else f'["{lsn - 10}","{lsn}"]'
    source = {"connector": "postgresql", "ts_ms": ts_ms, "snapshot": "false", "lsn": lsn, "sequence": sequence}
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": ts_ms + 500, "transaction": None}


def decode(spec: DecodeSpec, messages: Sequence[tuple[bytes | None, bytes | None]]) -> list[dict]:
    out = list(decode_batches(iter([kafka_batch(messages)]), spec))
    for batch in out:
        assert batch.schema == output_arrow_schema(spec)
    return [row for batch in out for row in batch.to_pylist()]


def only(rows: list[dict]) -> dict:
    assert len(rows) == 1, rows
    return rows[0]


def assert_dead(row: dict, spec: DecodeSpec, *fragments: str) -> None:
    reason = row["_dlq_reason"]
    assert reason, row
    for fragment in fragments:
        assert fragment in reason, (fragment, reason)
    assert all(row[name] is None for name, _ in spec.columns)
    assert row["_cdc_op"] is None and row["_cdc_topic"] == TOPIC and isinstance(row["_dlq_value"], bytes)


def signed(value: int) -> bytes:
    return value.to_bytes((value if value >= 0 else ~value).bit_length() // 8 + 1, "big", signed=True)


def connect_decimal(scale: int) -> dict[str, Any]:
    return {
        "type": "bytes",
        "scale": scale,
        "precision": 12,
        "connect.version": 1,
        "connect.parameters": {"scale": str(scale), "connect.decimal.precision": "12"},
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "logicalType": "decimal",
    }


def connect(base: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"type": base, "connect.version": 1, "connect.name": name, **extra}


# ---- the envelope ------------------------------------------------------------------------------------------------

BASIC_FIELDS = [("id", "long"), ("name", opt("string")), ("qty", opt("int"))]
BASIC_COLUMNS = {"id": "bigint", "name": "text", "qty": "integer"}


@pytest.mark.parametrize("op", ["c", "u", "r"])
def test_envelope_ops_take_after_with_lsn_and_source_time(registry: Any, op: str) -> None:
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    spec = spec_for(access, BASIC_COLUMNS)
    payload = change(op, after={"id": 7, "name": "new", "qty": 3}, before={"id": 7, "name": "old", "qty": 1}, lsn=4242)
    row = only(decode(spec, [(None, encode(schema_id, schema, payload))]))
    assert {k: row[k] for k in BASIC_COLUMNS} == {"id": 7, "name": "new", "qty": 3}
    assert row["_cdc_op"] == op and row["_dlq_reason"] is None and row["_dlq_value"] is None
    # Commit order from source.sequence: [last commit, LSN]; a snapshot read ranks at the last commit, below it.
    assert row["_cdc_version"] == (4232 << 64) + (0 if op == "r" else 4242)
    assert row["_cdc_ts"] == datetime(2024, 1, 1, tzinfo=UTC)


def test_delete_takes_before_and_version_falls_back_to_the_offset(registry: Any) -> None:
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    spec = spec_for(access, BASIC_COLUMNS)
    payload = change("d", before={"id": 8, "name": None, "qty": None}, lsn=None)
    row = only(decode(spec, [(None, encode(schema_id, schema, payload))]))
    assert (row["id"], row["name"], row["_cdc_op"]) == (8, None, "d")
    assert (row["_cdc_version"], row["_cdc_offset"]) == ((1 << 64) + 100, 100)


def test_tombstones_produce_no_rows(registry: Any) -> None:
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    spec = spec_for(access, BASIC_COLUMNS)
    good = encode(schema_id, schema, change("c", after={"id": 1, "name": "a", "qty": 1}))
    rows = decode(spec, [(None, None), (None, good), (None, None)])
    assert len(rows) == 1 and rows[0]["_cdc_offset"] == 101


def test_the_same_changes_decode_to_the_same_rows_as_json(registry: Any) -> None:
    """Debezium's orders changelog, once as JsonConverter (schemas on) and once as AvroConverter, same rows."""
    fake, access = registry
    columns = dict(workload.ORDERS_COLUMNS)
    row_fields = [
        ("id", "long"),
        ("customer_id", opt("long")),
        ("amount", opt(connect_decimal(2))),
        ("status", opt("string")),
        ("Note", opt("string")),
        ("updated_at", opt(connect("string", "io.debezium.time.ZonedTimestamp"))),
    ]
    schema = envelope(row_fields)
    schema_id = fake.add(schema)
    key_id = fake.add(KEY_SCHEMA)
    plain = workload.generate(300, 40, seed=3, wrapped=False)
    wrapped = workload.generate(300, 40, seed=3, wrapped=True)
    avro_messages: list[tuple[bytes | None, bytes | None]] = []
    for event in plain.events:
        value = None
        if event.value is not None:
            payload = json.loads(event.value, parse_float=Decimal)
            for struct in ("before", "after"):
                if payload[struct] is not None and payload[struct]["amount"] is not None:
                    payload[struct]["amount"] = signed(int(payload[struct]["amount"].scaleb(2)))
            source = payload["source"]
            payload["source"] = {
                "connector": "postgresql",
                "ts_ms": source["ts_ms"],
                "snapshot": "false",
                "lsn": source["lsn"],
                "sequence": source.get("sequence"),
            }
            payload["transaction"] = None
            value = encode(schema_id, schema, payload)
        avro_messages.append((encode(key_id, KEY_SCHEMA, {"id": event.id}), value))
    for primary_key in (("id",), None):
        json_spec = DecodeSpec("things", spec_for(access, columns).columns, primary_key)
        avro_spec = spec_for(access, columns, primary_key)
        from_json = decode(json_spec, [(e.key, e.value) for e in wrapped.events])
        from_avro = decode(avro_spec, avro_messages)
        assert len(from_avro) == len(avro_messages) and all(r["_dlq_reason"] is None for r in from_avro)
        assert from_avro == from_json


# ---- logical types -----------------------------------------------------------------------------------------------

MICROS_2024 = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
TIME_MICROS = ((12 * 60 + 34) * 60 + 56) * 1_000_000 + 789_012  # 12:34:56.789012


@pytest.mark.parametrize(
    "avro_type",
    [
        connect("long", "io.debezium.time.Timestamp"),  # adaptive mode, timestamp(0-3)
        {"type": "long", "logicalType": "timestamp-millis"},  # connect mode
        connect("long", "io.debezium.time.MicroTimestamp"),
        {"type": "array", "items": opt(connect("long", "io.debezium.time.Timestamp"))},
    ],
)
def test_timestamp_infinities_in_any_unit_are_not_scaled(registry: Any, avro_type: Any) -> None:
    """Debezium writes ``±infinity`` as pgjdbc's sentinels, the same number in a millisecond field as in a
    microsecond one: scaled to microseconds first, it was out of range and the message undecodable."""
    import pyarrow as pa

    from cdcsync.core.temporal import TIMESTAMP_NEGATIVE_INFINITY, TIMESTAMP_POSITIVE_INFINITY

    fake, access = registry
    schema = envelope([("id", "long"), ("v", avro_type)])
    schema_id = fake.add(schema)
    array = avro_type.get("type") == "array"
    spec = spec_for(access, {"id": "bigint", "v": "timestamp(3)[]" if array else "timestamp(3)"})
    micros = avro_type.get("connect.name") == "io.debezium.time.MicroTimestamp"
    sentinels = [9_223_372_036_825_200_000, -9_223_372_036_832_400_000, 1_704_067_200_123 * (1000 if micros else 1)]
    values = [[v] for v in sentinels] if array else sentinels
    raws = [encode(schema_id, schema, change("c", after={"id": i, "v": v})) for i, v in enumerate(values)]
    (batch,) = list(decode_batches(iter([kafka_batch([(None, raw) for raw in raws])]), spec))
    assert batch.column("_dlq_reason").to_pylist() == [None] * 3
    column = batch.column("v")
    stored = (column.flatten() if array else column).cast(pa.int64()).to_pylist()
    last = 1_704_067_200_123_000
    assert stored == [TIMESTAMP_POSITIVE_INFINITY, TIMESTAMP_NEGATIVE_INFINITY, last]


@pytest.mark.parametrize(
    ("avro_type", "pg", "value", "expected"),
    [
        (connect("int", "io.debezium.time.Date"), "date", 19723, date(2024, 1, 1)),
        (connect("int", "org.apache.kafka.connect.data.Date", logicalType="date"), "date", 19724, date(2024, 1, 2)),
        (connect("int", "io.debezium.time.Date"), "timestamp", 1, datetime(1970, 1, 2)),
        (
            connect("long", "io.debezium.time.MicroTimestamp"),
            "timestamptz",
            MICROS_2024 + 123_456,
            datetime(2024, 1, 1, 0, 0, 0, 123_456, tzinfo=UTC),
        ),
        (
            connect("long", "io.debezium.time.MicroTimestamp"),
            "timestamp",
            MICROS_2024 + 1,
            datetime(2024, 1, 1, 0, 0, 0, 1),
        ),
        (
            connect("long", "io.debezium.time.Timestamp"),
            "timestamp",
            MICROS_2024 // 1000 + 123,
            datetime(2024, 1, 1, 0, 0, 0, 123_000),
        ),
        (
            connect("long", "io.debezium.time.NanoTimestamp"),
            "timestamp",
            MICROS_2024 * 1000 + 123_456_789,
            datetime(2024, 1, 1, 0, 0, 0, 123_456),
        ),
        (
            connect("long", "org.apache.kafka.connect.data.Timestamp", logicalType="timestamp-millis"),
            "timestamptz",
            MICROS_2024 // 1000 + 5,
            datetime(2024, 1, 1, 0, 0, 0, 5000, tzinfo=UTC),
        ),
        (
            {"type": "long", "logicalType": "timestamp-micros"},
            "timestamptz",
            MICROS_2024 + 7,
            datetime(2024, 1, 1, 0, 0, 0, 7, tzinfo=UTC),
        ),
        ("long", "timestamptz", MICROS_2024 + 9, datetime(2024, 1, 1, 0, 0, 0, 9, tzinfo=UTC)),
        (
            connect("string", "io.debezium.time.ZonedTimestamp"),
            "timestamptz",
            "2024-01-01T10:00:00.5+02:00",
            datetime(2024, 1, 1, 8, 0, 0, 500_000, tzinfo=UTC),
        ),
        (
            connect("long", "io.debezium.time.MicroTimestamp"),
            "date",
            MICROS_2024 + 86_400_000_000 - 1,
            date(2024, 1, 1),
        ),
        (connect("long", "io.debezium.time.MicroTime"), "time", TIME_MICROS, "12:34:56.789012"),
        (connect("int", "io.debezium.time.Time"), "time", TIME_MICROS // 1000, "12:34:56.789000"),
        (connect("long", "io.debezium.time.NanoTime"), "time", TIME_MICROS * 1000 + 999, "12:34:56.789012"),
        ({"type": "int", "logicalType": "time-millis"}, "time", 1000, "00:00:01"),
        (connect("string", "io.debezium.time.ZonedTime"), "text", "12:34:56Z", "12:34:56Z"),
        (connect_decimal(2), "numeric(12,2)", signed(1250), Decimal("12.50")),
        (connect_decimal(2), "numeric", signed(-1250), "-12.50"),
        (connect_decimal(2), "text", signed(5), "0.05"),
        (connect_decimal(3), "double precision", signed(1500), 1.5),
        (
            {"type": "fixed", "name": "dec", "size": 8, "logicalType": "decimal", "precision": 10, "scale": 3},
            "numeric(10,3)",
            signed(-1234567).rjust(8, b"\xff"),
            Decimal("-1234.567"),
        ),
        (
            {
                "type": "record",
                "name": "VariableScaleDecimal",
                "namespace": "io.debezium.data",
                "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                "connect.name": "io.debezium.data.VariableScaleDecimal",
            },
            "numeric",
            {"scale": 3, "value": signed(12345)},
            "12.345",
        ),
        (connect("string", "io.debezium.data.Json"), "jsonb", '{"a": [1, 2.50]}', '{"a": [1, 2.50]}'),
        (
            connect("string", "io.debezium.data.Uuid"),
            "uuid",
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        ),
        (
            {"type": "fixed", "name": "u16", "size": 16},
            "uuid",
            uuid.UUID(int=1).bytes,
            "00000000-0000-0000-0000-000000000001",
        ),
        (
            connect("string", "io.debezium.data.Enum", **{"connect.parameters": {"allowed": "new,paid"}}),
            "text",
            "paid",
            "paid",
        ),
        (
            connect("bytes", "io.debezium.data.Bits", **{"connect.parameters": {"length": "3"}}),
            "bytea",
            b"\x05",
            b"\x05",
        ),
        (connect("bytes", "io.debezium.data.Bits", **{"connect.parameters": {"length": "3"}}), "text", b"\x05", "BQ=="),
        ("bytes", "bytea", b"\x00\xffraw", b"\x00\xffraw"),
        ({"type": "array", "items": "int"}, "jsonb", [1, 2, 3], "[1,2,3]"),
        (
            {"type": "array", "items": opt(connect_decimal(2))},
            "json",
            [signed(150), None, signed(-225)],
            "[1.50,null,-2.25]",
        ),
        ({"type": "array", "items": "string"}, "text", ["a", 'b"'], '["a","b\\""]'),
        (
            {"type": "array", "items": opt(connect_decimal(2))},
            "numeric(10,2)[]",
            [signed(150), None, signed(-225)],
            [Decimal("1.50"), None, Decimal("-2.25")],
        ),
        ({"type": "array", "items": opt("int")}, "integer[]", [1, None], [1, None]),
        (
            {"type": "array", "items": connect("int", "io.debezium.time.Date")},
            "date[]",
            [19782],
            [date(2024, 2, 29)],
        ),
        (
            connect("bytes", "io.debezium.data.Bits", **{"connect.parameters": {"length": "3"}}),
            "bit(3)",
            b"\x05",
            "101",
        ),
        (connect("string", "io.debezium.time.ZonedTime"), "timetz", "10:11:12.5Z", "10:11:12.500000+00"),
        ({"type": "map", "values": "long"}, "jsonb", {"k": 1}, '{"k":1}'),
        # hstore in Debezium's map mode, and its unchanged-TOAST placeholder
        ({"type": "map", "values": opt("string")}, "hstore", {"a": "x", "n": None}, '"a"=>"x", "n"=>NULL'),
        (
            {"type": "map", "values": opt("string")},
            "hstore",
            {"__debezium_unavailable_value": "__debezium_unavailable_value"},
            '"__debezium_unavailable_value"=>"__debezium_unavailable_value"',
        ),
        (connect("string", "io.debezium.data.Json"), "hstore", '{"a":"x"}', '"a"=>"x"'),  # json mode
        (
            {
                "type": "record",
                "name": "Point",
                "namespace": "io.debezium.data.geometry",
                "fields": [{"name": "wkb", "type": "bytes"}, {"name": "srid", "type": opt("int")}],
            },
            "jsonb",
            {"wkb": b"\x01", "srid": None},
            '{"wkb":"AQ==","srid":null}',
        ),
        ("float", "double precision", 0.1, 0.1),
        ("float", "numeric(5,2)", 0.1, Decimal("0.10")),
        ("float", "text", 0.1, "0.1"),
        ("double", "numeric(5,2)", 12.5, Decimal("12.50")),
        ("double", "numeric", float("nan"), "NaN"),
        ("double", "double precision", 1e300, 1e300),
        (connect("long", "io.debezium.time.MicroDuration"), "interval", 90_000_000, "90000000 microseconds"),
        (connect("string", "io.debezium.time.Interval"), "interval", "P1DT2H", "P1DT2H"),
        ("boolean", "boolean", True, True),
        ("int", "smallint", -32768, -32768),
        ("long", "bigint", 2**63 - 1, 2**63 - 1),
        (connect_decimal(2), "bigint", signed(-1200), -12),
        ({"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}, "varchar(4)", "PAID", "PAID"),
        (opt("long"), "bigint", None, None),
    ],
)
def test_logical_types_map_to_the_declared_column(
    registry: Any, avro_type: Any, pg: str, value: Any, expected: Any
) -> None:
    fake, access = registry
    schema = envelope([("id", "long"), ("v", avro_type)])
    schema_id = fake.add(schema)
    spec = spec_for(access, {"id": "bigint", "v": pg})
    row = only(decode(spec, [(None, encode(schema_id, schema, change("c", after={"id": 1, "v": value})))]))
    assert row["_dlq_reason"] is None, row["_dlq_reason"]
    assert row["v"] == expected


def test_a_union_of_several_types_is_read_by_value(registry: Any) -> None:
    fake, access = registry
    schema = envelope([("id", "long"), ("v", ["null", "bytes", "double", "string"])])
    schema_id = fake.add(schema)
    spec = spec_for(access, {"id": "bigint", "v": "text"})
    messages = [
        (None, encode(schema_id, schema, change("c", after={"id": i, "v": v})))
        for i, v in enumerate([b"\x01", 2.5, "s"])
    ]
    assert [r["v"] for r in decode(spec, messages)] == ["AQ==", "2.5", "s"]


@pytest.mark.parametrize(
    ("avro_type", "pg", "value", "fragments"),
    [
        ("long", "integer", 2**40, ("column 'v'", "1099511627776 is out of range for integer")),
        (
            connect_decimal(3),
            "numeric(12,2)",
            signed(12345),
            ("column 'v'", "12.345", "more than 2 digits after the point"),
        ),
        (connect_decimal(0), "numeric(3,0)", signed(12345), ("column 'v'", "more than 3 integer digits")),
        ("string", "varchar(3)", "abcd", ("column 'v'", "longer than character varying(3)")),
        ("double", "bigint", 1.5, ("column 'v'", "1.5 is not a valid bigint (not an integer)")),
        (connect_decimal(2), "bigint", signed(150), ("column 'v'", "1.50 is not a valid bigint (not an integer)")),
        ("double", "date", 1e20, ("column 'v'", "not a valid date")),
        (connect("long", "io.debezium.time.MicroTimestamp"), "timestamptz", 2**63 - 1, ("column 'v'", "out of range")),
        (
            connect("long", "io.debezium.time.MicroTime"),
            "time",
            25 * 3600 * 10**6,
            ("column 'v'", "out of range for time"),
        ),
        ("string", "text", "nul\x00", ("column 'v'", "NUL")),
        ("bytes", "uuid", b"\x01\x02", ("column 'v'", "not a valid uuid")),
        ({"type": "fixed", "name": "f3", "size": 3}, "uuid", b"abc", ("column 'v'", "3 bytes are not a valid uuid")),
        ({"type": "array", "items": "double"}, "jsonb", [float("inf")], ("column 'v'", "not representable as JSON")),
        ({"type": "array", "items": "long"}, "bigint", [1], ("column 'v'", "not a valid bigint")),
        ("string", "numeric(5,2)", "abc", ("column 'v'", "not a valid numeric(5,2)")),
    ],
)
def test_values_that_do_not_fit_are_dead_letters_naming_the_column(
    registry: Any, avro_type: Any, pg: str, value: Any, fragments: tuple[str, ...]
) -> None:
    fake, access = registry
    schema = envelope([("id", "long"), ("v", avro_type)])
    schema_id = fake.add(schema)
    spec = spec_for(access, {"id": "bigint", "v": pg})
    row = only(decode(spec, [(None, encode(schema_id, schema, change("c", after={"id": 1, "v": value})))]))
    assert_dead(row, spec, *fragments)


# ---- the wire format and the registry ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "fragments"),
    [
        (b'{"op":"c"}', ("value starts with '{'", "magic byte 0", "format: json")),
        (b"\x00\x00\x01", ("value is 3 bytes", "too short", "wire format")),
        (b"", ("value is 0 bytes",)),
        (b"\x01" + bytes(16) + b"\x00", ("magic byte 1", "GUID")),
        (b"\x07\x00\x00\x00\x01\x00", ("byte 0x07", "magic byte 0x00")),
        (b"\x00\x00\x00\x03\xe7\x00", ("writer schema id 999", "HTTP 404", "error code 40403")),
    ],
)
def test_malformed_wire_format_is_a_dead_letter(registry: Any, raw: bytes, fragments: tuple[str, ...]) -> None:
    fake, access = registry
    fake.add(envelope(BASIC_FIELDS))
    spec = spec_for(access, BASIC_COLUMNS)
    row = only(decode(spec, [(b"k", raw)]))
    assert_dead(row, spec, *fragments)
    assert row["_dlq_key"] == b"k" and row["_dlq_value"] == raw


def test_corrupt_and_mismatched_bodies_are_dead_letters(registry: Any) -> None:
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    other_id = fake.add(envelope([("id", "long")]))
    spec = spec_for(access, BASIC_COLUMNS)
    good = encode(schema_id, schema, change("c", after={"id": 1, "name": "abc", "qty": 2}))
    rows = decode(
        spec,
        [
            (None, good[:-4]),  # truncated
            (None, good + b"\x00"),  # a byte too many
            (None, good[:5] + b"\x09" + good[6:]),  # union branch 4 of 2
            (None, b"\x00" + other_id.to_bytes(4, "big") + good[5:]),  # read with the wrong writer schema
            (None, good),
        ],
    )
    assert_dead(rows[0], spec, "does not decode with its writer schema id 1", "shop.public.things.Envelope")
    assert_dead(rows[1], spec, "1 bytes are left over after the record")
    assert_dead(rows[2], spec, "does not decode")
    assert_dead(rows[3], spec, f"writer schema id {other_id}")
    assert rows[4]["_dlq_reason"] is None and rows[4]["name"] == "abc"


def test_unusable_writer_schemas_are_dead_letters(registry: Any) -> None:
    fake, access = registry
    proto = fake.add('syntax = "proto3"; message M {}', schema_type="PROTOBUF")
    string = fake.add('"string"')
    invalid = fake.add({"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]})
    spec = spec_for(access, BASIC_COLUMNS)
    string_body = io.BytesIO()
    fastavro.schemaless_writer(string_body, "string", "hello")
    rows = decode(
        spec,
        [
            (None, b"\x00" + proto.to_bytes(4, "big") + b"\x00"),
            (None, b"\x00" + string.to_bytes(4, "big") + string_body.getvalue()),
            (None, b"\x00" + invalid.to_bytes(4, "big") + b"\x00"),
        ],
    )
    assert_dead(rows[0], spec, f"writer schema id {proto} is a PROTOBUF schema, not Avro")
    assert_dead(rows[1], spec, "value is an Avro string, not a Debezium envelope record")
    assert_dead(rows[2], spec, f"writer schema id {invalid} is not a valid Avro schema")


def test_two_writer_schemas_in_one_batch_decode_into_the_declared_columns(registry: Any) -> None:
    """Schema evolution: v2 adds ``note`` (default null); v1 messages have no such field, so it is null there."""
    fake, access = registry
    v1 = envelope([("id", "long"), ("name", opt("string"))])
    v2 = envelope([("id", "long"), ("name", opt("string")), ("note", opt(connect("string", "io.debezium.data.Json")))])
    id1, id2 = fake.add(v1), fake.add(v2)
    spec = spec_for(access, {"id": "bigint", "name": "text", "note": "jsonb"})
    rows = decode(
        spec,
        [
            (None, encode(id1, v1, change("c", after={"id": 1, "name": "a"}))),
            (None, encode(id2, v2, change("c", after={"id": 2, "name": "b", "note": '{"x":1}'}))),
            (None, encode(id1, v1, change("u", after={"id": 1, "name": "c"}))),
        ],
    )
    assert [(r["id"], r["name"], r["note"]) for r in rows] == [(1, "a", None), (2, "b", '{"x":1}'), (1, "c", None)]
    assert sorted(set(fake.calls)) == [id1, id2] and len(fake.calls) == 2


def test_writer_schemas_are_fetched_once_per_id_and_process(registry: Any) -> None:
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    message = encode(schema_id, schema, change("c", after={"id": 1, "name": "a", "qty": 1}))
    for primary_key in (("id",), ("id", "name")):  # two specs (plans) on the same registry share the fetch
        spec = spec_for(access, BASIC_COLUMNS, primary_key)
        for _ in range(3):  # three tasks
            assert len(decode(spec, [(None, message)] * 50)) == 50
    assert fake.calls == [schema_id]


def test_an_unknown_id_is_asked_once_per_task_and_again_in_the_next(registry: Any) -> None:
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    spec = spec_for(access, BASIC_COLUMNS)
    message = encode(5, schema, change("c", after={"id": 1, "name": "a", "qty": 1}))
    rows = decode(spec, [(None, message)] * 3)
    assert all("writer schema id 5 is not in the schema registry" in r["_dlq_reason"] for r in rows)
    assert fake.calls == [5]
    fake.add(schema, schema_id=5)  # registered later (or the registry was restored)
    assert only(decode(spec, [(None, message)]))["_dlq_reason"] is None
    assert fake.calls == [5, 5]


def test_transient_registry_failures_are_retried_with_backoff(registry: Any) -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    fake.failures = [ConnectionRefusedError(111, "Connection refused"), SchemaRegistryError(503, 50003, "busy")]
    spec = spec_for(access, BASIC_COLUMNS)
    started = time.monotonic()
    row = only(decode(spec, [(None, encode(schema_id, schema, change("c", after={"id": 1, "name": "a", "qty": 1})))]))
    assert row["_dlq_reason"] is None and row["name"] == "a"
    assert fake.calls == [schema_id] * 3
    assert time.monotonic() - started >= 0.2 + 0.3  # two backoffs, the second capped by the remaining budget


def test_an_unreachable_registry_fails_the_task_after_its_budget_and_dead_letters_nothing(registry: Any) -> None:
    """An infrastructure fault is never a dead letter: the task fails with a report the driver retries, and
    in the end stops the run with (exit 1); the batch is read again by the next run."""
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    fake.failures = [ConnectionRefusedError(111, "Connection refused")] * 100
    spec = spec_for(access, BASIC_COLUMNS)
    messages = [(None, encode(i, schema, change("c", after={"id": i, "name": "a", "qty": 1}))) for i in (1, 2)]
    started = time.monotonic()
    with pytest.raises(ReportedFailure) as raised:
        decode(spec, messages)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 3
    report = raised.value.report
    assert report.kind is Kind.SERVICE_UNAVAILABLE
    for fragment in ("schema registry at http://fake-registry-", "unreachable", "writer schema id 1", "refused"):
        assert fragment in report.describe()
    error = report.error("decoding batch 3")
    assert isinstance(error, ServiceError) and error.retriable
    assert set(fake.calls) == {1}


def test_a_404_that_is_not_about_the_id_fails_the_task_and_dead_letters_nothing(registry: Any) -> None:
    """Only Confluent's "not found" codes make an id unknown; any other 404 says the URL serves no registry API."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    fake.failures = [SchemaRegistryError(404, 404, "RESTEASY003210: Could not find resource for full path")]
    spec = spec_for(access, BASIC_COLUMNS)
    with pytest.raises(ReportedFailure) as raised:
        decode(spec, [(None, encode(schema_id, schema, change("c", after={"id": 1, "name": "a", "qty": 1})))])
    report = raised.value.report
    assert report.kind is Kind.SERVICE_UNAVAILABLE
    for fragment in ("does not answer as a schema registry", "error code 404", "CDCSYNC__SCHEMA_REGISTRY__URL"):
        assert fragment in report.describe()
    assert fake.calls == [schema_id]  # not retried: the answer will not change


def test_a_refusing_registry_fails_the_task_naming_the_status_and_never_the_password() -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    access = SchemaRegistryAccess("http://bob:hunter2@fake-auth:8081", basic_auth_user_info=None, retry_timeout_s=5)
    fake = FakeRegistry()
    fake.failures = [SchemaRegistryError(401, 40101, "Unauthorized: hunter2 rejected")]
    avro_registry._CLIENTS[access] = fake
    try:
        spec = spec_for(access, BASIC_COLUMNS)
        with pytest.raises(ReportedFailure) as raised:
            decode(spec, [(None, b"\x00\x00\x00\x00\x01\x00")])
    finally:
        avro_registry._CLIENTS.pop(access, None)
    text = str(raised.value)
    for fragment in ("refused writer schema id 1", "HTTP 401", "BASIC_AUTH_USER_INFO", "http://***@fake-auth:8081"):
        assert fragment in text
    assert "hunter2" not in text and "bob" not in text
    assert raised.value.report.kind is Kind.SERVICE_UNAVAILABLE
    assert fake.calls == [1]  # a refusal is not retried


def test_avro_keys_give_the_key_columns_when_no_primary_key_is_declared(registry: Any) -> None:
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id, key_id = fake.add(schema), fake.add(KEY_SCHEMA)
    spec = spec_for(access, BASIC_COLUMNS, None)
    delete = encode(schema_id, schema, change("d", before=None))
    rows = decode(
        spec,
        [
            (encode(key_id, KEY_SCHEMA, {"id": 9}), delete),
            (None, delete),
            (b'{"id": 9}', delete),
            (b"\x00\x00\x00\x00\x63" + b"\x12", delete),
        ],
    )
    assert (rows[0]["id"], rows[0]["_cdc_op"], rows[0]["_dlq_reason"]) == (9, "d", None)
    assert_dead(rows[1], spec, "message has no key", "declares no primary_key")
    assert_dead(rows[2], spec, "message key starts with '{'")
    assert_dead(rows[3], spec, "message key: writer schema id 99 is not in the schema registry")


def test_a_declared_key_falls_back_to_the_avro_message_key(registry: Any) -> None:
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    wide_key = {
        "type": "record",
        "name": "Key",
        "namespace": "shop.public.things",
        "fields": [{"name": "id", "type": connect_decimal(0)}],
    }
    key_id = fake.add(wide_key)
    spec = spec_for(access, {"id": "smallint", "name": "text"}, ("id",))
    delete = encode(schema_id, schema, change("d", before=None))
    rows = decode(
        spec,
        [
            (encode(key_id, wide_key, {"id": signed(12)}), delete),
            (encode(key_id, wide_key, {"id": signed(70000)}), delete),
        ],
    )
    assert (rows[0]["id"], rows[0]["_dlq_reason"]) == (12, None)
    assert_dead(rows[1], spec, "message key column 'id'", "70000", "smallint")


def test_a_key_field_that_is_not_declared_is_a_dead_letter(registry: Any) -> None:
    fake, access = registry
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    odd_key = {"type": "record", "name": "Key", "fields": [{"name": "tenant", "type": "long"}]}
    key_id = fake.add(odd_key)
    spec = spec_for(access, BASIC_COLUMNS, None)
    row = only(decode(spec, [(encode(key_id, odd_key, {"tenant": 1}), encode(schema_id, schema, change("d")))]))
    assert_dead(row, spec, "message key field 'tenant' is not a declared column")


# ---- the spec ----------------------------------------------------------------------------------------------------


def test_avro_specs_are_checked_on_the_driver() -> None:
    columns = (("id", parse_pg_type("bigint")),)
    with pytest.raises(DecodeError, match="format avro needs a schema registry"):
        output_spark_schema(DecodeSpec("s", columns, format="avro"))
    with pytest.raises(DecodeError, match="format 'protobuf' is not one of json, avro"):
        output_spark_schema(DecodeSpec("s", columns, format="protobuf"))
    bad = SchemaRegistryAccess("http://x:1", options=(("no.such.option", "1"),))
    with pytest.raises(DecodeError, match=r"schema registry settings: Unrecognized properties: no\.such\.option"):
        output_spark_schema(DecodeSpec("s", columns, format="avro", schema_registry=bad))
    good = SchemaRegistryAccess("http://x:1")
    assert output_spark_schema(DecodeSpec("s", columns, format="avro", schema_registry=good)) == output_spark_schema(
        DecodeSpec("s", columns)
    )


def test_from_source_carries_the_registry_only_for_avro_and_the_spec_pickles(registry: Any) -> None:
    fake, access = registry
    source = KafkaSource.model_validate({"type": "kafka", "topic": "t", "primary_key": "id", "columns": BASIC_COLUMNS})
    json_spec = DecodeSpec.from_source("things", source, access)
    assert json_spec.format == "json" and json_spec.schema_registry is None
    avro_spec = spec_for(access, BASIC_COLUMNS)
    assert pickle.loads(pickle.dumps(avro_spec)) == avro_spec
    schema = envelope(BASIC_FIELDS)
    schema_id = fake.add(schema)
    function = pickle.loads(pickle.dumps(partial(decode_batches, spec=avro_spec)))
    batch = kafka_batch([(None, encode(schema_id, schema, change("c", after={"id": 3, "name": "p", "qty": 1})))])
    assert [r["name"] for b in function(iter([batch])) for r in b.to_pylist()] == ["p"]


def test_secrets_stay_out_of_repr_and_reasons() -> None:
    access = SchemaRegistryAccess(
        "https://svc:urlpass@registry.example:8081",
        basic_auth_user_info="user:authpass",
        options=(("ssl.key.password", "keypass"), ("ssl.ca.location", "/etc/ca.pem")),
    )
    spec = DecodeSpec("s", (("id", parse_pg_type("bigint")),), format="avro", schema_registry=access)
    for text in (repr(access), repr(spec), str(spec)):
        assert "urlpass" not in text and "authpass" not in text and "keypass" not in text and "svc" not in text
        assert "https://***@registry.example:8081" in text
    scrubbed = access.scrub("failed https://svc:urlpass@registry.example:8081 with user:authpass, keypass, authpass")
    assert scrubbed == "failed https://***@registry.example:8081 with ***, ***, ***"
    config = access.client_config()
    assert config["basic.auth.user.info"] == "user:authpass" and config["max.retries"] == 0
    assert config["ssl.key.password"] == "keypass"


def test_settings_build_the_access(monkeypatch: pytest.MonkeyPatch) -> None:
    from cdcsync.config.settings import load_settings

    monkeypatch.delenv("CDCSYNC__SCHEMA_REGISTRY__URL", raising=False)
    default = SchemaRegistryAccess.from_settings(load_settings())
    assert default.url == "http://127.0.0.1:18081/apis/ccompat/v7" and default.basic_auth_user_info is None
    monkeypatch.setenv("CDCSYNC__SCHEMA_REGISTRY__URL", "https://sr.example")
    monkeypatch.setenv("CDCSYNC__SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO", "u:p")
    monkeypatch.setenv("CDCSYNC__SCHEMA_REGISTRY__OPTIONS__SSL_CA_LOCATION", "/ca.pem")
    monkeypatch.setenv("CDCSYNC__SCHEMA_REGISTRY__RETRY_TIMEOUT_S", "7.5")
    settings = load_settings()
    assert "u:p" not in repr(settings)
    access = SchemaRegistryAccess.from_settings(settings)
    assert (access.url, access.basic_auth_user_info, access.options, access.retry_timeout_s) == (
        "https://sr.example",
        "u:p",
        (("ssl.ca.location", "/ca.pem"),),
        7.5,
    )
    monkeypatch.delenv("CDCSYNC__SCHEMA_REGISTRY__URL")
    monkeypatch.setenv("CDCSYNC__DEVSTACK__SCHEMA_REGISTRY_PORT", "28081")
    assert load_settings().schema_registry_url == "http://127.0.0.1:28081/apis/ccompat/v7"
