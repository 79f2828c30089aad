"""The executors' own Kafka read (:mod:`cdcsync.sources.kafka_fetch`) against the real broker: a partition range
reads as Spark's Kafka reader reads it (then cut by :func:`~cdcsync.sources.kafka.decoder_input`), column for
column and byte for byte, commit markers and all; offsets Kafka no longer has stop the read; a range the broker
does not deliver is the broker's outage; the driver's peek for schema wrappers finds the first message with a value
in small reads."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdcsync.config.settings import KafkaSettings, Settings
from cdcsync.core.errors import BrokerUnavailable
from cdcsync.core.reports import Kind, ReportedFailure
from cdcsync.devstack import workload
from cdcsync.sources.debezium.envelope import NEW_KEY_HEADER
from cdcsync.sources.debezium.json import wrapper_prefix
from cdcsync.sources.kafka import decoder_input
from cdcsync.sources.kafka_fetch import KafkaBatch, KafkaFetch, PartitionRange, kafka_fetch

pytestmark = pytest.mark.integration

Message = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]


def _topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)


def _produce(bootstrap: str, topic: str, messages: list[Message], *, transactions: int = 0) -> None:
    """``messages`` in order; the first ``transactions`` thirds each in a transaction of its own, so the
    partition holds commit markers (offsets without a message) after them."""
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"fetch-test-{uuid.uuid4().hex}"})
    if transactions:
        transactional.init_transactions(30)
    size = len(messages) // 3 + 1
    for number, start in enumerate(range(0, len(messages), size)):
        producer = transactional if number < transactions else plain
        if producer is transactional:
            producer.begin_transaction()
        for key, value, headers in messages[start : start + size]:
            producer.produce(topic, key=key, value=value, headers=headers, partition=0)
        if producer is transactional:
            producer.commit_transaction(30)
        producer.flush(30)


def _spark_read(spark: Any, bootstrap: str, part: PartitionRange, wrappers: tuple[bytes, ...]) -> pa.Table:
    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("assign", f'{{"{part.topic}":[{part.partition}]}}')
        .option("startingOffsets", f'{{"{part.topic}":{{"{part.partition}":{part.start}}}}}')
        .option("endingOffsets", f'{{"{part.topic}":{{"{part.partition}":{part.end}}}}}')
        .option("includeHeaders", "true")
        .load()
    )
    return decoder_input(raw, wrappers).toArrow()


def _fetch(bootstrap: str, **options: str) -> KafkaFetch:
    spark_options = {"kafka.bootstrap.servers": bootstrap, "includeHeaders": "true", **options}
    fetch = kafka_fetch(spark_options, Settings(kafka=KafkaSettings(bootstrap_servers=bootstrap)))
    assert isinstance(fetch, KafkaFetch), fetch
    return fetch


def _high_watermark(bootstrap: str, topic: str) -> int:
    fetch = _fetch(bootstrap)
    consumer = fetch.consumer()
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def _messages() -> list[Message]:
    events = workload.generate(240, 60, seed=17, wrapped=True).events
    messages: list[Message] = [(e.key, e.value, None) for e in events]
    messages[5] = (messages[5][0], messages[5][1], [("other", b"x"), (NEW_KEY_HEADER, b'{"id":9}')])
    messages[6] = (messages[6][0], messages[6][1], [(NEW_KEY_HEADER, b"first"), (NEW_KEY_HEADER, b"second")])
    messages[7] = (messages[7][0], messages[7][1], [("other", b"only")])
    renamed = messages[8][1]
    assert renamed is not None
    messages[8] = (messages[8][0], renamed.replace(b".Value", b".Value2"), None)  # a schema not known: stays whole
    messages += [(b'{"id":1}', b"{}", None), (None, b"not json", None), (b"k", None, None)]
    return messages


def test_a_range_reads_as_sparks_reader_reads_it_cut_byte_for_byte(
    spark: Any, kafka_bootstrap: str, topic_name: str
) -> None:
    _topic(kafka_bootstrap, topic_name)
    messages = _messages()
    _produce(kafka_bootstrap, topic_name, messages, transactions=2)
    end = _high_watermark(kafka_bootstrap, topic_name)
    assert end == len(messages) + 2, "two commit markers among the messages"
    first = next(value for _, value, _ in messages if value is not None)
    wrappers = (wrapper_prefix(first), wrapper_prefix(messages[0][0] or b""))
    assert None not in wrappers

    for part in (PartitionRange(topic_name, 0, 0, end), PartitionRange(topic_name, 0, 7, end - 1)):
        read = list(_fetch(kafka_bootstrap).cutting(wrappers).read(part))  # type: ignore[arg-type]
        got = pa.Table.from_batches(read)
        expected = _spark_read(spark, kafka_bootstrap, part, wrappers)  # type: ignore[arg-type]
        assert got.schema.names == expected.schema.names
        assert got.schema.types == expected.schema.types
        assert got.to_pylist() == expected.to_pylist()
    whole = pa.Table.from_batches(list(_fetch(kafka_bootstrap).read(PartitionRange(topic_name, 0, 0, end))))
    assert whole.column("value").to_pylist() == [value for _, value, _ in messages]
    assert whole.column("key").to_pylist() == [key for key, _, _ in messages]
    assert whole.column("new_key").to_pylist()[5:8] == [b'{"id":9}', b"first", None]
    cut = pa.Table.from_batches(
        list(_fetch(kafka_bootstrap).cutting(wrappers).read(PartitionRange(topic_name, 0, 0, end)))
    )  # type: ignore[arg-type]
    kinds = cut.column("value_wrapper").to_pylist()
    assert kinds.count(0) > 200 and kinds[8] is None  # the workload's messages were cut; the renamed one not


def test_a_range_that_ends_in_a_commit_marker_ends_without_waiting_for_a_message(
    kafka_bootstrap: str, topic_name: str
) -> None:
    _topic(kafka_bootstrap, topic_name)
    messages = _messages()[:30]
    _produce(kafka_bootstrap, topic_name, messages, transactions=3)
    end = _high_watermark(kafka_bootstrap, topic_name)
    assert end == len(messages) + 3, "the last offset is a commit marker"
    # A read that waited for a message at the marker would fail once its poll timeout had passed.
    fetch = _fetch(kafka_bootstrap, **{"kafkaConsumer.pollTimeoutMs": "20000"})
    read = pa.Table.from_batches(list(fetch.read(PartitionRange(topic_name, 0, 0, end))))
    markers = (11, 23, 32)  # after each transaction of 11, 11 and 8 messages
    assert read.column("offset").to_pylist() == [o for o in range(end) if o not in markers]


def test_offsets_kafka_no_longer_has_stop_the_read(kafka_bootstrap: str, topic_name: str) -> None:
    _topic(kafka_bootstrap, topic_name)
    _produce(kafka_bootstrap, topic_name, _messages()[:20])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_records([TopicPartition(topic_name, 0, 5)])[TopicPartition(topic_name, 0, 5)].result(timeout=30)

    with pytest.raises(ReportedFailure) as lost:
        list(_fetch(kafka_bootstrap).read(PartitionRange(topic_name, 0, 2, 20)))
    assert lost.value.report.kind is Kind.OFFSETS_LOST
    error = lost.value.report.error()
    assert not error.retriable and f"topic {topic_name} partition 0, offsets 2 to 20" in error.message
    assert "retention" in (error.hint or "")
    kept = pa.Table.from_batches(list(_fetch(kafka_bootstrap).read(PartitionRange(topic_name, 0, 5, 20))))
    assert kept.column("offset").to_pylist() == list(range(5, 20))


def test_a_range_the_broker_does_not_deliver_is_the_brokers_outage(kafka_bootstrap: str, topic_name: str) -> None:
    _topic(kafka_bootstrap, topic_name)
    _produce(kafka_bootstrap, topic_name, _messages()[:10])
    fetch = _fetch(kafka_bootstrap, **{"kafkaConsumer.pollTimeoutMs": "1500"})
    with pytest.raises(ReportedFailure) as away:
        list(fetch.read(PartitionRange(topic_name, 0, 5, 15)))  # offsets 10 to 14 were never written
    assert away.value.report.kind is Kind.BROKER_UNAVAILABLE
    error = away.value.report.error()
    assert isinstance(error, BrokerUnavailable) and error.retriable
    assert f"no message of topic {topic_name} partition 0, offsets 5 to 15 arrived within 1.5s" in error.message


def test_the_peek_finds_the_first_message_with_a_value_past_chunks_of_tombstones(
    kafka_bootstrap: str, topic_name: str
) -> None:
    """The peek reads a few hundred messages at a time, and still looks as far as a task's first chunk (20,000
    messages): 1,200 tombstones first, then the workload's schema-wrapped messages."""
    _topic(kafka_bootstrap, topic_name)
    wrapped = _messages()[:20]
    tombstones: list[Message] = [(key, None, None) for _ in range(60) for key, _, _ in wrapped]
    _produce(kafka_bootstrap, topic_name, tombstones + wrapped)
    end = _high_watermark(kafka_bootstrap, topic_name)
    key, value, _ = wrapped[0]
    assert value is not None and key is not None

    def peek(*parts: PartitionRange) -> list[bytes] | None:
        return KafkaBatch(None, _fetch(kafka_bootstrap), parts).first_wrappers("peek", None, None)  # type: ignore[arg-type]

    assert peek(PartitionRange(topic_name, 0, 0, end)) == [wrapper_prefix(value), wrapper_prefix(key)]
    assert peek(PartitionRange(topic_name, 0, 0, len(tombstones))) is None  # tombstones alone tell nothing
