"""The Kafka source: Spark Kafka options for a source, and the executor task that turns Kafka rows into changes.

Decoding happens once per micro-batch, on the executors (:class:`DecodeTask`, run inside the pipeline's single
pass, :mod:`cdcsync.engine.batch`): each task decodes its Arrow batches, writes the messages it could not
decode to ``cdcsync.dead_letters`` itself (idempotently, so a retried task or a replayed batch records nothing
twice) and passes only decoded changes on. Under ``on_decode_error: fail`` the task fails instead, naming the
message, and the driver turns that into a :class:`~cdcsync.core.errors.UndecodableMessage`. A message whose schema
has a column the source lacks (or a recorded column of another type) fails the task whatever ``on_decode_error``
says: it is no bad message but a pipeline behind its source (a :class:`~cdcsync.core.errors.SchemaChangeError`).
Either failure is a :class:`~cdcsync.core.reports.Report` raised as :class:`~cdcsync.core.reports.ReportedFailure`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcsync.config.pipeline import KafkaSource
from cdcsync.config.settings import Settings
from cdcsync.core.errors import ServiceError
from cdcsync.core.reports import Kind, Report, ReportedFailure, first_to_raise, new_topic
from cdcsync.db.dead_letters import DeadLetterWriter
from cdcsync.sources.debezium.dispatch import decode_batches
from cdcsync.sources.debezium.envelope import CDC_COLUMNS, NEW_KEY_COLUMN, NEW_KEY_HEADER
from cdcsync.sources.debezium.spec import DecodeSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import Accumulator
    from pyspark.sql import DataFrame

DEFAULT_MAX_OFFSETS_PER_TRIGGER = 500_000
DECODER_INPUT_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
"""Only these cross into Python, plus one header (:func:`decoder_input`): converting Kafka's headers (an array of
structs) to Arrow costs more than decoding the JSON itself, and the JSON envelope carries nearly everything."""


FETCH_DEFAULTS = {"kafka.max.partition.fetch.bytes": str(8 << 20), "kafka.fetch.max.bytes": str(64 << 20)}
"""Larger fetches than the consumer's 1 MiB per partition: catching up is the common case, and it reads faster."""


def decoder_input(raw: DataFrame) -> DataFrame:
    """The Kafka rows as the decoder reads them: :data:`DECODER_INPUT_COLUMNS` and, picked out of the headers by
    Spark, the new key of a primary-key change (``__debezium.newkey``, a binary column that is null on nearly
    every row; see :mod:`cdcsync.sinks.key_moves`)."""
    from pyspark.sql import functions as F

    columns = [F.col(name) for name in DECODER_INPUT_COLUMNS]
    if "headers" in raw.columns:
        named = F.filter("headers", lambda header: header["key"] == F.lit(NEW_KEY_HEADER))
        columns.append(F.get(named, 0)["value"].alias(NEW_KEY_COLUMN))
    return raw.select(*columns)


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
            reports = decoded.column("_dlq_report")
            if reports.null_count < decoded.num_rows:
                bad = pc.is_valid(reports)
                stop = self._stop(decoded.filter(bad))
                if stop is not None:
                    raise ReportedFailure(stop)
                assert self.dead_letters is not None
                written = self.dead_letters.write(decoded.filter(bad))
                if self.dead_letter_count is not None:
                    self.dead_letter_count.add(written)
                decoded = decoded.filter(pc.invert(bad))
            if decoded.num_rows:
                yield decoded.select(keep)

    def _stop(self, bad: pa.RecordBatch) -> Report | None:
        """The report that stops the batch at these rows that did not decode: the first schema change, else
        (under ``on_decode_error: fail``) the first undecodable message; None when they are all dead letters."""
        where = ("_cdc_topic", "_cdc_partition", "_cdc_offset", "_dlq_report")
        reports = (
            Report.decode(report).located(source=self.spec.source_id, topic=topic, partition=partition, offset=offset)
            for topic, partition, offset, report in zip(*(bad.column(c).to_pylist() for c in where), strict=True)
        )
        fail = self.dead_letters is None
        return first_to_raise(report for report in reports if fail or report.kind is not Kind.UNDECODABLE)


@dataclass(frozen=True)
class TopicDecoders:
    """Executor side of decoding a ``topic_pattern`` source (picklable): a :class:`DecodeTask` per known topic,
    each with its table's columns and key."""

    source_id: str
    by_topic: dict[str, DecodeTask]

    def new_topic(self, rows: pa.Table) -> Report | None:
        """The report for the first row of a topic none decodes, or None when every topic is known."""
        import pyarrow.compute as pc

        topics = rows.column("topic")
        unknown = [topic for topic in pc.unique(topics).to_pylist() if topic not in self.by_topic]
        if not unknown:
            return None
        first = rows.filter(pc.equal(topics, unknown[0])).slice(0, 1).to_pylist()[0]
        return new_topic(self.source_id, first["topic"], first["partition"], first["offset"])


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
