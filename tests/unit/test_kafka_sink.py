"""The kafka sink's YAML and its Debezium events: what it writes decodes, through cdcsync's own Debezium decoder,
into the very changes it was given (JSON with and without schemas, Avro)."""

from __future__ import annotations

import io
import json
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.types import parse_pg_type
from cdcsync.core.errors import ConfigError
from cdcsync.sinks.kafka import source_ranges, transactional_id, unwritten
from cdcsync.sinks.kafka_envelope import EventShape, avro_name, sequence_of
from cdcsync.sources.debezium.dispatch import decode_batches
from cdcsync.sources.debezium.envelope import change_position, offset_version
from cdcsync.sources.debezium.spec import DecodeSpec, output_arrow_schema

pytestmark = pytest.mark.unit

UTC = timezone.utc
COLUMNS = {
    "id": "bigint",
    "small": "smallint",
    "n": "integer",
    "amount": "numeric(12,2)",
    "ratio": "double precision",
    "ok": "boolean",
    "note": "text",
    "blob": "bytea",
    "day": "date",
    "at": "timestamptz",
    "local_at": "timestamp",
    "tags": "text[]",
}
SOURCE = {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint", "amount": "numeric(12,2)"}}
TOPIC = "shop.cdc-out.orders"


def spec() -> DecodeSpec:
    return DecodeSpec("orders", tuple((name, parse_pg_type(t)) for name, t in COLUMNS.items()), ("id",))


def changes() -> pa.Table:
    """Decoded changes as a source hands them to sinks: every column type, each op, versions of each kind."""
    schema = output_arrow_schema(spec(), dead_letters=False)
    full = {
        "small": -3,
        "n": 7,
        "amount": Decimal("-1234567890.05"),
        "ratio": 0.25,
        "ok": True,
        "note": 'héllo "q"',
        "blob": b"\x00\xff",
        "day": date(1969, 12, 31),
        "at": datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC),
        "local_at": datetime(1999, 1, 2, 3, 4, 5, 6),
        "tags": ["a", None, "c"],
    }
    empty = dict.fromkeys(full)
    stamp = datetime(2024, 5, 1, 10, 0, 1, tzinfo=UTC)
    rows = [
        {"id": 1, **full, "_cdc_op": "r", "_cdc_version": Decimal(5000)},  # a snapshot read (0, S)
        {"id": 2, **full, "_cdc_op": "c", "_cdc_version": Decimal((7 << 64) + 9)},
        {"id": 2, **empty, "note": "x", "_cdc_op": "u", "_cdc_version": Decimal((7 << 64) + 10)},
        {"id": 1, **empty, "_cdc_op": "d", "_cdc_version": Decimal((8 << 64) + 11)},
        {"id": 3, **full, "_cdc_op": "r", "_cdc_version": Decimal(6 << 64)},  # a read with a last commit (L, 0)
    ]
    for offset, row in enumerate(rows):
        row.update(_cdc_ts=stamp, _cdc_topic="up", _cdc_partition=0, _cdc_offset=offset)
    return pa.Table.from_pylist(rows, schema=schema)


def shape(table: pa.Table, *, schemas: bool = True) -> EventShape:
    return EventShape.of(
        table.schema, ("id",), topic=TOPIC, pipeline="p", sink_id="out", input_id="orders", schemas=schemas
    )


def redecode(messages: list[tuple[bytes | None, bytes | None, str]], decode_spec: DecodeSpec) -> list[dict[str, Any]]:
    n = len(messages)
    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([k for k, _, _ in messages], pa.binary()),
            "value": pa.array([v for _, v, _ in messages], pa.binary()),
            "topic": [TOPIC] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
        }
    )
    rows = [row for out in decode_batches(iter([batch]), decode_spec) for row in out.to_pylist()]
    assert all(row["_dlq_reason"] is None for row in rows), [row["_dlq_reason"] for row in rows]
    return rows


def business(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith(("_cdc_topic", "_cdc_partition", "_cdc_offset", "_dlq"))}


@pytest.mark.parametrize("schemas", [True, False])
def test_json_events_decode_back_into_the_same_changes(schemas: bool) -> None:
    table = changes()
    messages = shape(table, schemas=schemas).json_messages(table, tombstones=True)
    assert [op for _, _, op in messages] == ["r", "c", "u", "d", "d", "r"]  # a tombstone after the delete
    assert messages[4][1] is None and messages[4][0] == messages[3][0]
    rows = redecode(messages, spec())
    decoded = [business(row) for row in rows if row["_cdc_version"] is not None]  # the tombstone has no version
    assert decoded == [business(row) for row in table.to_pylist()]


def test_json_envelope_is_debeziums_shape() -> None:
    table = changes()
    key, value, _ = shape(table).json_messages(table.slice(3, 1), tombstones=False)[0]
    assert key is not None and value is not None
    key_doc, value_doc = json.loads(key), json.loads(value)
    assert key_doc["payload"] == {"id": 1}
    assert key_doc["schema"] == {
        "type": "struct",
        "name": f"{TOPIC}.Key",
        "optional": False,
        "fields": [{"type": "int64", "optional": False, "field": "id"}],
    }
    payload = value_doc["payload"]
    assert payload["op"] == "d" and payload["after"] is None and payload["before"]["id"] == 1
    assert payload["source"]["connector"] == "cdcsync" and payload["source"]["sequence"] == '["8","11"]'
    assert payload["ts_ms"] == payload["source"]["ts_ms"] == 1714557601000
    fields = {f["field"]: f for f in value_doc["schema"]["fields"]}
    assert list(fields) == ["before", "after", "source", "op", "ts_ms"]
    amount = next(f for f in fields["after"]["fields"] if f["field"] == "amount")
    assert amount["name"] == "org.apache.kafka.connect.data.Decimal" and amount["parameters"]["scale"] == "2"
    bare = json.loads(shape(table, schemas=False).json_messages(table.slice(1, 1), tombstones=False)[0][1] or b"")
    assert "schema" not in bare and bare["after"]["amount"] == "-1234567890.05"


def test_avro_events_decode_back_into_the_same_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Encoded with the registered schemas' ids; the decoder's registry lookup answers from the same schemas."""
    from confluent_kafka.schema_registry import Schema

    from cdcsync.sources.debezium import avro_registry
    from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess, parse_writer

    table = changes()
    events = shape(table)
    schemas = {1: events.avro_key_schema(), 2: events.avro_value_schema()}
    for schema in schemas.values():
        fastavro.parse_schema(schema)  # a valid Avro schema
    registered = {schema_id: Schema(json.dumps(schema), "AVRO") for schema_id, schema in schemas.items()}
    monkeypatch.setattr(avro_registry, "_fetch", lambda access, schema_id: registered[schema_id])
    access = SchemaRegistryAccess("http://registry.invalid/kafka-sink-unit")
    avro_spec = DecodeSpec(**{**spec().__dict__, "format": "avro", "schema_registry": access})
    messages = events.avro_messages(table, True, 1, 2)
    assert messages[0][1] is not None and messages[0][1][:5] == b"\x00\x00\x00\x00\x02"  # Confluent wire format
    record = fastavro.schemaless_reader(io.BytesIO(messages[1][1][5:]), fastavro.parse_schema(schemas[2]), None)  # type: ignore[index]
    assert record["op"] == "c" and record["after"]["id"] == 2
    assert not isinstance(parse_writer(2, registered[2]), str)
    rows = redecode(messages, avro_spec)
    decoded = [business(row) for row in rows if row["_cdc_version"] is not None]
    assert decoded == [business(row) for row in table.to_pylist()]


@pytest.mark.parametrize(
    ("version", "op"),
    [((7 << 64) + 9, "u"), (5000, "r"), (6 << 64, "r"), ((6 << 64) + 4, "r"), (offset_version(12, "c"), "c")],
)
def test_sequence_gives_the_downstream_the_same_version(version: int, op: str) -> None:
    sequence = sequence_of(version, op)
    source = {
        "sequence": sequence,
        "snapshot": "incremental" if op == "r" and version >> 64 and version % 2**64 else "true",
    }
    assert change_position(source, op) == version


def test_offsets_are_kept_per_source_partition_and_rows_below_them_are_left_out() -> None:
    table = pa.table(
        {"_cdc_topic": ["a", "a", "b", "a"], "_cdc_partition": [0, 0, 1, 0], "_cdc_offset": [5, 6, 9, 7]},
        schema=pa.schema([("_cdc_topic", pa.string()), ("_cdc_partition", pa.int32()), ("_cdc_offset", pa.int64())]),
    )
    assert source_ranges(table) == {("a", 0): (5, 7), ("b", 1): (9, 9)}
    assert unwritten(table, {("a", 0): 7}).column("_cdc_offset").to_pylist() == [9, 7]
    assert unwritten(table, {("a", 0): 8, ("b", 1): 10}).num_rows == 0
    one = transactional_id("p", "out", [("a", 0)])
    assert one == "cdcsync.p.out.a-0" and transactional_id("p", "out", [("b", 1), ("a", 0)]).startswith(
        "cdcsync.p.out."
    )
    assert avro_name("shop.cdc-out.1x") == "shop.cdc_out._1x"


def pipeline_with(**sink: Any) -> dict[str, Any]:
    return {"name": "ops", "sources": {"orders": SOURCE}, "sinks": {"out": {"from": "orders", **sink}}}


def test_kafka_sink_validates_with_its_defaults() -> None:
    pipeline = validate_pipeline_dict(pipeline_with(type="kafka", topic="out.orders"))
    sink = pipeline.sinks["out"]
    assert (sink.data_format, sink.json_schemas, sink.topic_partitions, sink.tombstones_after_delete) == (  # type: ignore[union-attr]
        "json",
        True,
        1,
        True,
    )
    assert pipeline.postgres_sinks() == {}


@pytest.mark.parametrize(
    ("sink", "expected"),
    [
        ({"type": "kafka"}, "sinks.out.topic: required key is missing"),
        ({"type": "kafka", "topic": "a b"}, "sinks.out.topic: 'a b' is not a Kafka topic name"),
        ({"type": "kafka", "topic": "t2", "data_format": "xml"}, "sinks.out.data_format:"),
        (
            {"type": "kafka", "topic": "t2", "topic_partitions": 0},
            "sinks.out.topic_partitions: Input should be greater",
        ),
        ({"type": "kafka", "topic": "t2", "options": {"transactional.id": "x"}}, "set by cdcsync itself"),
        ({"type": "kafka", "topic": "t2", "primary_key": "nope"}, "sinks.out.primary_key: column 'nope' is not in"),
        ({"type": "kafka", "topic": "t2", "tombstones_after_delet": False}, "did you mean 'tombstones_after_delete'?"),
    ],
)
def test_bad_kafka_sink_options_are_refused_with_their_yaml_path(sink: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(pipeline_with(**sink))
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_kafka_sink_needs_a_key() -> None:
    doc = pipeline_with(type="kafka", topic="t2")
    doc["sources"]["orders"] = {**SOURCE, "primary_key": None}
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(doc)
    assert any(p.startswith("sinks.out.primary_key: required") for p in caught.value.problems), caught.value.problems


def test_a_tombstone_the_source_read_stays_a_tombstone_and_follows_its_delete_once() -> None:
    table = changes()
    tombstone = table.slice(3, 1).to_pylist()[0] | {"_cdc_version": None, "_cdc_offset": 9}
    rows = pa.concat_tables([table.slice(0, 4), pa.Table.from_pylist([tombstone, tombstone], schema=table.schema)])
    events = shape(rows).events(rows, tombstones=True)
    assert [(op, value is None) for _, value, op in events] == [
        ("r", False),
        ("c", False),
        ("u", False),
        ("d", False),
        ("d", True),  # one tombstone after the delete, not one per tombstone row of the same key in a row
    ]
    lone = shape(rows).events(rows.slice(4, 1), tombstones=True)
    assert lone == [({"id": 1}, None, "d")]
    assert shape(rows).events(rows.slice(3, 2), tombstones=False) == shape(rows).events(rows.slice(3, 1), False)


def test_a_producer_setting_librdkafka_rejects_is_a_refusal_not_a_retry() -> None:
    from cdcsync.core.reports import Kind, ReportedFailure
    from cdcsync.sinks.kafka import KafkaWriter

    writer = KafkaWriter(
        topic="out",
        data_format="json",
        json_schemas=True,
        tombstones=True,
        key=("id",),
        client=(("bootstrap.servers", "127.0.0.1:9"), ("no.such.property", "x")),
        registry=None,
        pipeline="p",
        sink_id="out",
        input_id="orders",
        checkpoint_id="cp",
        batch_id=4,
    )
    with pytest.raises(ReportedFailure) as caught:
        writer.stage(changes())
    assert caught.value.report.kind == Kind.REFUSED
    assert "sink 'out': writing batch 4 to topic out" in str(caught.value) and "no.such.property" in str(caught.value)


def test_a_topic_whose_partitions_the_metadata_does_not_show_yet_is_not_counted_as_too_small() -> None:
    """Just after a topic is created, the brokers' metadata can list it with an error or with no partitions; that
    must read as "not known yet" (ensure_topic waits for it), never as a topic of 0 partitions to refuse."""
    from types import SimpleNamespace

    from cdcsync.sinks.kafka import _known_partitions

    def listed(**topics: Any) -> Any:
        return SimpleNamespace(topics=topics)

    assert _known_partitions(listed(), "t") is None
    assert _known_partitions(listed(t=SimpleNamespace(error="LEADER_NOT_AVAILABLE", partitions={0: 0})), "t") is None
    assert _known_partitions(listed(t=SimpleNamespace(error=None, partitions={})), "t") is None
    assert _known_partitions(listed(t=SimpleNamespace(error=None, partitions={0: 0, 1: 1, 2: 2})), "t") == 3
