"""``cdcsync status``: how far each source is, from the checkpoint and Kafka, and what each sink holds.

Reads only: the checkpoint's committed offsets (no Spark needed), Kafka's end offsets, the batch ledger, the
target tables and who holds the pipeline's lock (the run streaming it now, if any). Safe to run while the
pipeline streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cdcsync.config.operators import KafkaSink, OperatorSink, WebhookSink
from cdcsync.config.pipeline import ClickHouseSink, DeltaSink, Pipeline, PostgresAggregateSink
from cdcsync.config.plugins import PluginSink
from cdcsync.config.settings import Settings, redact_dsn
from cdcsync.core.errors import ServiceError
from cdcsync.db.http import shown_url
from cdcsync.runtime.checkpoint import committed_offsets
from cdcsync.runtime.lock import LockHolder, lock_holder
from cdcsync.sql.render import render


@dataclass(frozen=True)
class PartitionStatus:
    source: str
    topic: str
    partition: int
    committed: int
    end: int

    @property
    def lag(self) -> int:
        return max(self.end - self.committed, 0)


@dataclass(frozen=True)
class SinkStatus:
    sink: str
    target: str
    last_batch: int | None
    committed_at: datetime | None
    rows: int
    version: int | None = None
    """A Delta table's version (its newest commit); None for other targets."""


@dataclass(frozen=True)
class BoundedStatus:
    """A bounded phase's progress, from its progress file (:mod:`cdcsync.runtime.bounded`)."""

    source: str
    phase: str
    chunks_done: int
    chunks: int | None
    """None until the first run has planned the phase."""


@dataclass(frozen=True)
class PipelineStatus:
    partitions: list[PartitionStatus]
    sinks: list[SinkStatus]
    dead_letters: int
    dead_letter_keys: int = 0
    """Distinct (topic, message key) among the dead letters: targets whose rows for them may be stale."""
    running: LockHolder | None = None
    """The run holding the pipeline's lock, None when no run is streaming it."""
    bounded: list[BoundedStatus] = field(default_factory=list)

    def to_json(self, pipeline: str) -> dict[str, Any]:
        """The same facts as the tables ``cdcsync status`` prints, for scripts (``status --json``): times in ISO
        8601 with their zone, absent values as null."""

        def when(value: datetime | None) -> str | None:
            return value.isoformat() if value is not None else None

        holder = self.running
        return {
            "pipeline": pipeline,
            "partitions": [
                {
                    "source": p.source,
                    "topic": p.topic,
                    "partition": p.partition,
                    "processed_up_to": p.committed,
                    "end_offset": p.end,
                    "lag": p.lag,
                }
                for p in self.partitions
            ],
            "sinks": [
                {
                    "sink": s.sink,
                    "target": s.target,
                    "last_batch": s.last_batch,
                    "committed_at": when(s.committed_at),
                    "rows": s.rows,
                }
                for s in self.sinks
            ],
            "bounded": [
                {"source": b.source, "phase": b.phase, "chunks_done": b.chunks_done, "chunks": b.chunks}
                for b in self.bounded
            ],
            "dead_letters": {"messages": self.dead_letters, "keys": self.dead_letter_keys},
            "running": None
            if holder is None
            else {
                "pid": holder.pid,
                "host": holder.host,
                "since": when(holder.since),
                "backend_pid": holder.backend_pid,
                "client_addr": holder.client_addr,
            },
        }


def _end_offsets(bootstrap: str, topics: list[str]) -> dict[str, dict[int, int]]:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "cdcsync-status", "enable.auto.commit": False, "log_level": 0}
    )
    try:
        metadata = consumer.list_topics(timeout=10)
        result: dict[str, dict[int, int]] = {}
        for topic in topics:
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                continue
            for partition in info.partitions:
                _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                result.setdefault(topic, {})[partition] = high
        return result
    except KafkaException as error:
        raise ServiceError(f"reading end offsets from Kafka at {bootstrap}: {error}", retriable=True) from None
    finally:
        consumer.close()


def pipeline_status(pipeline: Pipeline, settings: Settings) -> PipelineStatus:
    import psycopg

    partitions: list[PartitionStatus] = []
    topics = {  # by stream: its topic, or the known topics of a topic_pattern source
        source_id: sorted(pipeline.routes[source_id]) if source.topic is None else [source.topic]
        for source_id, source in pipeline.streams().items()
    }
    ends = _end_offsets(settings.bootstrap_servers, [topic for names in topics.values() for topic in names])
    for source_id, source_topics in topics.items():
        committed = committed_offsets(settings.checkpoint_dir(pipeline.name, source_id))
        for topic in source_topics:
            done = committed.get(topic, {})
            for partition, end in sorted(ends.get(topic, {}).items()):
                partitions.append(PartitionStatus(source_id, topic, partition, done.get(partition, 0), end))

    sinks: list[SinkStatus] = []
    try:
        with psycopg.connect(settings.postgres_dsn, connect_timeout=10) as conn:
            for sink_id, sink in pipeline.sinks.items():
                if isinstance(sink, ClickHouseSink):
                    sinks.append(_clickhouse_status(conn, pipeline, settings, sink_id, sink))
                    continue
                if isinstance(sink, OperatorSink | PluginSink):
                    sinks.append(_operator_status(conn, pipeline.name, sink_id, sink))
                    continue
                if isinstance(sink, DeltaSink):
                    sinks.append(_delta_status(conn, pipeline, sink_id, sink))
                    continue
                last = conn.execute(
                    render("postgres/runtime/ledger_last_batch.sql.j2"),
                    {"pipeline": pipeline.name, "sink": sink_id},
                ).fetchone()
                # What users read: the mirror, or an aggregate sink's aggregation table (rows = groups).
                table = sink.agg_table if isinstance(sink, PostgresAggregateSink) else sink.table
                count_sql = render("postgres/runtime/count_rows.sql.j2", target=(sink.schema_, table))
                rows = conn.execute(count_sql).fetchone()
                sinks.append(
                    SinkStatus(
                        sink_id,
                        f"{sink.schema_}.{table}",
                        last[0] if last else None,
                        last[1] if last else None,
                        int(rows[0]) if rows else 0,
                    )
                )
            dead = conn.execute(
                render("postgres/runtime/dead_letters_count.sql.j2"), {"pipeline": pipeline.name}
            ).fetchone()
            running = lock_holder(conn, pipeline.name)
    except psycopg.Error as error:
        raise ServiceError(
            f"reading sink status from Postgres at {redact_dsn(settings.postgres_dsn)}: {str(error).strip()}",
            retriable=True,
        ) from None
    messages, keys = (int(dead[0]), int(dead[1])) if dead else (0, 0)
    from cdcsync.runtime.bounded import progress_of

    bounded = [BoundedStatus(*phase) for phase in progress_of(pipeline, settings)]
    return PipelineStatus(partitions, sinks, messages, keys, running, bounded)


def _delta_status(conn: Any, pipeline: Pipeline, sink_id: str, sink: DeltaSink) -> SinkStatus:
    """Last batch from the Postgres ledger; version and live rows from the table's own log (no Spark started). A
    catalog table, or one whose log is not on a local path, shows rows -1 and no version."""
    from cdcsync.sinks.delta import table_summary

    last = conn.execute(
        render("postgres/runtime/ledger_last_batch.sql.j2"), {"pipeline": pipeline.name, "sink": sink_id}
    ).fetchone()
    summary = (
        table_summary(sink.path) if sink.path is not None and "://" not in sink.path.removeprefix("file://") else None
    )
    return SinkStatus(
        sink_id,
        sink.target_name,
        last[0] if last else None,
        last[1] if last else None,
        summary[1] if summary else -1,
        summary[0] if summary else None,
    )


def _clickhouse_status(
    conn: Any, pipeline: Pipeline, settings: Settings, sink_id: str, sink: ClickHouseSink
) -> SinkStatus:
    """Last batch from the Postgres ledger; rows are the table's current rows (``FINAL``, not deleted)."""
    from cdcsync.db.clickhouse import connect_from_settings, count_rows

    last = conn.execute(
        render("postgres/runtime/ledger_last_batch.sql.j2"), {"pipeline": pipeline.name, "sink": sink_id}
    ).fetchone()
    client = connect_from_settings(settings)
    try:
        rows = count_rows(client, sink.database, sink.table)
    finally:
        client.close()
    return SinkStatus(
        sink_id, f"{sink.database}.{sink.table}", last[0] if last else None, last[1] if last else None, rows
    )


def _operator_status(conn: Any, pipeline: str, sink_id: str, sink: OperatorSink | PluginSink) -> SinkStatus:
    """A sink without a table: its rows are the changes it handed on, as the ledger counted them."""
    values = {"pipeline": pipeline, "sink": sink_id}
    last = conn.execute(render("postgres/runtime/ledger_last_batch.sql.j2"), values).fetchone()
    total = conn.execute(render("postgres/runtime/ledger_rows_total.sql.j2"), values).fetchone()
    target = sink.type
    if isinstance(sink, WebhookSink):
        target = shown_url(sink.url)
    elif isinstance(sink, KafkaSink):
        target = f"kafka topic {sink.topic}"
    return SinkStatus(sink_id, target, last[0] if last else None, last[1] if last else None, int(total[0]))
