"""Debezium's JDBC sink connector in a Kafka Connect worker of the benchmark's own (``benchmarks/peer_jdbc_sink.py``).

The worker is the dev stack's (:class:`cdcsync.devstack.debezium.KafkaConnect`: Connect standalone of the broker's
Kafka version, jars from the cdcsync cache) with Debezium's JDBC sink plugin tarball as its only plugin, a JVM sized
for throughput rather than for a small footprint (C2, a 2 GiB heap), and connectors allowed to override their
consumers' settings. It runs in a temporary state directory of its own, on a port of its own, against the given
Kafka; it is stopped when the run ends.

Progress is read from Kafka, not from the worker's logs: the connector's tasks consume as the group
``connect-<connector name>``, so the first change is read once that group is stable with its partitions assigned,
and everything is written once its committed offsets reach the end of the topic. That is exact for this sink:
Debezium's task flushes its buffers before each ``put`` returns and commits only the offsets of records it wrote
(the worker commits every ``offset.flush.interval.ms``, 500 ms here, which bounds the timing error).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdcsync.devstack import debezium
from cdcsync.devstack.common import DevStackConfig

CONNECTOR_CLASS = "io.debezium.connector.jdbc.JdbcSinkConnector"
JVM_OPTIONS = ["-Xms512m", "-Xmx2g", "-Djava.awt.headless=true"]
WORKER_OVERRIDES = {
    # consumer.override.* in a connector's config (max.poll.records to match batch.size) needs this.
    "connector.client.config.override.policy": "All",
}


def connector_config(
    *,
    topic: str,
    jdbc_url: str,
    user: str,
    password: str | None,
    table: str,
    tasks: int = 4,
    batch_size: int = 10_000,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The sink with what the comparison asks of it (upserts, deletes, the key from the record key, one task per
    partition) and its best settings: ``batch.size`` large, the consumer's ``max.poll.records`` raised to match
    (and its per-partition fetch large enough to fill such a poll with ~3 KB messages: at the default 1 MiB a task
    gets a few hundred per poll, whatever ``batch.size`` says), ``use.reduction.buffer`` (one statement per key per
    batch). The table already exists, declared like cdcsync's mirror (``schema.evolution=none``);
    ``quote.identifiers`` keeps the column ``"Note"`` as it is. ``overrides`` win."""
    json_converter = "org.apache.kafka.connect.json.JsonConverter"
    config = {
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": str(tasks),
        "topics": topic,
        "connection.url": jdbc_url,
        "connection.username": user,
        "insert.mode": "upsert",
        "delete.enabled": "true",
        "primary.key.mode": "record_key",
        "schema.evolution": "none",
        "quote.identifiers": "true",
        "collection.name.format": table,
        "batch.size": str(batch_size),
        "use.reduction.buffer": "true",
        "consumer.override.max.poll.records": str(batch_size),
        "consumer.override.max.partition.fetch.bytes": str(64 * 1024 * 1024),
        "consumer.override.fetch.max.bytes": str(64 * 1024 * 1024),
        "key.converter": json_converter,
        "key.converter.schemas.enable": "true",
        "value.converter": json_converter,
        "value.converter.schemas.enable": "true",
    }
    if password:
        config["connection.password"] = password
    config.update(overrides or {})
    return config


def jdbc_url(conninfo: Mapping[str, Any]) -> str:
    """The JDBC URL of the database a libpq conninfo (as :func:`psycopg.conninfo.conninfo_to_dict` gives) names."""
    host, port = conninfo.get("host") or "127.0.0.1", conninfo.get("port") or 5432
    return f"jdbc:postgresql://{host}:{port}/{conninfo['dbname']}"


@contextlib.contextmanager
def connect_worker(root: Path, bootstrap: str, connect_port: int) -> Iterator[str]:
    """A fresh Connect worker with the JDBC sink plugin; yields its REST URL once it answers, stops it after."""
    from cdcsync.runtime.jars import debezium_jdbc_sink_plugin_jars

    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if host.strip("[]") not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"the benchmark's Connect worker reaches Kafka on loopback only, not at {bootstrap}")
    cfg = DevStackConfig(state_dir=root / "connect", kafka_port=int(port), connect_port=connect_port)
    plugin = debezium.ConnectPlugin("debezium-connector-jdbc", debezium_jdbc_sink_plugin_jars(cfg.cache_dir))
    worker = debezium.KafkaConnect(cfg, plugins=[plugin], worker_overrides=WORKER_OVERRIDES, jvm_options=JVM_OPTIONS)
    worker.start()
    try:
        worker.wait_rest_ready(180)
        yield worker.address
    finally:
        worker.stop()


@dataclass
class SinkTimes:
    """Monotonic instants of one connector run."""

    registered: float = 0.0
    first_read: float = 0.0
    """The consumer group stable with every partition assigned: its tasks fetch from then on."""
    caught_up: float = 0.0
    """Committed offsets at the end of every partition: every change is in the target."""


def run_connector(
    connect_url: str,
    name: str,
    config: Mapping[str, str],
    bootstrap: str,
    end_offsets: Mapping[int, int],
    *,
    timeout_s: float,
) -> SinkTimes:
    """Register the connector, wait until it has written the whole topic, then delete it."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    group = f"connect-{name}"
    times = SinkTimes(registered=time.monotonic())
    debezium.put_connector(connect_url, name, dict(config))
    deadline = times.registered + timeout_s
    try:
        while not _group_assigned(admin, group, len(end_offsets)):
            _check(connect_url, name, deadline, "to join its consumer group")
            time.sleep(0.05)
        times.first_read = time.monotonic()
        while not _group_caught_up(admin, group, config["topics"], end_offsets):
            _check(connect_url, name, deadline, "to write the whole topic")
            time.sleep(0.1)
        times.caught_up = time.monotonic()
    finally:
        with contextlib.suppress(Exception):
            debezium.delete_connector(connect_url, name)
    return times


def _check(connect_url: str, name: str, deadline: float, waiting_for: str) -> None:
    status = debezium.connector_status(connect_url, name) or {}
    for part in (status.get("connector", {}), *status.get("tasks", [])):
        if part.get("state") == "FAILED":
            raise RuntimeError(f"the JDBC sink failed: {str(part.get('trace', '')).strip()[:3000]}")
    if time.monotonic() > deadline:
        raise TimeoutError(f"the JDBC sink took too long {waiting_for} (status {status})")


def _group_assigned(admin: Any, group: str, partitions: int) -> bool:
    from confluent_kafka import ConsumerGroupState

    description = admin.describe_consumer_groups([group])[group].result(timeout=10)
    if description.state != ConsumerGroupState.STABLE:
        return False
    assigned = sum(len(m.assignment.topic_partitions) for m in description.members if m.assignment)
    return assigned >= partitions


def _group_caught_up(admin: Any, group: str, topic: str, end_offsets: Mapping[int, int]) -> bool:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in end_offsets])
    committed = admin.list_consumer_group_offsets([request])[group].result(timeout=10)
    offsets = {tp.partition: tp.offset for tp in committed.topic_partitions}
    return all(offsets.get(p, -1) >= end for p, end in end_offsets.items())


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """The topic's end offset per partition (all produced messages are acknowledged by then)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cdcsync-bench-peer-watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        consumer.close()
