"""Workload events to Kafka (:func:`produce`), or shaped like Spark's Kafka source rows without Kafka
(:func:`to_kafka_batch`)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import ServiceError

if TYPE_CHECKING:
    import pyarrow as pa

from cdcsync.devstack.workload.events import DEFAULT_START, ChangeEvent

# --------------------------------------------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------------------------------------------


def ensure_topic(
    bootstrap_servers: str, topic: str, partitions: int = 4, *, replication_factor: int = 1, timeout: float = 30.0
) -> bool:
    """Create ``topic`` with ``partitions`` partitions unless it exists; True when it was created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        metadata = admin.list_topics(timeout=timeout)  # no topic argument: must not trigger auto-creation
    except KafkaException as error:
        raise ServiceError(
            f"cannot reach Kafka at {bootstrap_servers}: {error.args[0]}",
            retriable=True,
            hint="start the dev stack with `cdcsync dev up`",
        ) from None
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None:
        return False
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)],
        operation_timeout=timeout,
    )
    try:
        futures[topic].result(timeout=timeout)
    except KafkaException as error:
        kafka_error = error.args[0]
        if kafka_error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise ServiceError(
            f"creating topic '{topic}' on {bootstrap_servers}: {kafka_error.str()}", retriable=kafka_error.retriable()
        ) from None
    return True


def produce(
    bootstrap_servers: str,
    topic: str,
    events: Iterable[ChangeEvent],
    partitions: int = 4,
    *,
    config: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
) -> int:
    """Send ``events`` in order, keyed (one partition per key, Java's murmur2 partitioner), creating ``topic``
    with ``partitions`` partitions first if it is absent. Returns the number of messages delivered; raises
    :class:`~cdcsync.core.errors.ServiceError` if any delivery fails or is still pending after ``timeout`` seconds."""
    from confluent_kafka import KafkaException, Producer

    ensure_topic(bootstrap_servers, topic, partitions, timeout=timeout)
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "linger.ms": 20,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 200_000,
        "partitioner": "murmur2_random",
        "enable.idempotence": True,  # retries keep per-key order
        "message.timeout.ms": int(timeout * 1000),
        "log_level": 3,  # transient warnings of a freshly started broker are retried; failures are raised below
    }
    settings.update(config or {})
    failures: list[str] = []
    delivered = 0

    def on_delivery(error: Any, message: Any) -> None:
        nonlocal delivered
        if error is not None:
            failures.append(error.str())
        else:
            delivered += 1

    producer = Producer(settings)
    sent = 0
    try:
        for event in events:
            while True:
                try:
                    producer.produce(topic, key=event.key, value=event.value, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.1)  # local queue full: let deliveries drain
            sent += 1
            if sent % 10_000 == 0:
                producer.poll(0)
        pending = producer.flush(timeout)
    except KafkaException as error:
        raise ServiceError(
            f"producing to topic '{topic}' on {bootstrap_servers}: {error.args[0]}", retriable=True
        ) from None
    if failures:
        raise ServiceError(
            f"producing to topic '{topic}' on {bootstrap_servers}: {len(failures)} of {sent} messages failed; "
            f"first error: {failures[0]}",
            retriable=True,
        )
    if pending:
        raise ServiceError(
            f"producing to topic '{topic}' on {bootstrap_servers}: {pending} of {sent} messages still undelivered "
            f"after {timeout:g}s",
            retriable=True,
        )
    return delivered


# --------------------------------------------------------------------------------------------------------------
# Without Kafka: what Spark's Kafka source would hand to the decoder
# --------------------------------------------------------------------------------------------------------------


def to_kafka_batch(
    events: Sequence[ChangeEvent],
    *,
    topic: str = "shop.public.orders",
    partitions: int = 4,
    start: datetime = DEFAULT_START,
) -> pa.RecordBatch:
    """An Arrow batch shaped like Spark's Kafka source rows (``key``, ``value``, ``topic``, ``partition``,
    ``offset``, ``timestamp``, ``timestampType``): keyed events go to ``crc32(key) % partitions`` and get
    consecutive offsets per partition, in stream order."""
    import pyarrow as pa

    next_offset = [0] * partitions
    part: list[int] = []
    offsets: list[int] = []
    base = int(start.timestamp() * 1_000_000)
    for event in events:
        p = zlib.crc32(event.key or b"") % partitions
        part.append(p)
        offsets.append(next_offset[p])
        next_offset[p] += 1
    return pa.RecordBatch.from_arrays(
        [
            pa.array([e.key for e in events], type=pa.binary()),
            pa.array([e.value for e in events], type=pa.binary()),
            pa.array([topic] * len(events), type=pa.string()),
            pa.array(part, type=pa.int32()),
            pa.array(offsets, type=pa.int64()),
            pa.array([base + 1000 * i for i in range(len(events))], type=pa.timestamp("us", tz="UTC")),
            pa.array([0] * len(events), type=pa.int32()),
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"],
    )
