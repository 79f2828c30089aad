"""The Kafka source: Spark Kafka options for a source, and the executor task that turns Kafka rows into changes.

Decoding happens once per micro-batch, on the executors (:class:`DecodeTask`, run inside the pipeline's single
pass, :mod:`cdcsync.engine.batch`): each task decodes its Arrow batches, writes the messages it could not
decode to ``cdcsync.dead_letters`` itself (idempotently, so a retried task or a replayed batch records nothing
twice) and passes only decoded changes on. Under ``on_decode_error: fail`` the task fails instead, naming the
message, and the driver turns that into a :class:`~cdcsync.core.errors.UndecodableMessage`. A message whose schema
has a column the source lacks (or a recorded column of another type) fails the task whatever ``on_decode_error``
says: it is no bad message but a pipeline behind its source (a :class:`~cdcsync.core.errors.SchemaChangeError`).
Either failure is a :class:`~cdcsync.core.reports.Report` raised as :class:`~cdcsync.core.reports.ReportedFailure`.

A broker that is away fails Spark's Kafka reader, not a decode: its consumer retries by itself inside a task
(``kafkaConsumer.pollTimeoutMs``, then ``default.api.timeout.ms`` for the offset range), so an outage shorter than
that passes unnoticed; a longer one fails the task, and the job, with one of Kafka's retriable exceptions (or the
reader's own ``java.util.concurrent.TimeoutException``). :func:`broker_failure` recognises it by the Java classes
in the failure's causes, never by its text, so the batch is retried and finally reported as the broker's outage.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.config.pipeline import KafkaSource
from cdcsync.config.settings import Settings
from cdcsync.core.errors import BrokerUnavailable, ServiceError
from cdcsync.core.reports import Kind, Report, ReportedFailure, first_to_raise, new_topic
from cdcsync.db.dead_letters import DeadLetterWriter
from cdcsync.sources.debezium.dispatch import decode_batches
from cdcsync.sources.debezium.envelope import CDC_COLUMNS, NEW_KEY_COLUMN, NEW_KEY_HEADER
from cdcsync.sources.debezium.json import wrapper_prefix
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.debezium.wrappers import CUT_COLUMNS, MAX_WRAPPERS, WRAPPED_PREFIX, with_wrappers

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import Accumulator
    from pyspark.sql import DataFrame, SparkSession

    from cdcsync.db.ledger import OffsetRanges

log = logging.getLogger(__name__)

DEFAULT_MAX_OFFSETS_PER_TRIGGER = 500_000
DECODER_INPUT_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
"""Only these cross into Python, plus one header (:func:`decoder_input`): converting Kafka's headers (an array of
structs) to Arrow costs more than decoding the JSON itself, and the JSON envelope carries nearly everything."""


FETCH_DEFAULTS = {"kafka.max.partition.fetch.bytes": str(8 << 20), "kafka.fetch.max.bytes": str(64 << 20)}
"""Larger fetches than the consumer's 1 MiB per partition: catching up is the common case, and it reads faster."""


_KAFKA_RETRIABLE = "org.apache.kafka.common.errors.RetriableException"
"""Superclass of Kafka's client errors worth retrying: timeouts, disconnects, a leader not available."""
_FETCH_TIMEOUT = "java.util.concurrent.TimeoutException"
_SPARK_KAFKA_PACKAGE = "org.apache.spark.sql.kafka010."
"""Spark's Kafka reader throws :data:`_FETCH_TIMEOUT` itself when a poll brought nothing before its timeout."""
_MAX_CAUSES = 32


def broker_failure(error: object) -> BrokerUnavailable | None:
    """The broker outage a failed Spark job or query stands for, if it does (see the module doc); else None.

    ``error``: the PySpark exception of a failed job, or a Java throwable itself (a query's failure: PySpark keeps
    only the text of a cause it has no class for, so the caller asks the query for the throwable)."""
    try:
        for throwable in _java_causes(error):
            classes = _java_classes(throwable)
            reader_timeout = classes[0] == _FETCH_TIMEOUT and _thrown_by_spark_kafka(throwable)
            if _KAFKA_RETRIABLE in classes or reader_timeout:
                message = str(throwable.getMessage() or "").strip().splitlines()
                return BrokerUnavailable(f"{classes[0].rsplit('.', 1)[-1]}: {message[0] if message else ''}".strip())
    except Exception:  # the JVM went away while asked: not a broker outage cdcsync can name
        return None
    return None


def query_broker_failure(query: Any) -> BrokerUnavailable | None:
    """The broker outage that ended a streaming query, if it did. PySpark's ``exception()`` keeps only the text of
    a cause it has no Python class for (Kafka's), so the Java throwable is asked for (no public accessor)."""
    failure = query._jsq.exception()
    return broker_failure(failure.get()) if failure.isDefined() else None


def source_brokers(pipeline_name: str, source: KafkaSource, settings: Settings | None) -> str:
    """The brokers a source reads (its own ``options`` may name others than the settings do)."""
    if settings is None:
        return str(source.options.get("kafka.bootstrap.servers", "of the settings"))
    return spark_kafka_options(pipeline_name, source, settings)["kafka.bootstrap.servers"]


def _java_causes(error: object) -> Iterator[Any]:
    """The Java throwables behind a PySpark exception (a captured exception's origin, or a Py4JJavaError's), and
    each one's causes; or a Java throwable and its causes."""
    python: Any = error
    throwable: Any = None if isinstance(error, BaseException) else error
    for _ in range(_MAX_CAUSES if throwable is None else 0):
        throwable = getattr(python, "_origin", None) or getattr(python, "java_exception", None)
        python = getattr(python, "_cause", None)
        if throwable is not None or python is None:
            break
    for _ in range(_MAX_CAUSES):
        if throwable is None:
            return
        yield throwable
        throwable = throwable.getCause()


def _java_classes(throwable: Any) -> list[str]:
    """The throwable's class and its superclasses, by name (the class's own first)."""
    names: list[str] = []
    cls = throwable.getClass()
    while cls is not None and len(names) < _MAX_CAUSES:
        names.append(str(cls.getName()))
        cls = cls.getSuperclass()
    return names


def _thrown_by_spark_kafka(throwable: Any) -> bool:
    frames = throwable.getStackTrace()
    return len(frames) > 0 and str(frames[0].getClassName()).startswith(_SPARK_KAFKA_PACKAGE)


def decoder_input(raw: DataFrame, wrappers: tuple[bytes, ...] = ()) -> DataFrame:
    """The Kafka rows as the decoder reads them: :data:`DECODER_INPUT_COLUMNS` and, picked out of the headers by
    Spark, the new key of a primary-key change (``__debezium.newkey``, a binary column that is null on nearly
    every row; see :mod:`cdcsync.sinks.key_moves`). With ``wrappers``, a message that starts with one of them and
    ends with ``}`` crosses as its payload alone, the wrapper's index beside it
    (:mod:`cdcsync.sources.debezium.wrappers`)."""
    from pyspark.sql import functions as F

    columns = [F.col(name) for name in DECODER_INPUT_COLUMNS]
    if "headers" in raw.columns:
        named = F.filter("headers", lambda header: header["key"] == F.lit(NEW_KEY_HEADER))
        columns.append(F.get(named, 0)["value"].alias(NEW_KEY_COLUMN))
    if not wrappers:
        return raw.select(*columns)
    rows = raw.select(*columns)
    for name, wrapper_column in CUT_COLUMNS:
        whole = F.col(name)
        which: Any = None
        for index, wrapper in enumerate(wrappers):
            hit = F.startswith(whole, F.lit(wrapper)) & F.endswith(whole, F.lit(b"}"))
            which = F.when(hit, F.lit(index)) if which is None else which.when(hit, F.lit(index))
        payload = whole
        for index, wrapper in reversed(list(enumerate(wrappers))):  # whole = wrapper + payload + "}"
            cut = whole.substr(F.lit(len(wrapper) + 1), F.length(whole) - F.lit(len(wrapper) + 1))
            payload = F.when(F.col(wrapper_column) == F.lit(index), cut).otherwise(payload)
        rows = rows.withColumn(wrapper_column, which).withColumn(name, payload)
    return rows


class WrapperSet:
    """Accumulator parameter (duck-typed, so this module needs no PySpark import): the set of wrappers the tasks
    met on messages that crossed whole."""

    def zero(self, value: set[bytes]) -> set[bytes]:
        return set()

    def addInPlace(self, value: set[bytes], other: set[bytes]) -> set[bytes]:
        value |= other
        return value


@dataclass
class KnownWrappers:
    """Driver side of a JSON source's wrapper cut (:mod:`cdcsync.sources.debezium.wrappers`): the wrappers its
    batches cut off, learned from the first message of the run's first batch (a peek, so that the first batch
    is cut too) and then from what the tasks report they met uncut (a new table of a pattern, a changed schema).
    The newest :data:`~cdcsync.sources.debezium.wrappers.MAX_WRAPPERS` are kept."""

    wrappers: tuple[bytes, ...] = ()
    peeked: bool = False

    @property
    def wants_peek(self) -> bool:
        """No wrapper is known yet, and no message has been peeked at for one."""
        return not self.wrappers and not self.peeked

    def for_batch(self, raw: DataFrame | None) -> tuple[bytes, ...]:
        """The wrappers to cut off this batch's messages; ``raw``: its messages to peek at (None: no peek)."""
        if raw is not None and self.wants_peek:
            self.peeked_at(first_wrappers(raw))
        return self.wrappers

    def peeked_at(self, found: list[bytes] | None) -> None:
        """What a peek at a batch's first message found (None: no message, or the read failed)."""
        self.peeked = found is not None  # a batch of tombstones (or a failed read) tells nothing
        self.learn(found or [])

    def learn(self, seen: Iterable[bytes]) -> None:
        new = tuple(sorted(wrapper for wrapper in set(seen) if wrapper not in self.wrappers))
        self.wrappers = (new + self.wrappers)[:MAX_WRAPPERS]


def batch_read(
    spark: SparkSession, pipeline_name: str, source: KafkaSource, settings: Settings, ranges: OffsetRanges
) -> DataFrame:
    """The messages of a micro-batch's offset ``ranges`` (from the checkpoint), read apart from the batch, for
    :class:`KnownWrappers` to peek at.

    Not the micro-batch's own DataFrame: Spark counts every row a job over that one reads as read by the batch
    (its progress' ``numInputRows``, so the run's ``changes_in`` figures), and the peek is no change read."""
    import json

    options = spark_kafka_options(pipeline_name, source, settings)
    for streaming_only in ("subscribe", "subscribePattern", "startingOffsets", "maxOffsetsPerTrigger"):
        options.pop(streaming_only, None)
    starts = {t: {p: -2 if bounds[0] is None else bounds[0] for p, bounds in ps.items()} for t, ps in ranges.items()}
    options["assign"] = json.dumps({topic: [int(p) for p in partitions] for topic, partitions in ranges.items()})
    options["startingOffsets"] = json.dumps(starts)
    options["endingOffsets"] = json.dumps({t: {p: bounds[1] for p, bounds in ps.items()} for t, ps in ranges.items()})
    reader = spark.read.format("kafka")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def peek_wrappers(
    raw: DataFrame, pipeline_name: str, source: KafkaSource, settings: Settings | None, ranges: OffsetRanges | None
) -> list[bytes] | None:
    """What :class:`KnownWrappers` peeks at for a first wrapper under Spark's reader: the first message of the
    batch's ``ranges`` read apart from it (:func:`batch_read`: a job over ``raw`` itself would count as rows the
    batch read); None when that cannot be set up (no settings, no ranges in the checkpoint) or finds nothing."""
    if settings is None or not ranges:
        return None
    try:
        frame = batch_read(raw.sparkSession, pipeline_name, source, settings, ranges)
    except Exception as error:  # only a way to go faster: the batch's own read reports what is wrong
        log.debug("setting up the read of the batch's first message failed: %s", error)
        return None
    return first_wrappers(frame)


def first_wrappers(raw: DataFrame) -> list[bytes] | None:
    """The wrappers of the batch's first message and its key, read by a Spark job that stops at it (one fetch of
    one partition); None when there is no message, or the read failed (the batch's own read reports that)."""
    from pyspark.sql import functions as F

    try:
        rows = raw.where(F.col("value").isNotNull()).select("value", "key").limit(1).collect()
    except Exception as error:  # only a way to go faster: the batch's own read reports what is wrong
        log.debug("reading the first message for its schema wrapper failed: %s", error)
        return None
    return message_wrappers(rows[0]) if rows else None


def message_wrappers(message: Iterable[bytes | bytearray | None]) -> list[bytes]:
    """The schema wrappers of a message's value and key (those that have one)."""
    found = [wrapper_prefix(bytes(part)) for part in message if part is not None]
    return [wrapper for wrapper in found if wrapper is not None]


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
    wrappers: tuple[bytes, ...] = ()
    """The schema wrappers :func:`decoder_input` cut off this batch's messages with."""
    wrappers_met: Accumulator[set[bytes]] | None = None
    """Where the tasks report the wrappers they met on messages that crossed whole (:class:`KnownWrappers`)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        keep = [name for name, _ in self.spec.columns] + [name for name, _ in CDC_COLUMNS]
        if self.wrappers or self.wrappers_met is not None:
            batches = (self._with_wrappers(batch) for batch in batches)
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

    def _with_wrappers(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch with its wrappers in it (:func:`~cdcsync.sources.debezium.wrappers.with_wrappers`); the
        wrapper of its first whole wrapped message, if any, reported to the driver."""
        import pyarrow.compute as pc

        batch = with_wrappers(batch, self.wrappers)
        if self.wrappers_met is None or not batch.num_rows:
            return batch
        names = batch.schema.names
        for column, wrapper_column in CUT_COLUMNS:
            if column not in names:
                continue
            whole = pc.fill_null(pc.starts_with(batch.column(names.index(column)), WRAPPED_PREFIX.decode()), False)
            if wrapper_column in names:
                whole = pc.and_(whole, pc.is_null(batch.column(names.index(wrapper_column))))
            first = pc.index(whole, True).as_py()
            found = wrapper_prefix(batch.column(names.index(column))[first].as_py()) if first >= 0 else None
            if found is not None:
                self.wrappers_met.add({found})
        return batch

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

    @property
    def wrappers(self) -> tuple[bytes, ...]:
        """The schema wrappers cut off the batch's messages (the same for every topic's task)."""
        return next(iter(self.by_topic.values())).wrappers if self.by_topic else ()

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
