"""One micro-batch of one source, landed in all of its sinks exactly once.

The expensive part of a batch is moving rows between the JVM and Python, so the executors cross that boundary
once: a single ``mapInArrow`` pass (:class:`StageTask`) decodes the partition's Kafka rows, records its dead
letters, and stages the decoded changes into every pending sink: a COPY into a Postgres sink's staging table,
an Arrow insert into a ClickHouse sink's table (:mod:`cdcsync.sinks.clickhouse`). Only a row count per sink comes
back. The driver then merges each sink in its own ledgered transaction (for ClickHouse: records the ledger row).

Order per batch, per sink: ledger lookup (skip a batch merged before: same id, same offset ranges) -> stage
(executors) -> merge + ledger row with the ranges (driver). A transient failure anywhere retries the whole
sequence, which is safe because each step is idempotent. :func:`stage_batch` stops before the merges, which a
:class:`StagedBatch` runs: :mod:`cdcsync.runtime.overlap` runs them while the next batch stages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cdcsync.config.pipeline import RoutedClickHouseSink, RoutedPostgresSink
from cdcsync.core.errors import CdcsyncError
from cdcsync.core.reports import Report, ReportedFailure, first_to_raise
from cdcsync.core.worker_heap import freeze_long_lived
from cdcsync.db.executor_errors import executor_error
from cdcsync.db.ledger import OffsetRanges
from cdcsync.sinks import key_moves
from cdcsync.sinks.clickhouse import ClickHouseTableSink
from cdcsync.sinks.console import ConsoleTableSink
from cdcsync.sinks.delta import DeltaTableSink
from cdcsync.sinks.kafka import KafkaTableSink
from cdcsync.sinks.plugins import PluginTableSink
from cdcsync.sinks.postgres import PostgresUpsertSink
from cdcsync.sinks.webhook import WebhookTableSink
from cdcsync.sources.kafka import DecodeTask, TopicDecoders, broker_failure
from cdcsync.sources.kafka_fetch import KafkaBatch
from cdcsync.transforms.plugins import with_chain

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

_COUNTS_SCHEMA = "sink int, rows bigint, report string"
"""Rows staged per sink, or one row with the encoded :class:`~cdcsync.core.reports.Report` that stops the batch."""

BatchSink = (
    PostgresUpsertSink
    | ClickHouseTableSink
    | ConsoleTableSink
    | WebhookTableSink
    | KafkaTableSink
    | PluginTableSink
    | DeltaTableSink
)
"""Driver side of a sink: ``ledger_key``, ``prepare``, then ``stage_writer`` and ``merge`` (executors write), or
``merge_changes`` (a Delta sink: the driver's MERGE reads the batch's DataFrame, see :mod:`cdcsync.engine.graph`)."""
ExecutorSink = (
    PostgresUpsertSink | ClickHouseTableSink | ConsoleTableSink | WebhookTableSink | KafkaTableSink | PluginTableSink
)


class ExecutorWriter(Protocol):
    """Executor side of a sink (picklable): lands one decoded partition, returns the rows it wrote."""

    def stage(self, table: pa.Table) -> int: ...


def _counts_batch(counts: list[int], report: Report | None = None) -> pa.RecordBatch:
    import pyarrow as pa

    schema = pa.schema([("sink", pa.int32()), ("rows", pa.int64()), ("report", pa.string())])
    if report is not None:
        return pa.RecordBatch.from_pydict({"sink": [-1], "rows": [0], "report": [report.encode()]}, schema=schema)
    return pa.RecordBatch.from_pydict(
        {"sink": list(range(len(counts))), "rows": counts, "report": [None] * len(counts)}, schema=schema
    )


def _stage_all(writers: tuple[ExecutorWriter, ...], batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    import pyarrow as pa

    table = pa.Table.from_batches(batches) if batches else None
    try:
        return _counts_batch([writer.stage(table) if table is not None else 0 for writer in writers])
    except ReportedFailure as failure:  # a failed write (a target away): as data too, see StageTask
        return _counts_batch([], report=failure.report)


@dataclass(frozen=True)
class StageTask:
    """Executor side: decode one partition, then stage it into each pending sink (picklable)."""

    decode: DecodeTask
    writers: tuple[ExecutorWriter, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_long_lived()
        try:
            decoded = list(self.decode(batches))
        except ReportedFailure as failure:
            # on_decode_error: fail, or a schema change. Reported as data, not raised: a failed task makes Spark
            # kill the other tasks' Python workers, whose tracebacks would end up on the user's terminal, and
            # those tasks may still write after the driver has moved on to the batch's next attempt.
            yield _counts_batch([], report=failure.report)
            return
        yield _stage_all(self.writers, decoded)


@dataclass(frozen=True)
class RoutedStageTask:
    """Executor side for a ``topic_pattern`` source: split one partition by topic (Spark's Kafka partitions
    usually hold one topic each), decode each topic's rows with its table's spec and stage them into that table's
    sinks. A topic no table is known for stops the batch before anything is staged (picklable)."""

    decoders: TopicDecoders
    writers: tuple[ExecutorWriter, ...]
    topics: tuple[str, ...]
    """The topic each writer's table is fed by."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.compute as pc

        freeze_long_lived()
        counts = [0] * len(self.writers)
        try:
            read = [batch for batch in batches if batch.num_rows]
        except ReportedFailure as failure:  # the tasks' own Kafka read (sources.kafka_fetch): the broker's
            yield _counts_batch([], report=failure.report)
            return
        if not read:  # (a range of commit markers alone holds no message)
            yield _counts_batch(counts)
            return
        rows = pa.Table.from_batches(read)
        unknown = self.decoders.new_topic(rows)
        if unknown is not None:
            yield _counts_batch([], report=unknown)
            return
        for topic in pc.unique(rows.column("topic")).to_pylist():
            decode = self.decoders.by_topic[topic]
            try:
                decoded = list(decode(iter(rows.filter(pc.equal(rows.column("topic"), topic)).to_batches())))
            except ReportedFailure as failure:
                yield _counts_batch([], report=failure.report)
                return
            if not decoded:
                continue
            changes = pa.Table.from_batches(decoded)
            try:
                for index, writer in enumerate(self.writers):
                    if self.topics[index] == topic:
                        counts[index] += writer.stage(changes)
            except ReportedFailure as failure:
                yield _counts_batch([], report=failure.report)
                return
        yield _counts_batch(counts)


@dataclass(frozen=True)
class StageRowsTask:
    """Executor side: stage one partition of already decoded (or transformed) changes into sinks (picklable)."""

    writers: tuple[ExecutorWriter, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_long_lived()
        yield _stage_all(self.writers, [batch for batch in batches if batch.num_rows])


@dataclass
class SinkOutcome:
    skipped: bool
    rows_staged: int = 0
    rows_merged: int = 0
    merge_seconds: float = 0.0
    """How long the driver's merge (and ledger row) took; the run's metrics observe it."""


def pending_sinks(
    sinks: dict[str, BatchSink],
    batch_id: int,
    checkpoint_id: str,
    offsets: OffsetRanges | None,
    keep: tuple[int, ...] = (),
) -> tuple[dict[str, dict[str, Any]], dict[str, BatchSink], dict[str, SinkOutcome]]:
    """Ledger keys, the sinks still to land this batch, and outcomes for those that landed it before (the same
    batch id and offset ranges). ``keep``: batches whose staged rows a Postgres sink's stage keeps (another batch's
    merge is still to run, :mod:`cdcsync.runtime.overlap`)."""
    keys = {sink_id: sink.ledger_key(batch_id, checkpoint_id, offsets) for sink_id, sink in sinks.items()}
    pending = {sink_id: sink for sink_id, sink in sinks.items() if _prepare(sink, keys[sink_id], keep)}
    return keys, pending, {sink_id: SinkOutcome(skipped=True) for sink_id in sinks.keys() - pending.keys()}


def _prepare(sink: BatchSink, key: dict[str, Any], keep: tuple[int, ...]) -> bool:
    return sink.prepare(key, keep) if isinstance(sink, PostgresUpsertSink) else sink.prepare(key)


def raise_reported(reports: list[str], doing: str, pipeline_file: str) -> None:
    """Raise what tasks reported (encoded :class:`~cdcsync.core.reports.Report` s): a new topic or a schema
    change first (the user's to resolve), else an undecodable message. Either way nothing of the batch is merged."""
    first = first_to_raise(Report.decode(report) for report in reports)
    if first is not None:
        raise first.error(doing, pipeline_file)


def stage(
    rows: DataFrame | KafkaBatch,
    task: StageTask | RoutedStageTask | StageRowsTask,
    batch_id: int,
    pipeline_file: str,
    wrappers: tuple[bytes, ...] = (),
) -> list[int]:
    """Run one staging pass over ``rows`` (decoded changes, or a batch's Kafka messages cut with ``wrappers``);
    rows staged per writer of ``task``, in order."""
    try:
        if isinstance(rows, KafkaBatch):
            counts = rows.map_in_arrow(task, _COUNTS_SCHEMA, wrappers).collect()
        else:
            counts = rows.mapInArrow(task, _COUNTS_SCHEMA).collect()
    except Exception as error:  # Spark wraps executor failures; see executor_error
        raise job_error(error, f"staging batch {batch_id}", pipeline_file) from None
    raise_reported([row["report"] for row in counts if row["report"]], f"staging batch {batch_id}", pipeline_file)
    staged = [0] * len(task.writers)
    for row in counts:
        staged[row["sink"]] += row["rows"]
    return staged


def job_error(error: BaseException, doing: str, pipeline_file: str) -> CdcsyncError:
    """What a failed Spark job over the batch's Kafka rows stands for: the broker away (retriable), else what its
    tasks reported (:func:`~cdcsync.db.executor_errors.executor_error`)."""
    broker = broker_failure(error)
    if broker is not None:
        return broker.add_context(doing)
    return executor_error(error, doing, pipeline_file)


@dataclass(frozen=True)
class WithoutKeyMoves:
    """A writer that is not handed the key-move rows (:mod:`cdcsync.sinks.key_moves`): they are cdcsync's own
    bookkeeping for the sinks that keep a table by key, not changes to print, post or give to plugin code."""

    writer: ExecutorWriter

    def stage(self, table: pa.Table) -> int:
        return self.writer.stage(key_moves.split(table)[1])


def executor_sinks(sinks: dict[str, BatchSink]) -> dict[str, ExecutorSink]:
    """The sinks the executors write; a source with Delta sinks takes the graph path, which lands those itself."""
    executor = {sink_id: sink for sink_id, sink in sinks.items() if not isinstance(sink, DeltaTableSink)}
    assert len(executor) == len(sinks), "Delta sinks are landed by land_graph_batch"
    return executor


def writer_for(sink: ExecutorSink, batch_id: int, checkpoint_id: str) -> ExecutorWriter:
    """The executor side of ``sink`` for this batch, running the plugin transforms it reads first, if any."""
    writer: ExecutorWriter
    if isinstance(sink, PostgresUpsertSink):
        writer = sink.stage_writer(batch_id)
    else:
        writer = sink.stage_writer(batch_id, checkpoint_id)  # their insert tokens or idempotency keys name it
    chain = sink.pipeline.plan.plugin_chain(sink.sink.from_)
    keeps_key_moves = isinstance(sink, PostgresUpsertSink | ClickHouseTableSink) and not chain
    writer = with_chain(writer, chain)
    return writer if keeps_key_moves else WithoutKeyMoves(writer)


def merge_all(
    pending: dict[str, ExecutorSink],
    keys: dict[str, dict[str, Any]],
    staged: dict[str, int],
    *,
    shared_stage: bool = False,
) -> dict[str, SinkOutcome]:
    """Each sink's driver-side merge and ledger row, in its own transaction. ``shared_stage``: another batch may
    be staging into the same stages meanwhile, so a merge empties its stage of its own batch's rows only."""
    outcome: dict[str, SinkOutcome] = {}
    for sink_id, sink in pending.items():
        # ClickHouse: the executors inserted the rows, the merge records the batch; Postgres: the merge checks that
        # the stage holds what the tasks staged, then merges it.
        started = time.monotonic()
        if isinstance(sink, PostgresUpsertSink):
            merged = sink.merge(keys[sink_id], staged[sink_id], shared_stage=shared_stage)
        else:
            merged = sink.merge(keys[sink_id], staged[sink_id])
        outcome[sink_id] = SinkOutcome(
            skipped=merged is None,
            rows_staged=staged[sink_id],
            rows_merged=merged or 0,
            merge_seconds=time.monotonic() - started,
        )
    return outcome


@dataclass
class StagedBatch:
    """A micro-batch staged into every sink still to land it, their merges still to run (:func:`stage_batch`)."""

    batch_id: int
    written: dict[str, ExecutorSink]
    """The sinks the batch was staged into, whose merges are to run."""
    keys: dict[str, dict[str, Any]]
    staged: dict[str, int]
    """Rows the tasks staged, per sink of ``written``."""
    skipped: dict[str, SinkOutcome]
    """The sinks that had landed the batch before (the ledger)."""
    staging_seconds: float = 0.0

    def merge(self, *, shared_stage: bool = False) -> dict[str, SinkOutcome]:
        """Merge every staged sink (:func:`merge_all`); the outcome of every sink of the batch."""
        if not self.written:
            return dict(self.skipped)
        started = time.monotonic()
        outcome = {**self.skipped, **merge_all(self.written, self.keys, self.staged, shared_stage=shared_stage)}
        log.info(
            "batch %d: decoded and staged in %.2fs, merged %s in %.2fs",
            self.batch_id,
            self.staging_seconds,
            {sink_id: o.rows_merged for sink_id, o in outcome.items()},
            time.monotonic() - started,
        )
        return outcome


def stage_batch(
    messages: KafkaBatch,
    batch_id: int,
    checkpoint_id: str,
    decode: DecodeTask | TopicDecoders,
    sinks: dict[str, BatchSink],
    pipeline_file: str = "PIPELINE.yaml",
    offsets: OffsetRanges | None = None,
    keep: tuple[int, ...] = (),
) -> StagedBatch:
    """Look one micro-batch of Kafka messages up in each sink's ledger and stage it into those still to land it.

    ``TopicDecoders``: the rows of a ``topic_pattern`` source, each topic landing in its own table's sinks.
    ``offsets``: the ranges the batch reads, from the checkpoint, recorded with each ledger row. ``keep``: batches
    whose staged rows stay in the stages (their merges are still to run)."""
    keys, pending, skipped = pending_sinks(sinks, batch_id, checkpoint_id, offsets, keep)
    # (a pattern source without tables still reads its batch: a new topic stops the run)
    if not pending and (sinks or isinstance(decode, DecodeTask)):
        return StagedBatch(batch_id, {}, keys, {}, skipped)
    started = time.monotonic()
    written = executor_sinks(pending)
    writers = tuple(writer_for(sink, batch_id, checkpoint_id) for sink in written.values())
    task: StageTask | RoutedStageTask
    if isinstance(decode, TopicDecoders):
        topics = tuple(_routed_topic(sink) for sink in written.values())
        task = RoutedStageTask(decoders=decode, writers=writers, topics=topics)
    else:
        task = StageTask(decode=decode, writers=writers)
    staged = dict(zip(written, stage(messages, task, batch_id, pipeline_file, decode.wrappers), strict=True))
    return StagedBatch(batch_id, written, keys, staged, skipped, time.monotonic() - started)


def land_batch(
    messages: KafkaBatch,
    batch_id: int,
    checkpoint_id: str,
    decode: DecodeTask | TopicDecoders,
    sinks: dict[str, BatchSink],
    pipeline_file: str = "PIPELINE.yaml",
    offsets: OffsetRanges | None = None,
    keep: tuple[int, ...] = (),
) -> dict[str, SinkOutcome]:
    """Land one micro-batch of Kafka messages in every sink (see the module doc): :func:`stage_batch`, then the
    merges."""
    staged = stage_batch(messages, batch_id, checkpoint_id, decode, sinks, pipeline_file, offsets, keep)
    return staged.merge(shared_stage=bool(keep))


def _routed_topic(sink: ExecutorSink) -> str:
    """The topic whose table a sink of a ``topic_pattern`` source lands."""
    routed = sink.sink
    assert isinstance(routed, RoutedPostgresSink | RoutedClickHouseSink), "sinks of a topic_pattern are routed"
    return routed.topic


def land_rows(
    rows: DataFrame,
    batch_id: int,
    checkpoint_id: str,
    sinks: dict[str, BatchSink],
    pipeline_file: str = "PIPELINE.yaml",
) -> dict[str, SinkOutcome]:
    """Land a micro-batch whose rows need no decoding (a plugin source's: business and ``_cdc_*`` columns) in
    every sink: ledger lookups, one staging pass, a ledgered merge per sink."""
    keys, pending, outcome = pending_sinks(sinks, batch_id, checkpoint_id, None)
    if not pending:
        return outcome
    written = executor_sinks(pending)
    task = StageRowsTask(tuple(writer_for(sink, batch_id, checkpoint_id) for sink in written.values()))
    staged = dict(zip(written, stage(rows, task, batch_id, pipeline_file), strict=True))
    outcome.update(merge_all(written, keys, staged))
    return outcome
