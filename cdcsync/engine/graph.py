"""A micro-batch that flows through SQL transforms and dynamic tables before it reaches its sinks.

A source without transforms keeps the single pass of :mod:`cdcsync.engine.batch`. With transforms, Spark SQL
has to see the decoded changes, so a batch takes these steps (the views are the plan's contract,
:mod:`cdcsync.config.plan`):

1. Ledger lookups, as for any batch: sinks that landed this batch before are skipped.
2. Decode once, on the executors, into a cached DataFrame. Dead letters are written by the decoding tasks
   (idempotently, so a recomputed partition records nothing twice); under ``on_decode_error: fail`` a task
   reports the message as a row and the driver raises. A bounded source's chunk needs no decoding: it is read
   once into the cache instead (:func:`land_graph_rows`), so a chunk goes through the same steps as a Kafka batch.
   When one staging pass is all that reads the batch (:func:`_one_pass`), nothing is cached: that pass decodes,
   transforms and stages, and the decoding tasks report their ends (a failure, or the partition decoded to its
   end) through an accumulator, which the driver checks before anything merges (:class:`_DecodedInPass`).
3. Register the views, lazily: the source; each checked dynamic table's keys as they were before this batch
   (reloaded only when the table changed); each side output's keys of this batch; each transform, in order.
4. Side outputs land their keys in Postgres (ledgered); then each node that feeds sinks is staged in one pass
   into all of its sinks; then each sink merges in its own ledgered transaction.
5. In-memory dynamic tables take this batch's keys only now, after everything landed, so that a retried batch
   never sees its own keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.config.plan import (
    SideOutput,
    TransformStep,
    batch_keys_view,
    input_view,
    key_check_function,
    prior_keys_view,
)
from cdcsync.core.errors import CdcsyncError
from cdcsync.core.reports import ReportedFailure
from cdcsync.core.worker_heap import freeze_long_lived
from cdcsync.db.ledger import OffsetRanges
from cdcsync.engine.batch import (
    BatchSink,
    ExecutorSink,
    SinkOutcome,
    StagedBatch,
    StageRowsTask,
    executor_sinks,
    job_error,
    merge_all,
    pending_sinks,
    raise_reported,
    stage,
    writer_for,
)
from cdcsync.sinks.delta import DeltaTableSink
from cdcsync.sinks.kafka import KafkaTableSink
from cdcsync.sinks.postgres import PostgresUpsertSink
from cdcsync.sources.debezium.dispatch import output_spark_schema
from cdcsync.sources.debezium.spec import output_arrow_schema
from cdcsync.sources.kafka import DecodeTask
from cdcsync.sources.kafka_fetch import KafkaBatch
from cdcsync.transforms.dynamic_tables import DynamicTable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import Accumulator
    from pyspark.sql import DataFrame, SparkSession

    from cdcsync.config.pipeline import Pipeline

log = logging.getLogger(__name__)

_FAILURE = "_cdc_failure"
"""Null on change rows; a failed decode is one row of its own with this column set (an encoded report)."""


@dataclass(frozen=True)
class SourceGraph:
    """What one source's micro-batches feed besides sinks: its transforms, side outputs and checked tables."""

    source_id: str
    steps: tuple[TransformStep, ...]
    fills: dict[str, SideOutput]
    tables: dict[str, DynamicTable]
    """Every dynamic table this source's steps check or its side outputs fill."""
    sink_inputs: dict[str, str]
    """Sink id -> the node (this source or one of its transforms) it reads."""

    @classmethod
    def of(
        cls, pipeline: Pipeline, source_id: str, sink_inputs: dict[str, str], dsn: str, *, frames: bool = False
    ) -> SourceGraph | None:
        """The graph of ``source_id``; None when its batches need no transform (the single-pass path).

        ``frames``: a sink reads the batch as a DataFrame (a Delta sink), so the batch is decoded into one even
        without transforms."""
        plan = pipeline.plan
        nodes = {node for node, source in plan.source_of_node.items() if source == source_id} | {source_id}
        steps = tuple(step for step in plan.steps if step.id in nodes)
        fills = {
            table_id: spec.fill
            for table_id, spec in plan.dynamic_tables.items()
            if spec.fill is not None and spec.fill.input in nodes
        }
        if not steps and not fills and not frames:
            return None
        used = {table_id for step in steps for table_id in step.dynamic_tables} | fills.keys()
        tables = {t: DynamicTable(pipeline, plan.dynamic_tables[t], dsn) for t in sorted(used)}
        return cls(source_id, steps, fills, tables, sink_inputs)


@dataclass(frozen=True)
class DecodeRowsTask:
    """Executor side: decode one partition into change rows, a decode failure as a row of its own (picklable)."""

    decode: DecodeTask
    schema: pa.Schema
    """The decoder's change schema plus ``_cdc_failure``."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        freeze_long_lived()
        try:
            for batch in self.decode(batches):
                yield batch.append_column(_FAILURE, pa.nulls(batch.num_rows, pa.string()))
        except ReportedFailure as failure:
            # As in StageTask: a failure travels as data, so no Python worker is killed mid-task.
            row = {name: [None] for name in self.schema.names} | {_FAILURE: [failure.report.encode()]}
            yield pa.RecordBatch.from_pydict(row, schema=self.schema)


_Ends = tuple[tuple[int, str | None], ...]
"""How the decoding tasks of a batch ended: ``(partition, encoded report or None)`` each, None when the partition
was decoded to its end."""


class PartitionEnds:
    """Accumulator parameter (duck-typed, so this module needs no PySpark import) of :data:`_Ends`."""

    def zero(self, value: _Ends) -> _Ends:
        return ()

    def addInPlace(self, value: _Ends, other: _Ends) -> _Ends:
        return value + other


@dataclass(frozen=True)
class DecodeInPassTask:
    """Executor side of the single pass: decode one partition into change rows for the transforms and the staging
    task of the same job; how it ended goes to the driver through ``ends``, not as a row, since a transform's
    projection could drop a row (picklable)."""

    decode: DecodeTask
    ends: Accumulator[_Ends]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        freeze_long_lived()
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else -1
        try:
            yield from self.decode(batches)
        except ReportedFailure as failure:
            self.ends.add(((partition, failure.report.encode()),))
            return
        self.ends.add(((partition, None),))


def _decoded_rows(messages: KafkaBatch, decode: DecodeTask) -> DataFrame:
    """The batch's changes, decoded lazily, a decode failure as a row of its own (:class:`DecodeRowsTask`)."""
    import pyarrow as pa

    schema = output_arrow_schema(decode.spec, dead_letters=False).append(pa.field(_FAILURE, pa.string()))
    ddl = f"{output_spark_schema(decode.spec, dead_letters=False)}, {_FAILURE} string"
    return messages.map_in_arrow(DecodeRowsTask(decode, schema), ddl, decode.wrappers)


def _check_decoded(decoded: DataFrame, batch_id: int, pipeline_file: str) -> None:
    """Scan every partition of ``decoded`` (:func:`_decoded_rows`); raise what a decoding task reported."""
    from pyspark.sql import functions as F

    try:
        failures = decoded.where(F.col(_FAILURE).isNotNull()).select(_FAILURE).collect()
    except Exception as error:  # Spark wraps executor failures; see job_error
        raise job_error(error, f"decoding batch {batch_id}", pipeline_file) from None
    raise_reported([row[0] for row in failures], f"decoding batch {batch_id}", pipeline_file)


@dataclass
class _Cached:
    """The batch's changes in Spark's cache, checked before any step reads them: what several passes read."""

    cached: DataFrame
    changes: DataFrame

    def check(self, *, staging_failed: bool = False) -> None:
        """Nothing left to check: the batch was checked when it was cached."""

    def release(self) -> None:
        self.cached.unpersist()


def _decode(messages: KafkaBatch, decode: DecodeTask, batch_id: int, pipeline_file: str) -> _Cached:
    """The batch's changes, decoded once and cached; the caller releases them."""
    from pyspark import StorageLevel

    decoded = _decoded_rows(messages, decode).persist(StorageLevel.MEMORY_AND_DISK_DESER)
    try:
        _check_decoded(decoded, batch_id, pipeline_file)  # also fills the cache that the later steps read
    except BaseException:
        decoded.unpersist()
        raise
    return _Cached(decoded, decoded.drop(_FAILURE))


@dataclass
class _DecodedInPass:
    """The batch's changes decoded by the staging pass itself (:class:`DecodeInPassTask`); :meth:`check` stops the
    batch, after that pass and before any merge, as the cached path does before it stages.

    Staging writes only the sinks' staging tables (:func:`_one_pass`), and the driver merges after the check, so a
    decode failure leaves nothing merged: the same report, raised one pass later. A transform yields one row per
    change, so the pass reads every partition to its end; should a plan ever skip one, the check decodes the
    batch again on its own (dead letters are written idempotently) rather than merge what it cannot vouch for."""

    messages: KafkaBatch
    decode: DecodeTask
    batch_id: int
    pipeline_file: str
    changes: DataFrame
    ends: Accumulator[_Ends]

    @classmethod
    def of(cls, messages: KafkaBatch, decode: DecodeTask, batch_id: int, pipeline_file: str) -> _DecodedInPass:
        nothing: _Ends = ()
        ends = messages.raw.sparkSession.sparkContext.accumulator(nothing, PartitionEnds())  # type: ignore[arg-type]
        changes = messages.map_in_arrow(
            DecodeInPassTask(decode, ends), output_spark_schema(decode.spec, dead_letters=False), decode.wrappers
        )
        return cls(messages, decode, batch_id, pipeline_file, changes, ends)

    def check(self, *, staging_failed: bool = False) -> None:
        """Raise what a decoding task reported. After a failed staging pass only that: its error follows."""
        doing = f"decoding batch {self.batch_id}"
        ends = self.ends.value
        raise_reported([report for _, report in ends if report is not None], doing, self.pipeline_file)
        if staging_failed:
            return
        missing = set(range(self.messages.num_partitions())) - {partition for partition, _ in ends}
        if missing:
            log.info("batch %d: %d partition(s) not decoded to their end; decoding again", self.batch_id, len(missing))
            _check_decoded(_decoded_rows(self.messages, self.decode), self.batch_id, self.pipeline_file)

    def release(self) -> None:
        """Nothing cached."""


def _one_pass(graph: SourceGraph, pending: dict[str, BatchSink]) -> bool:
    """Whether one staging pass is all that reads the batch, and it writes only staging tables: Postgres sinks
    (no plugin transforms, whose code would see a batch that then fails) that all read one node, and no side
    outputs. Then the batch need not be cached (:class:`_DecodedInPass`)."""
    if graph.fills or not pending:
        return False
    nodes = {graph.sink_inputs[sink_id] for sink_id in pending}
    return len(nodes) == 1 and all(
        isinstance(sink, PostgresUpsertSink) and not sink.pipeline.plan.plugin_chain(sink.sink.from_)
        for sink in pending.values()
    )


def _register_views(
    spark: SparkSession, graph: SourceGraph, changes: DataFrame, checkpoint_id: str, batch_id: int
) -> None:
    from pyspark.sql import functions as F

    changes.createOrReplaceTempView(input_view(graph.source_id))
    for table_id, table in graph.tables.items():
        if table.spec.checked_by_function:
            spark.udf.register(key_check_function(table_id), table.key_check(spark, checkpoint_id, batch_id))
        else:
            keys = F.broadcast(table.prior_keys(spark, checkpoint_id, batch_id))
            keys.createOrReplaceTempView(prior_keys_view(table_id))
    # Each view is analysed when registered, so what it reads must be registered first.
    ready = {graph.source_id}
    fills, steps = dict(graph.fills), list(graph.steps)
    while fills or steps:
        progressed = False
        for table_id, fill in list(fills.items()):
            if fill.input in ready:
                side = spark.sql(fill.spark_sql).groupBy("key").agg(F.min("pos").alias("pos"))
                side.createOrReplaceTempView(batch_keys_view(table_id))
                del fills[table_id]
                progressed = True
        for step in list(steps):
            if step.input in ready and not fills.keys() & set(step.dynamic_tables):
                spark.sql(step.spark_sql).createOrReplaceTempView(input_view(step.id))
                ready.add(step.id)
                steps.remove(step)
                progressed = True
        if not progressed:
            raise AssertionError(f"transform graph of source '{graph.source_id}' has a cycle; validation missed it")


def by_source_partition(rows: DataFrame) -> DataFrame:
    """``rows`` with each source partition's changes in one task, in offset order: a kafka sink's task keeps its
    progress per source partition (:mod:`cdcsync.sinks.kafka`), which a transform's shuffle could split."""
    return rows.repartition("_cdc_topic", "_cdc_partition").sortWithinPartitions(
        "_cdc_topic", "_cdc_partition", "_cdc_offset"
    )


def land_graph_batch(
    messages: KafkaBatch,
    batch_id: int,
    checkpoint_id: str,
    decode: DecodeTask,
    graph: SourceGraph,
    sinks: dict[str, BatchSink],
    pipeline_file: str = "PIPELINE.yaml",
    offsets: OffsetRanges | None = None,
    keep: tuple[int, ...] = (),
) -> dict[str, SinkOutcome]:
    """Land one micro-batch of Kafka rows through the source's transforms and dynamic tables; see the module doc.
    ``keep``: batches whose staged rows stay in the stages (:func:`~cdcsync.engine.batch.stage_batch`)."""
    decoded = _decoding(messages, batch_id, decode, graph, pipeline_file)
    return _land_through_graph(decoded, "decoded", batch_id, checkpoint_id, graph, sinks, pipeline_file, offsets, keep)


def stage_graph_batch(
    messages: KafkaBatch,
    batch_id: int,
    checkpoint_id: str,
    decode: DecodeTask,
    graph: SourceGraph,
    sinks: dict[str, BatchSink],
    pipeline_file: str = "PIPELINE.yaml",
    offsets: OffsetRanges | None = None,
    keep: tuple[int, ...] = (),
) -> StagedBatch:
    """Steps 1 to 4 of the module doc but the merges, which the :class:`~cdcsync.engine.batch.StagedBatch` runs:
    for a graph without side outputs (no dynamic table this batch fills, which the next batch's transforms would
    have to see merged) whose sinks the executors write (:mod:`cdcsync.runtime.overlap`)."""
    assert not graph.fills, "a side output's keys must land before the next batch's transforms read them"
    keys, pending, skipped = pending_sinks(sinks, batch_id, checkpoint_id, offsets, keep)
    if not pending:
        return StagedBatch(batch_id, {}, keys, {}, skipped)
    started = time.monotonic()
    changes = _decoding(messages, batch_id, decode, graph, pipeline_file)(pending)
    try:
        lake, written, staged = _stage_changes(changes, batch_id, checkpoint_id, graph, pending, offsets, pipeline_file)
    finally:
        changes.release()
    assert not lake, "Delta sinks are merged from the batch's DataFrame, on the batch's thread"
    return StagedBatch(batch_id, written, keys, staged, skipped, time.monotonic() - started)


def _decoding(
    messages: KafkaBatch, batch_id: int, decode: DecodeTask, graph: SourceGraph, pipeline_file: str
) -> Callable[[dict[str, BatchSink]], _Cached | _DecodedInPass]:
    """How a Kafka batch's changes are had for the sinks still to land it: decoded in the staging pass, or cached."""

    def decoded(pending: dict[str, BatchSink]) -> _Cached | _DecodedInPass:
        if _one_pass(graph, pending):
            return _DecodedInPass.of(messages, decode, batch_id, pipeline_file)
        return _decode(messages, decode, batch_id, pipeline_file)

    return decoded


def land_graph_rows(
    rows: DataFrame,
    batch_id: int,
    checkpoint_id: str,
    graph: SourceGraph,
    sinks: dict[str, BatchSink],
    pipeline_file: str = "PIPELINE.yaml",
) -> dict[str, SinkOutcome]:
    """Land a micro-batch whose rows need no decoding (a bounded source's chunk: business and ``_cdc_*`` columns,
    lazily read) through the source's transforms and dynamic tables, as :func:`land_graph_batch` lands a decoded
    Kafka batch. The rows are read once, into the cache, before anything lands: every view and sink then sees the
    same rows, however often it scans them, and a failed read stops the batch before any sink merged."""

    def read(pending: dict[str, BatchSink]) -> _Cached:
        from pyspark import StorageLevel

        cached = rows.persist(StorageLevel.MEMORY_AND_DISK_DESER)
        try:
            cached.count()
        except Exception as error:  # Spark wraps executor failures; see job_error
            cached.unpersist()
            raise job_error(error, f"reading batch {batch_id}", pipeline_file) from None
        return _Cached(cached, cached)

    return _land_through_graph(read, "read", batch_id, checkpoint_id, graph, sinks, pipeline_file, None)


def _land_through_graph(
    changes_of: Callable[[dict[str, BatchSink]], _Cached | _DecodedInPass],
    how: str,
    batch_id: int,
    checkpoint_id: str,
    graph: SourceGraph,
    sinks: dict[str, BatchSink],
    pipeline_file: str,
    offsets: OffsetRanges | None,
    keep: tuple[int, ...] = (),
) -> dict[str, SinkOutcome]:
    """The ledger lookups, then ``changes_of(pending sinks)`` (only when a sink or side output still needs the
    batch, so a batch every sink holds is not read), the steps after it, the release of its cache."""
    keys, pending, outcome = pending_sinks(sinks, batch_id, checkpoint_id, offsets, keep)
    if not pending and not graph.fills:
        return outcome
    started = time.monotonic()
    changes = changes_of(pending)
    try:
        staged_at = _land_changes(
            changes, batch_id, checkpoint_id, graph, keys, pending, outcome, offsets, pipeline_file, bool(keep)
        )
    finally:
        changes.release()
    log.info(
        "batch %d: %s%s, transformed and staged in %.2fs, merged %s in %.2fs",
        batch_id,
        how,
        " in the staging pass" if isinstance(changes, _DecodedInPass) else "",
        staged_at - started,
        {sink_id: o.rows_merged for sink_id, o in outcome.items()},
        time.monotonic() - staged_at,
    )
    return outcome


def _land_changes(
    batch: _Cached | _DecodedInPass,
    batch_id: int,
    checkpoint_id: str,
    graph: SourceGraph,
    keys: dict[str, dict[str, Any]],
    pending: dict[str, BatchSink],
    outcome: dict[str, SinkOutcome],
    offsets: OffsetRanges | None,
    pipeline_file: str,
    shared_stage: bool = False,
) -> float:
    """Steps 3 to 5 of the module doc over the batch's change rows; fills ``outcome`` and returns when the staging
    ended."""
    lake, written, staged = _stage_changes(batch, batch_id, checkpoint_id, graph, pending, offsets, pipeline_file)
    staged_at = time.monotonic()
    outcome.update(merge_all(written, keys, staged, shared_stage=shared_stage))
    spark = batch.changes.sparkSession
    for sink_id, sink in lake.items():  # Spark writes these: one MERGE each, on the driver
        merged = sink.merge_changes(keys[sink_id], spark.table(input_view(graph.sink_inputs[sink_id])))
        outcome[sink_id] = SinkOutcome(skipped=merged is None, rows_merged=merged or 0)
    for table_id, table in graph.tables.items():
        if table_id in graph.fills and table.in_memory:
            table.write(spark.table(batch_keys_view(table_id)), checkpoint_id, batch_id)
    return staged_at


def _stage_changes(
    batch: _Cached | _DecodedInPass,
    batch_id: int,
    checkpoint_id: str,
    graph: SourceGraph,
    pending: dict[str, BatchSink],
    offsets: OffsetRanges | None,
    pipeline_file: str,
) -> tuple[dict[str, DeltaTableSink], dict[str, ExecutorSink], dict[str, int]]:
    """Steps 3 and 4 up to the merges: the views, the side outputs' keys in Postgres, each node staged into its
    sinks. The Delta sinks (merged from the views later), the staged sinks and the rows each staged."""
    spark = batch.changes.sparkSession  # the query's own session: its temp views are invisible to other queries
    _register_views(spark, graph, batch.changes, checkpoint_id, batch_id)
    for table_id, table in graph.tables.items():
        if table_id in graph.fills and not table.in_memory:
            table.write(spark.table(batch_keys_view(table_id)), checkpoint_id, batch_id, offsets)
    staged: dict[str, int] = {}
    by_node: dict[str, list[str]] = {}
    lake = {s: sink for s, sink in pending.items() if isinstance(sink, DeltaTableSink)}
    written = executor_sinks({s: sink for s, sink in pending.items() if s not in lake})
    for sink_id in written:
        by_node.setdefault(graph.sink_inputs[sink_id], []).append(sink_id)
    try:
        for node, sink_ids in by_node.items():
            task = StageRowsTask(tuple(writer_for(written[s], batch_id, checkpoint_id) for s in sink_ids))
            rows = spark.table(input_view(node))
            if any(isinstance(written[s], KafkaTableSink) for s in sink_ids):
                rows = by_source_partition(rows)
            staged.update(zip(sink_ids, stage(rows, task, batch_id, pipeline_file), strict=True))
    except CdcsyncError:
        batch.check(staging_failed=True)  # a decode failure is the user's to fix first, as on the cached path
        raise
    batch.check()
    return lake, written, staged
