"""The Kafka source: Spark Kafka options for a source, and the executor task that turns Kafka rows into changes.

Decoding happens once per micro-batch, on the executors (:class:`DecodeTask`, run inside the pipeline's single
pass, :mod:`cdcsync.engine.batch`): each task decodes its Arrow batches, writes the messages it could not
decode to ``cdcsync.dead_letters`` itself (idempotently, so a retried task or a replayed batch records nothing
twice) and passes only decoded changes on. Under ``on_decode_error: fail`` the task fails instead, naming the
message, and the driver turns that into a :class:`~cdcsync.core.errors.DecodeError`. A message whose schema has a
column the source lacks (or a recorded column of another type) fails the task whatever ``on_decode_error`` says:
it is no bad message but a pipeline behind its source (:func:`schema_change_error`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcsync.config.pipeline import KafkaSource
from cdcsync.config.settings import Settings
from cdcsync.core.errors import NewTopicError, SchemaChangeError, ServiceError
from cdcsync.db.dead_letters import DeadLetterWriter
from cdcsync.db.executor_errors import DECODE_FAILURE_MARKER
from cdcsync.sources.debezium import CDC_COLUMNS, SCHEMA_CHANGE_MARKER, DecodeSpec, decode_batches

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import Accumulator

DEFAULT_MAX_OFFSETS_PER_TRIGGER = 500_000
DECODER_INPUT_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
"""Only these cross into Python: converting Kafka's headers (an array of structs) to Arrow costs more than
decoding the JSON itself, and the JSON envelope carries everything the decoder needs."""


FETCH_DEFAULTS = {"kafka.max.partition.fetch.bytes": str(8 << 20), "kafka.fetch.max.bytes": str(64 << 20)}
"""Larger fetches than the consumer's 1 MiB per partition: catching up is the common case, and it reads faster."""


NEW_TOPIC_MARKER = "[cdcsync:new-topic]"
"""Starts the failure a task reports for a message of a matching topic its ``topic_pattern`` source lacks."""


def spark_kafka_options(pipeline_name: str, source: KafkaSource, settings: Settings) -> dict[str, str]:
    """Options of Spark's Kafka source: settings' native client keys, ours, then the source's own verbatim."""
    options = dict(FETCH_DEFAULTS)
    options.update({f"kafka.{key}": value for key, value in settings.kafka.options.items()})
    subscription = (
        ("subscribePattern", source.topic_pattern) if source.topic_pattern is not None else ("subscribe", source.topic)
    )
    options.update(
        {
            "kafka.bootstrap.servers": settings.bootstrap_servers,
            subscription[0]: str(subscription[1]),
            "startingOffsets": source.starting_offsets,
            "includeHeaders": "true",
            "groupIdPrefix": f"cdcsync-{pipeline_name}",
            "maxOffsetsPerTrigger": str(source.max_offsets_per_trigger or DEFAULT_MAX_OFFSETS_PER_TRIGGER),
        }
    )
    options.update(source.options)
    return options


@dataclass(frozen=True)
class DecodeTask:
    """Executor side of decoding (picklable; Spark ships it to the Python workers)."""

    spec: DecodeSpec
    dead_letters: DeadLetterWriter | None
    """None under ``on_decode_error: fail``."""
    dead_letter_count: Accumulator[int] | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        keep = [name for name, _ in self.spec.columns] + [name for name, _ in CDC_COLUMNS]
        for decoded in decode_batches(batches, self.spec):
            reasons = decoded.column("_dlq_reason")
            if reasons.null_count < decoded.num_rows:
                changes = pc.fill_null(pc.starts_with(reasons, SCHEMA_CHANGE_MARKER), False)
                if pc.any(changes).as_py():
                    raise RuntimeError(_schema_change(self.spec.source_id, decoded.filter(changes)))
                bad = pc.is_valid(reasons)
                if self.dead_letters is None:
                    raise RuntimeError(f"{DECODE_FAILURE_MARKER} {_describe_first(decoded.filter(bad))}")
                written = self.dead_letters.write(decoded.filter(bad))
                if self.dead_letter_count is not None:
                    self.dead_letter_count.add(written)
                decoded = decoded.filter(pc.invert(bad))
            if decoded.num_rows:
                yield decoded.select(keep)


@dataclass(frozen=True)
class TopicDecoders:
    """Executor side of decoding a ``topic_pattern`` source (picklable): a :class:`DecodeTask` per known topic,
    each with its table's columns and key."""

    source_id: str
    by_topic: dict[str, DecodeTask]

    def new_topic(self, rows: pa.Table) -> str | None:
        """The failure for the first row of a topic none decodes, or None when every topic is known."""
        import pyarrow.compute as pc

        topics = rows.column("topic")
        unknown = [topic for topic in pc.unique(topics).to_pylist() if topic not in self.by_topic]
        if not unknown:
            return None
        first = rows.filter(pc.equal(topics, unknown[0])).slice(0, 1).to_pylist()[0]
        detail = {"source": self.source_id, "topic": first["topic"], "partition": first["partition"]}
        detail["offset"] = first["offset"]
        return f"{NEW_TOPIC_MARKER} {json.dumps(detail, separators=(',', ':'))}"


def new_topic_error(failure: str, pipeline_file: str = "PIPELINE.yaml") -> NewTopicError:
    """The driver's error for a failure :meth:`TopicDecoders.new_topic` reported."""
    detail = json.loads(failure[failure.index(NEW_TOPIC_MARKER) + len(NEW_TOPIC_MARKER) :])
    return NewTopicError(
        source_id=detail["source"],
        topic=detail["topic"],
        partition=detail["partition"],
        offset=detail["offset"],
        pipeline_file=pipeline_file,
    )


def _schema_change(source_id: str, changed: pa.RecordBatch) -> str:
    """The failure a schema change stops the batch with: the marker, then one line of JSON with the source, the
    first message with the new schema and the decoder's account of the change (see :func:`schema_change_error`)."""
    row = changed.slice(0, 1).to_pylist()[0]
    detail = json.loads(row["_dlq_reason"][len(SCHEMA_CHANGE_MARKER) :])
    detail.update(source=source_id, topic=row["_cdc_topic"], partition=row["_cdc_partition"], offset=row["_cdc_offset"])
    return f"{SCHEMA_CHANGE_MARKER} {json.dumps(detail, separators=(',', ':'))}"


def schema_change_error(failure: str, pipeline_file: str = "PIPELINE.yaml") -> SchemaChangeError:
    """The driver's error for a failure :class:`DecodeTask` reported for a schema change."""
    detail = json.loads(failure[failure.index(SCHEMA_CHANGE_MARKER) + len(SCHEMA_CHANGE_MARKER) :])
    return SchemaChangeError(
        source_id=detail["source"],
        topic=detail["topic"],
        partition=detail["partition"],
        offset=detail["offset"],
        fields=[tuple(f) for f in detail["fields"]],
        added=detail["added"],
        changed=[tuple(c) for c in detail["changed"]],
        pipeline_file=pipeline_file,
    )


def _describe_first(bad: pa.RecordBatch) -> str:
    row = bad.slice(0, 1).to_pylist()[0]
    return (
        f"message at {row['_cdc_topic']}/{row['_cdc_partition']}@{row['_cdc_offset']} "
        f"could not be decoded: {row['_dlq_reason']}"
    )


def check_kafka_reachable(settings: Settings, topics: list[str], timeout: float = 10.0) -> list[str]:
    """Fail fast, with the address and a hint, when Kafka cannot be reached; return the topics that do not exist.

    Spark's own consumer would retry an unreachable broker for minutes before failing with a JVM stack trace.
    Client options that only the Java client knows (``sasl.jaas.config``...) make librdkafka refuse the
    configuration; then this check is skipped and Spark reports what it finds.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config: dict[str, str | int | float | bool] = {"bootstrap.servers": settings.bootstrap_servers}
    config.update(settings.kafka.options)
    config["log_level"] = 0  # librdkafka would print every failed connection attempt; the error below says it once
    try:
        admin = AdminClient(config)
    except (KafkaException, ValueError, TypeError):
        return []
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as error:
        raise ServiceError(
            f"Kafka at {settings.bootstrap_servers} did not answer within {timeout:.0f}s: {_kafka_reason(error)}",
            hint="start the dev stack with `cdcsync dev up`, or set CDCSYNC__KAFKA__BOOTSTRAP_SERVERS",
            retriable=True,
        ) from None
    return [topic for topic in topics if topic not in metadata.topics]


def _kafka_reason(error: Exception) -> str:
    detail = error.args[0] if error.args else error
    return str(detail.str()) if hasattr(detail, "str") else str(detail)
