"""The kafka sink's executor writer against the real broker (and registry), without Spark: one transaction per
task, a replayed task writes nothing again, a zombie producer of the same task is fenced, the topic is created
or refused by its partitions, and Avro schemas land in the registry."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from cdcsync.core.errors import UserError
from cdcsync.sinks.kafka import KafkaWriter, ensure_topic, registered, source_ranges, transactional_id
from cdcsync.sinks.kafka_envelope import OP_HEADER
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess
from tests.conftest import read_topic

pytestmark = pytest.mark.integration

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("amount", pa.decimal128(12, 2)),
        ("_cdc_op", pa.string()),
        ("_cdc_version", pa.decimal128(38, 0)),
        ("_cdc_ts", pa.timestamp("us", tz="UTC")),
        ("_cdc_topic", pa.string()),
        ("_cdc_partition", pa.int32()),
        ("_cdc_offset", pa.int64()),
    ]
)


UPSTREAM = f"upstream_{uuid.uuid4().hex[:8]}"
"""The source topic the changes came from: the transactions commit offsets on it, so it must exist."""


@pytest.fixture(autouse=True)
def upstream(kafka_bootstrap: str) -> None:
    ensure_topic({"bootstrap.servers": kafka_bootstrap}, UPSTREAM, 1, "upstream")


def changes(first_offset: int, ops: str, partition: int = 0) -> pa.Table:
    at = datetime(2024, 5, 1, tzinfo=timezone.utc)
    rows = [
        {
            "id": offset % 3,
            "amount": Decimal("1.50") * offset,
            "_cdc_op": op,
            "_cdc_version": Decimal((1 << 64) + offset),
            "_cdc_ts": at,
            "_cdc_topic": UPSTREAM,
            "_cdc_partition": partition,
            "_cdc_offset": offset,
        }
        for offset, op in enumerate(ops, start=first_offset)
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def writer(bootstrap: str, topic: str, checkpoint: str, **extra: Any) -> KafkaWriter:
    settings: dict[str, Any] = {
        "topic": topic,
        "data_format": "json",
        "json_schemas": True,
        "tombstones": True,
        "key": ("id",),
        "client": (("bootstrap.servers", bootstrap),),
        "registry": None,
        "pipeline": "it",
        "sink_id": f"out_{uuid.uuid4().hex[:6]}",
        "input_id": "orders",
        "checkpoint_id": checkpoint,
        "batch_id": 0,
    }
    settings.update(extra)
    return KafkaWriter(**settings)


def test_a_replayed_task_writes_nothing_again_and_each_change_is_read_once(kafka_bootstrap: str) -> None:
    topic = f"sink.out_{uuid.uuid4().hex[:8]}"
    ensure_topic({"bootstrap.servers": kafka_bootstrap}, topic, 2, "out")
    write = writer(kafka_bootstrap, topic, "cp1")
    first = changes(1, "ccud")  # a delete: its event and a tombstone
    assert write.stage(first) == 4
    assert write.stage(first) == 4  # the replay of the same task: the committed offsets say it is in the topic
    later = changes(5, "uu")
    assert write.stage(later) == 2
    messages = read_topic(kafka_bootstrap, topic)
    values = [json.loads(m.value()) if m.value() is not None else None for m in messages]
    assert len(messages) == 7  # 6 changes and one tombstone: nothing twice
    assert sorted(v["payload"]["source"]["sequence"] for v in values if v) == sorted(
        f'["1","{offset}"]' for offset in range(1, 7)
    )
    assert all(dict(m.headers())[OP_HEADER] in (b"c", b"u", b"d") for m in messages)
    keyed = {m.key() for m in messages}
    assert all(json.loads(k)["payload"]["id"] in (0, 1, 2) for k in keyed)
    # Another checkpoint (after `cdcsync reset`) starts over: the same offsets are written again.
    assert writer(kafka_bootstrap, topic, "cp2", sink_id=write.sink_id).stage(first) == 4
    assert len(read_topic(kafka_bootstrap, topic)) == 12


def test_a_zombie_producer_of_the_same_task_is_fenced(kafka_bootstrap: str) -> None:
    from confluent_kafka import KafkaException, Producer

    topic = f"sink.out_{uuid.uuid4().hex[:8]}"
    ensure_topic({"bootstrap.servers": kafka_bootstrap}, topic, 1, "out")
    write = writer(kafka_bootstrap, topic, "cp1")
    zombie_id = transactional_id("it", write.sink_id, [(UPSTREAM, 0)])
    zombie = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": zombie_id})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", key=b"z")
    zombie.flush(10)
    assert write.stage(changes(1, "cc")) == 2  # its init_transactions aborts the zombie's open transaction
    with pytest.raises(KafkaException):
        zombie.commit_transaction(10)
    assert [m.value() for m in read_topic(kafka_bootstrap, topic)].count(b"zombie") == 0
    # Another worker's attempt at the same partitions fences this process's cached producer: the next task here
    # starts a new one and carries on.
    Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": zombie_id}).init_transactions(30)
    assert write.stage(changes(2, "cuu")) == 3  # offset 2 is in the topic already: only 3 and 4 are written
    values = [json.loads(m.value())["payload"] for m in read_topic(kafka_bootstrap, topic)]
    assert [v["source"]["sequence"] for v in values] == [f'["1","{offset}"]' for offset in (1, 2, 3, 4)]


def test_topic_with_fewer_partitions_is_refused(kafka_bootstrap: str) -> None:
    topic = f"sink.out_{uuid.uuid4().hex[:8]}"
    client = {"bootstrap.servers": kafka_bootstrap}
    ensure_topic(client, topic, 1, "out")
    ensure_topic(client, topic, 1, "out")  # exists with enough: fine
    with pytest.raises(UserError, match=r"has 1 partition\(s\), fewer than topic_partitions: 3"):
        ensure_topic(client, topic, 3, "out")


def test_avro_events_register_their_schemas(kafka_bootstrap: str, schema_registry_url: str) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    topic = f"sink.out_{uuid.uuid4().hex[:8]}"
    ensure_topic({"bootstrap.servers": kafka_bootstrap}, topic, 1, "out")
    access = SchemaRegistryAccess(schema_registry_url)
    write = writer(kafka_bootstrap, topic, "cp1", data_format="avro", registry=access)
    assert write.stage(changes(0, "cd")) == 2
    messages = read_topic(kafka_bootstrap, topic)
    assert len(messages) == 3 and messages[2].value() is None  # the tombstone
    registry = SchemaRegistryClient({"url": schema_registry_url})
    value = registry.get_latest_version(f"{topic}-value")
    key = registry.get_latest_version(f"{topic}-key")
    assert messages[0].value()[1:5] == value.schema_id.to_bytes(4, "big")
    assert messages[0].key()[1:5] == key.schema_id.to_bytes(4, "big")
    assert json.loads(value.schema.schema_str)["name"] == "Envelope"


def test_tasks_registering_a_new_subject_at_once_all_get_its_id_and_an_incompatible_schema_stays_refused(
    schema_registry_url: str,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    record = {"type": "record", "name": "V", "fields": [{"name": "id", "type": "long"}]}
    for _ in range(5):  # the registry's race (a 409 "already exists" for all but one) shows in most rounds
        subject = f"sink.race_{uuid.uuid4().hex[:8]}-value"

        def register(subject: str) -> int:  # each task's own client, as on the executors
            return registered(
                SchemaRegistryClient({"url": schema_registry_url}), subject, Schema(json.dumps(record), "AVRO")
            )

        with ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(register, [subject] * 4))
        assert len(set(ids)) == 1
    client = SchemaRegistryClient({"url": schema_registry_url})
    client.set_compatibility(subject, "BACKWARD")
    changed = {**record, "fields": [{"name": "id", "type": "string"}]}
    with pytest.raises(SchemaRegistryError) as refused:
        registered(client, subject, Schema(json.dumps(changed), "AVRO"))
    assert refused.value.http_status_code == 409


def _partition_summary(batches: Any) -> Any:
    import pyarrow.compute as pc
    from pyspark import TaskContext

    batches = [batch for batch in batches if batch.num_rows]
    if not batches:
        return
    table = pa.Table.from_batches(batches)
    task = TaskContext.get().partitionId()  # type: ignore[union-attr]
    for (topic, partition), _ in source_ranges(table).items():
        rows = table.filter(
            pc.and_(pc.equal(table.column("_cdc_topic"), topic), pc.equal(table.column("_cdc_partition"), partition))
        )
        offsets = rows.column("_cdc_offset").to_pylist()
        yield pa.RecordBatch.from_pylist(
            [{"task": task, "topic": topic, "partition": partition, "offsets": offsets}],
            schema=pa.schema(
                [
                    ("task", pa.int32()),
                    ("topic", pa.string()),
                    ("partition", pa.int32()),
                    ("offsets", pa.list_(pa.int64())),
                ]
            ),
        )


def test_a_transforms_rows_reach_a_kafka_sink_as_whole_source_partitions_in_offset_order(spark: Any) -> None:
    """A transform's shuffle can split a source partition over tasks; the kafka sink's input is repartitioned so
    each task holds whole source partitions (its transaction records progress per source partition)."""
    from cdcsync.engine.graph import by_source_partition

    rows = [("up", p, o) for p in range(3) for o in range(40)]
    shuffled = spark.createDataFrame(rows, "_cdc_topic string, _cdc_partition int, _cdc_offset bigint").repartition(5)
    ddl = "task int, topic string, partition int, offsets array<bigint>"
    summary = by_source_partition(shuffled).mapInArrow(_partition_summary, ddl).collect()
    assert sorted((row["topic"], row["partition"]) for row in summary) == [("up", 0), ("up", 1), ("up", 2)]
    assert all(row["offsets"] == list(range(40)) for row in summary)
