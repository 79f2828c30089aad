"""The executors read their micro-batch's Kafka messages themselves, with librdkafka (confluent-kafka).

Why: through Spark's Kafka reader every message becomes a JVM record, then a Spark row, then Arrow, then a socket
write to the Python worker that decodes it; on this project's benchmark machine that path was the largest single
cost of a batch (docs/benchmarks.md, "the executors' own Kafka fetch"), and a third of it in a new session was the
JIT compiling it. librdkafka fetches into C buffers on its own threads, and the task builds the Arrow batch the
decoder reads straight from them, so the messages never enter the JVM.

What stays with Spark: its Kafka source still *plans* every batch (latest offsets, ``maxOffsetsPerTrigger``,
``Trigger.AvailableNow``) and keeps the checkpoint, and the driver still commits each batch through it; only the
read moves. The batch's own DataFrame is never run. Instead the driver takes the batch's offset ranges from the
checkpoint (``offsets/N``, written before the batch runs; the previous entry, or ``sources/0/0`` for the first
batch, is where it starts: :func:`~cdcsync.runtime.checkpoint.batch_offsets`) and runs one task per partition
range (:class:`KafkaBatch`). Each task reads exactly the offsets ``[start, end)`` of its partition: what Spark's
reader would have read, so the ledger's offset ranges, the replays and every exactness argument
(docs/exactly-once.md) are unchanged. Offsets that hold no message (a transaction's commit marker, a compacted
topic's gaps) are skipped by librdkafka's position, as by the Java consumer's.

When the read stays with Spark (:func:`kafka_fetch` says why, once, at INFO): ``kafka.reader: spark`` in the
settings (``CDCSYNC__KAFKA__READER``); a client option librdkafka does not know (Java-only ones such as
``sasl.jaas.config``: librdkafka refuses them when the consumer is made); a Spark reader option that changes what is
read (``failOnDataLoss``, ``minPartitions`` ...); or a checkpoint entry the driver cannot read.

Faults: a broker that does not deliver the range within ``kafkaConsumer.pollTimeoutMs`` (Spark's option and default,
120 s) fails the batch as the broker's outage (retriable, nothing merged or dead-lettered), like Spark's reader;
offsets the broker no longer has (retention deleted them first) stop the run, as Spark's ``failOnDataLoss``
does by default.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cdcsync.core.reports import ReportedFailure, broker_unavailable, offsets_lost
from cdcsync.sources.debezium.envelope import NEW_KEY_COLUMN, NEW_KEY_HEADER
from cdcsync.sources.debezium.wrappers import KEY_WRAPPER_COLUMN, WRAPPER_COLUMN
from cdcsync.sources.kafka import decoder_input, message_wrappers, peek_wrappers, spark_kafka_options

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from cdcsync.config.pipeline import KafkaSource
    from cdcsync.config.settings import Settings
    from cdcsync.db.ledger import OffsetRanges

log = logging.getLogger(__name__)

ArrowTask = Callable[[Iterator["pa.RecordBatch"]], Iterator["pa.RecordBatch"]]

SPARK_READER_OPTIONS = frozenset(
    {
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "startingOffsetsByTimestamp",
        "startingTimestamp",
        "startingOffsetsByTimestampStrategy",
        "includeHeaders",
        "groupIdPrefix",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
        "kafkaConsumer.pollTimeoutMs",
    }
)
"""Spark reader options that only plan batches (the driver's side, still Spark's) or that this reader honours."""
SPARK_CLIENT_ONLY = frozenset({"default.api.timeout.ms"})
"""Java client keys librdkafka lacks that time only the Java client's own calls (Spark's offset requests on the
driver, which still plans the batches): kept for Spark, left out of the tasks' read, which waits
``kafkaConsumer.pollTimeoutMs`` for the broker."""
MESSAGES_PER_BATCH = 20_000
"""Messages per Arrow batch handed to the decoder (Spark's ``arrow.maxRecordsPerBatch`` as cdcsync sets it)."""
DEFAULT_POLL_TIMEOUT_S = 120.0
"""Spark's default for ``kafkaConsumer.pollTimeoutMs`` (``spark.network.timeout``)."""
_WAIT_S = 0.1
"""How long one ``consume`` waits for the rest of a chunk: short, since a range may end in offsets that hold no
message (a commit marker), which are only seen as the consumer's position moving past them."""
FETCH_QUEUE_BACKOFF_MS = "20"
"""How soon librdkafka fetches again for a partition whose prefetch queue was full (its thresholds,
``queued.max.messages.kbytes`` 64 MiB and ``queued.min.messages`` 100k, unchanged: they bound a task's memory).
librdkafka waits a whole second by default. A task decodes and stages while the queue fills, so it met a full queue
at every chunk and then waited out the second: with schema-wrapped messages (2.9 KB, 22k of them fill 64 MiB) both
cores sat idle for a third of a run (docs/benchmarks.md, session 16). A source's ``kafka.fetch.queue.backoff.ms``
option wins over this."""
_EARLIEST = -2
"""librdkafka's logical offset for a partition's first offset (a partition the checkpoint has no start for)."""


@dataclass(frozen=True)
class PartitionRange:
    """The offsets ``[start, end)`` of one partition that a batch reads (``start`` may be :data:`_EARLIEST`)."""

    topic: str
    partition: int
    start: int
    end: int

    def describe(self) -> str:
        start = "its first offset" if self.start < 0 else str(self.start)
        return f"topic {self.topic} partition {self.partition}, offsets {start} to {self.end}"


def planned_ranges(ranges: OffsetRanges) -> tuple[PartitionRange, ...]:
    """The non-empty partition ranges of a batch's offsets as the checkpoint records them (a partition without a
    start is new since the last batch: Spark reads it from its first offset, and so does this reader)."""
    parts = [
        PartitionRange(topic, int(partition), _EARLIEST if start is None else int(start), int(end))
        for topic, partitions in sorted(ranges.items())
        for partition, (start, end) in sorted(partitions.items(), key=lambda item: int(item[0]))
        if end is not None and (start is None or int(start) < int(end))
    ]
    return tuple(parts)


@dataclass(frozen=True)
class KafkaFetch:
    """How a task reads its partition range (picklable): the librdkafka configuration, the poll timeout, whether
    the decoder wants the ``__debezium.newkey`` header, and the schema wrappers to cut off (as
    :func:`~cdcsync.sources.kafka.decoder_input` cuts them on the JVM, byte for byte the same rule)."""

    config: tuple[tuple[str, str], ...]
    poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_S
    headers: bool = True
    wrappers: tuple[bytes, ...] = ()

    def cutting(self, wrappers: tuple[bytes, ...]) -> KafkaFetch:
        return self if wrappers == self.wrappers else replace(self, wrappers=wrappers)

    def consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer(dict(self.config))

    def read(self, part: PartitionRange, chunk: int = MESSAGES_PER_BATCH) -> Iterator[pa.RecordBatch]:
        """The messages of ``part`` in offset order, as Arrow batches of up to ``chunk`` messages shaped like
        :func:`decoder_input`'s rows."""
        consumer = self.consumer()
        try:
            yield from self._read(consumer, part, chunk)
        finally:
            consumer.close()

    def read_all(self, parts: Iterable[PartitionRange]) -> Iterator[pa.RecordBatch]:
        for part in parts:
            yield from self.read(part)

    def _read(self, consumer: Any, part: PartitionRange, chunk: int) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import TopicPartition

        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        position = part.start
        deadline = time.monotonic() + self.poll_timeout_s
        last_error = ""
        while position < part.end:
            before = position
            wanted = chunk if position < 0 else min(chunk, part.end - position)
            messages = consumer.consume(wanted, timeout=_WAIT_S)
            taken = []
            for message in messages:
                error = message.error()
                if error is not None:
                    last_error = self._check(error, part)
                    continue
                if message.offset() >= part.end:
                    break
                taken.append(message)
            if taken:
                yield self._batch(taken)
                position = taken[-1].offset() + 1
            moved = consumer.position([TopicPartition(part.topic, part.partition)])[0].offset
            if moved > position:  # past offsets that hold no message
                position = moved
            if position > before:
                deadline = time.monotonic() + self.poll_timeout_s
            elif time.monotonic() > deadline:
                detail = f"no message of {part.describe()} arrived within {self.poll_timeout_s:g}s"
                raise ReportedFailure(broker_unavailable(f"{detail}{f' ({last_error})' if last_error else ''}"))

    @staticmethod
    def _check(error: Any, part: PartitionRange) -> str:
        """Stop at offsets the broker no longer has; any other error is the broker's, and waited out."""
        from confluent_kafka import KafkaError

        if error.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
            raise ReportedFailure(offsets_lost(f"{part.describe()}: {error.str()}"))
        if error.fatal():
            raise ReportedFailure(broker_unavailable(f"{part.describe()}: {error.str()}"))
        return str(error.str())

    def _batch(self, messages: list[Any]) -> pa.RecordBatch:
        import pyarrow as pa

        # One comprehension per field: this runs for every message, and a loop of appends cost twice as much.
        first = messages[0]
        key_column, key_cut = cut([m.key() for m in messages], self.wrappers)
        value_column, value_cut = cut([m.value() for m in messages], self.wrappers)
        columns: dict[str, pa.Array] = {
            "key": key_column,
            "value": value_column,
            "topic": pa.repeat(pa.scalar(first.topic(), pa.string()), len(messages)),
            "partition": pa.repeat(pa.scalar(first.partition(), pa.int32()), len(messages)),
            "offset": pa.array([m.offset() for m in messages], pa.int64()),
            "timestamp": pa.array([m.timestamp()[1] for m in messages], pa.timestamp("ms", tz="UTC")).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
        if self.headers:
            columns[NEW_KEY_COLUMN] = pa.array([_new_key(m.headers()) for m in messages], pa.binary())
        if value_cut is not None and key_cut is not None:
            columns[WRAPPER_COLUMN] = value_cut
            columns[KEY_WRAPPER_COLUMN] = key_cut
        return pa.RecordBatch.from_pydict(columns)


def _new_key(headers: list[tuple[str, bytes]] | None) -> bytes | None:
    """The first ``__debezium.newkey`` header's value, as Spark's ``filter(headers, …)[0].value`` picks it."""
    if headers:
        for name, value in headers:
            if name == NEW_KEY_HEADER:
                return value
    return None


def cut(messages: list[bytes | None], wrappers: tuple[bytes, ...]) -> tuple[pa.Array, pa.Array | None]:
    """The messages with the first matching wrapper cut off each (one that starts with it and ends with ``}``
    keeps its payload alone), and the wrapper's index per message (null: left whole; None without wrappers).

    Sliced in Python before the Arrow array is built, so only the payloads are copied into it: building the array
    of whole ~2.9 KB messages first and cutting with Arrow's kernels took longer (its large buffers are fresh
    memory each batch)."""
    import pyarrow as pa

    if not wrappers:
        return pa.array(messages, pa.binary()), None
    found: list[int | None] = []
    for at, message in enumerate(messages):
        index = None
        if message is not None and message.endswith(b"}"):
            for number, wrapper in enumerate(wrappers):
                if message.startswith(wrapper):
                    messages[at] = message[len(wrapper) : -1]
                    index = number
                    break
        found.append(index)
    return pa.array(messages, pa.binary()), pa.array(found, pa.int32())


@dataclass(frozen=True)
class FetchingTask:
    """Executor side (picklable): read the partition ranges of this task's ids, then run ``task`` over them."""

    fetch: KafkaFetch
    parts: tuple[PartitionRange, ...]
    task: ArrowTask

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ids = [int(part_id) for batch in batches for part_id in batch.column(0).to_pylist()]
        yield from self.task(self.fetch.read_all(self.parts[part_id] for part_id in ids))


@dataclass(frozen=True)
class KafkaBatch:
    """A micro-batch's Kafka messages as the decoding tasks read them: through Spark's reader (the batch's own
    DataFrame), or, with ``fetch``, by the tasks themselves from the batch's partition ranges (see the module
    doc). Either way a task's ``mapInArrow`` function sees the same Arrow batches."""

    raw: DataFrame
    fetch: KafkaFetch | None = None
    parts: tuple[PartitionRange, ...] = ()
    ranges: OffsetRanges | None = None
    """The batch's offset ranges as the checkpoint planned them (None: unknown)."""

    @classmethod
    def of(cls, raw: DataFrame, fetch: KafkaFetch | None, ranges: OffsetRanges | None) -> KafkaBatch:
        """The batch read by the tasks when there is a ``fetch`` and the checkpoint gave its ``ranges``."""
        if fetch is None or ranges is None:
            return cls(raw, ranges=ranges)
        return cls(raw, fetch, planned_ranges(ranges), ranges)

    def map_in_arrow(self, task: ArrowTask, schema: Any, wrappers: tuple[bytes, ...]) -> DataFrame:
        """``task`` over the batch's messages (cut with ``wrappers``), one Spark task per partition range."""
        if self.fetch is None:
            return decoder_input(self.raw, wrappers).mapInArrow(task, schema)
        ids = self.raw.sparkSession.range(0, len(self.parts), 1, max(1, len(self.parts)))
        return ids.mapInArrow(FetchingTask(self.fetch.cutting(wrappers), self.parts, task), schema)

    def num_partitions(self) -> int:
        return max(1, len(self.parts)) if self.fetch is not None else int(self.raw.rdd.getNumPartitions())

    @property
    def messages(self) -> int:
        """Offsets the batch spans (its messages, less any commit markers or compacted gaps): the run's
        ``changes_in`` when the tasks read, since Spark's progress then counts no rows."""
        return sum(part.end - part.start for part in self.parts if part.start >= 0)

    def first_wrappers(self, pipeline_name: str, source: KafkaSource, settings: Settings | None) -> list[bytes] | None:
        """The wrappers of the batch's first message with a value, and of its key
        (:class:`~cdcsync.sources.kafka.KnownWrappers`), read on the driver as the tasks read (Spark's reader: a job
        of its own, :func:`~cdcsync.sources.kafka.peek_wrappers`); None when the first 20,000 messages of each of
        its ranges hold no such message or the read failed (the tasks' read reports what is wrong)."""
        if self.fetch is None:
            return peek_wrappers(self.raw, pipeline_name, source, settings, self.ranges)
        peek = replace(
            self.fetch,
            config=_peeking(self.fetch.config),
            wrappers=(),
            poll_timeout_s=min(self.fetch.poll_timeout_s, 10.0),
        )
        try:
            for part in self.parts:
                looked_at = 0
                for batch in peek.read(part, chunk=_PEEK_CHUNK):
                    values = batch.column("value")
                    if values.null_count < len(values):
                        first = next(i for i, valid in enumerate(values.is_valid().to_pylist()) if valid)
                        return message_wrappers([values[first].as_py(), batch.column("key")[first].as_py()])
                    looked_at += len(values)
                    if looked_at >= MESSAGES_PER_BATCH:
                        break
        except Exception as error:  # only a way to go faster: the batch's own read reports what is wrong
            log.debug("reading the first message for its schema wrapper failed: %s", error)
        return None


_PEEK_CHUNK = 500
"""Messages the driver's peek (:meth:`KafkaBatch.first_wrappers`) takes at a time: it wants one with a value, and
the first 20,000 (a task's first chunk) took 130-210 ms of a batch's start on a small machine."""
_PEEK_FETCH = {"fetch.message.max.bytes": str(256 << 10), "queued.min.messages": "1000"}
"""The peek's consumer fetches a little ahead, not the tasks' 8 MiB per partition
(:data:`cdcsync.sources.kafka.FETCH_DEFAULTS`, set under librdkafka's alias ``max.partition.fetch.bytes``)."""


def _peeking(config: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    kept = {key: value for key, value in config if key != "max.partition.fetch.bytes"}
    return tuple(sorted({**kept, **_PEEK_FETCH}.items()))


def source_fetch(pipeline_name: str, source: KafkaSource, settings: Settings | None) -> KafkaFetch | None:
    """How the executors read ``source``'s batches themselves; None when Spark's reader reads them (said once)."""
    if settings is None:
        return None
    fetch = kafka_fetch(spark_kafka_options(pipeline_name, source, settings), settings)
    if isinstance(fetch, str):
        log.info("pipeline '%s': Spark's Kafka reader reads the source's messages: %s", pipeline_name, fetch)
        return None
    return fetch


def kafka_fetch(spark_options: dict[str, str], settings: Settings) -> KafkaFetch | str:
    """The executors' read for a source whose Spark reader options are ``spark_options``, or why Spark's
    reader reads it (see the module doc)."""
    if settings.kafka.reader == "spark":
        return "kafka.reader is 'spark'"
    config: dict[str, str] = {}
    for key, value in spark_options.items():
        client_key = key.removeprefix("kafka.")
        if client_key != key:
            if client_key not in SPARK_CLIENT_ONLY:
                config[client_key] = value
        elif key not in SPARK_READER_OPTIONS:
            return f"the source's option '{key}' is Spark's reader's"
    config.setdefault("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
    config.setdefault("isolation.level", "read_uncommitted")  # the Java consumer's default, which Spark keeps
    client = f"{spark_options.get('groupIdPrefix', 'cdcsync')}-fetch"
    config.setdefault("group.id", client)  # no group is joined (partitions are assigned) and nothing committed
    config.update(
        {
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
            "enable.partition.eof": "false",
            "auto.offset.reset": "error",
            "client.id": client,
            "log_level": "0",
        }
    )
    fetch = KafkaFetch(
        config=tuple(sorted(config.items())),
        poll_timeout_s=float(spark_options.get("kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_TIMEOUT_S * 1000)) / 1000,
        headers=spark_options.get("includeHeaders", "false").lower() == "true",
    )
    try:
        fetch.consumer().close()
    except Exception:  # librdkafka refuses a key it does not know, or a value
        return _refusal(config)
    return fetch


def _refusal(config: dict[str, str]) -> str:
    """Why librdkafka refused ``config``, naming the first key it refuses on its own; never a value, nor
    librdkafka's message, which may quote one (a value may be a secret)."""
    from confluent_kafka import Consumer

    essentials: dict[str, str] = {k: config[k] for k in ("bootstrap.servers", "group.id", "log_level") if k in config}
    for key, value in config.items():
        try:
            Consumer({**essentials, key: value}).close()
        except Exception:
            return f"librdkafka refused the client option '{key}'"
    return "librdkafka refused the client options together"
