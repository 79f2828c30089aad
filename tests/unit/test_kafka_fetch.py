"""The pure parts of the executors' own Kafka read (:mod:`cdcsync.sources.kafka_fetch`): which sources it reads,
the ranges it reads, and its wrapper cut, held to the JVM's rule. Its reads are tested against the real broker in
``tests/integration/test_kafka_fetch.py``."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcsync.config.settings import KafkaSettings, Settings
from cdcsync.sources.debezium.wrappers import CUT_COLUMNS
from cdcsync.sources.kafka_fetch import (
    FETCH_QUEUE_BACKOFF_MS,
    KafkaBatch,
    KafkaFetch,
    PartitionRange,
    cut,
    kafka_fetch,
    planned_ranges,
)
from tests.unit.test_debezium_columnar import KEY_WRAPPER, OTHER_WRAPPER, jvm_cut

pytestmark = pytest.mark.unit

BOOTSTRAP = "127.0.0.1:1"
"""Nothing listens there: making a consumer connects to nothing until it is asked to read."""


def _settings(**kafka: str) -> Settings:
    return Settings(kafka=KafkaSettings(bootstrap_servers=BOOTSTRAP, **kafka))  # type: ignore[arg-type]


def _options(**more: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": BOOTSTRAP, "subscribe": "t", "includeHeaders": "true", **more}


def test_the_tasks_read_a_source_whose_options_librdkafka_takes() -> None:
    fetch = kafka_fetch(
        _options(**{"kafkaConsumer.pollTimeoutMs": "2500", "kafka.fetch.max.bytes": "2000000"}), _settings()
    )
    assert isinstance(fetch, KafkaFetch)
    config = dict(fetch.config)
    assert fetch.poll_timeout_s == 2.5 and fetch.headers
    assert config["fetch.max.bytes"] == "2000000" and config["bootstrap.servers"] == BOOTSTRAP
    # Spark's reader's own choices, kept: the Java client's isolation level; a lost offset is an error, not a reset.
    assert config["isolation.level"] == "read_uncommitted" and config["auto.offset.reset"] == "error"
    assert config["enable.auto.commit"] == "false"
    # A full prefetch queue is refilled at once, not after librdkafka's default second; a source may say otherwise.
    assert config["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS != "1000"
    committed = kafka_fetch(
        _options(**{"kafka.isolation.level": "read_committed", "kafka.fetch.queue.backoff.ms": "500"}), _settings()
    )
    assert isinstance(committed, KafkaFetch) and dict(committed.config)["isolation.level"] == "read_committed"
    assert dict(committed.config)["fetch.queue.backoff.ms"] == "500"
    no_headers = kafka_fetch(_options(includeHeaders="false"), _settings())
    assert isinstance(no_headers, KafkaFetch) and not no_headers.headers
    # Timing Spark's own offset requests only: left to Spark, not a reason to give it the read.
    planner = kafka_fetch(_options(**{"kafka.default.api.timeout.ms": "4000"}), _settings())
    assert isinstance(planner, KafkaFetch) and "default.api.timeout.ms" not in dict(planner.config)


@pytest.mark.parametrize(
    ("options", "reader", "why"),
    [
        ({}, "spark", "kafka.reader is 'spark'"),
        ({"failOnDataLoss": "false"}, "auto", "the source's option 'failOnDataLoss' is Spark's reader's"),
        ({"minPartitions": "8"}, "auto", "the source's option 'minPartitions' is Spark's reader's"),
        (
            {"kafka.sasl.jaas.config": "x required;"},
            "auto",
            "librdkafka refused the client option 'sasl.jaas.config'",
        ),
        ({"kafka.fetch.max.wait.ms": "100"}, "auto", "librdkafka refused the client option 'fetch.max.wait.ms'"),
        ({"kafka.isolation.level": "s3cr3t"}, "auto", "librdkafka refused the client option 'isolation.level'"),
        ({"kafka.fetch.max.bytes": "10"}, "auto", "librdkafka refused the client option 'fetch.max.bytes'"),
    ],
)
def test_spark_reads_a_source_the_tasks_cannot_read_as_it_would(options: dict[str, str], reader: str, why: str) -> None:
    fetch = kafka_fetch(_options(**options), _settings(reader=reader))
    assert fetch == why  # a key, never a value: values may be secrets


def test_the_planned_ranges_are_the_checkpoints_non_empty_ones() -> None:
    ranges = {"b": {"10": [5, 9], "2": [7, 7]}, "a": {"0": [None, 4], "1": [3, 8]}}
    assert planned_ranges(ranges) == (  # type: ignore[arg-type]
        PartitionRange("a", 0, -2, 4),  # new since the last batch: from its first offset, as Spark reads it
        PartitionRange("a", 1, 3, 8),
        PartitionRange("b", 10, 5, 9),
    )
    batch = KafkaBatch(raw=None, fetch=KafkaFetch(config=()), parts=planned_ranges(ranges))  # type: ignore[arg-type]
    assert batch.messages == 5 + 4 and batch.num_partitions() == 3


WRAPPER = b'{"schema":{"type":"struct","fields":[{"type":"int32","field":"id"}]},"payload":'
pieces = st.sampled_from([WRAPPER, OTHER_WRAPPER, KEY_WRAPPER, b"}", b"{", b'{"id":1}', b"", b" ", b"x"])
messages = st.one_of(st.none(), st.lists(pieces, max_size=4).map(b"".join))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(messages, max_size=12), keys=st.lists(messages, max_size=12))
def test_the_cut_is_the_jvms_byte_for_byte(values: list[bytes | None], keys: list[bytes | None]) -> None:
    keys = (keys + [None] * len(values))[: len(values)]
    wrappers = (WRAPPER, OTHER_WRAPPER, KEY_WRAPPER)
    batch = pa.RecordBatch.from_pydict({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())})
    expected = jvm_cut(batch, wrappers)
    for column, wrapper_column in CUT_COLUMNS:
        messages, found = cut(list(values if column == "value" else keys), wrappers)
        assert found is not None and found.to_pylist() == expected.column(wrapper_column).to_pylist()
        assert messages.to_pylist() == expected.column(column).to_pylist()
    assert cut(list(values), ()) == (pa.array(values, pa.binary()), None)
