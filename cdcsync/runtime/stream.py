"""The streaming query lifecycle: one Structured Streaming query per source, a ledgered micro-batch handler,
clean stops on SIGINT/SIGTERM; the numbers the live view shows are folded in :mod:`cdcsync.runtime.progress`.

Each micro-batch (``BatchHandler``):

decodes the Kafka rows on the executors (:class:`cdcsync.sources.kafka.DecodeTask`), whose tasks also send
undecodable messages to ``cdcsync.dead_letters`` (or fail, under ``on_decode_error: fail``), and lands the
changes in every sink fed by the source, each exactly once through its ledger (:mod:`cdcsync.engine.batch`).

Transient failures (see :mod:`cdcsync.db.retry`) are retried with backoff inside the batch; anything else
fails the query, and because the batch was not committed to the checkpoint it is replayed on the next run, where
the ledgers skip what already landed.

Before any query starts, :meth:`PipelineRunner.check_ledger` compares each source's checkpoint with the ledger
and refuses a checkpoint that is past what a sink holds (:mod:`cdcsync.runtime.checkpoint`); every batch's ledger
rows record the offset ranges it read.

One runner per pipeline: :meth:`PipelineRunner.locked` holds the pipeline's lock (:mod:`cdcsync.runtime.lock`)
from before Spark starts until the queries have stopped; every attempt of a batch checks it before it stages
anything, and every merge transaction passes the lock's fence (:mod:`cdcsync.db.fence`), so a run whose lock
was taken over merges nothing more.

Stopping: a signal sets a flag. A batch in flight finishes; a batch that has not started refuses to start
(raising :class:`StopRequested`, which leaves it uncommitted for the next run), then the queries are stopped.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from cdcsync.config.pipeline import KafkaSource, Pipeline, SourceSchema
from cdcsync.config.routing import evolved_lookup, table_source_id
from cdcsync.config.settings import Settings
from cdcsync.core.errors import CdcsyncError, NewTopicError, SchemaChangeError, ServiceError
from cdcsync.db.dead_letters import DeadLetterWriter
from cdcsync.db.fence import MergeFence
from cdcsync.db.ledger import fence_all
from cdcsync.db.retry import RetryBudget, with_retries
from cdcsync.engine.batch import BatchSink, SinkOutcome, land_batch, stage_batch
from cdcsync.engine.graph import land_graph_batch, stage_graph_batch
from cdcsync.runtime.checkpoint import batch_offsets, check_ledger, checkpoint_id, rewind_unmerged
from cdcsync.runtime.lock import PipelineLock
from cdcsync.runtime.metrics import Health
from cdcsync.runtime.overlap import OverlappedMerges
from cdcsync.runtime.progress import RunSnapshot, SinkStats, SourceStats, new_progress, record_progress
from cdcsync.runtime.wiring import (
    build_graph,
    build_sinks,
    check_delta_tables,
    decode_specs,
    retry_budget,
    source_decoder,
)
from cdcsync.sinks.clickhouse import track_positions
from cdcsync.sinks.postgres import PostgresUpsertSink
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess
from cdcsync.sources.kafka import (
    BrokerUnavailable,
    DecodeTask,
    KnownWrappers,
    TopicDecoders,
    WrapperSet,
    query_broker_failure,
    source_brokers,
    spark_kafka_options,
)
from cdcsync.sources.kafka_fetch import KafkaBatch, source_fetch

if TYPE_CHECKING:
    from pyspark import Accumulator, SparkContext
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from cdcsync.db.ledger import OffsetRanges

log = logging.getLogger(__name__)
T = TypeVar("T")

_POLL_SECONDS = 0.5
_STALLED_S = 30.0
"""``/healthz`` fails when the supervising loop has not gone round for this long."""
_MAX_EVOLUTIONS_PER_BATCH = 20
"""Schema changes one batch may go through under ``schema_evolution: auto`` (each adds columns)."""
_EVOLVE_LOCK = threading.Lock()
"""Sources evolving at once write numbered migration files one after the other."""


class StopRequested(Exception):
    """Raised at the start of a batch after a stop was requested: the batch stays uncommitted and replays later."""


class BatchHandler:
    """``foreachBatch`` function of one source's query; runs on the driver, one batch at a time."""

    def __init__(
        self,
        pipeline: Pipeline,
        source_id: str,
        source: KafkaSource,
        sinks: dict[str, BatchSink],
        dsn: str,
        checkpoint_dir: Path,
        spark_context: SparkContext,
        schema_registry: SchemaRegistryAccess | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.source_id = source_id
        self.source = source
        self.sinks = sinks
        self.checkpoint_dir = checkpoint_dir
        self.schema_registry = schema_registry
        self.settings = settings
        """Needed by ``schema_evolution: auto`` (migrations directory, connections)."""
        self.specs = decode_specs(pipeline, source_id, schema_registry)
        """By source id: the source's own, or one per table of a ``topic_pattern`` source."""
        self.graph = build_graph(pipeline, source_id, dsn)
        """The source's transforms and dynamic tables; None when its sinks read the source directly."""
        self.dead_letter_writer = DeadLetterWriter(dsn=dsn, pipeline=pipeline.name, source_id=source_id)
        self.wrappers = KnownWrappers()
        self.fetch = source_fetch(pipeline.name, source, settings)
        """How the tasks read the batches themselves; None when Spark's Kafka reader does."""
        self.spark_context = spark_context
        self._init_run_state()

    def _init_run_state(self) -> None:
        """What every query's handler keeps while it runs: its figures, its failure, the stop protocol's state."""
        self.stats = SourceStats()
        self.sink_stats = {sink_id: SinkStats() for sink_id in self.sinks}
        self.failure: CdcsyncError | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._in_batch = False
        self._idle = threading.Condition(self._lock)
        self._checkpoint_id: str | None = None
        self.lock_guard: Callable[[], None] | None = None
        """Called before each attempt of a batch: raises when the run no longer holds the pipeline's lock."""
        self.fence: MergeFence | None = None
        """The lock's fence, which every merge transaction of this source's sinks passes (:meth:`fence_sinks`)."""
        self._record_lock = threading.Lock()
        self.merges = OverlappedMerges(self.record)
        """Batches whose merges run on while the next one stages (:mod:`cdcsync.runtime.overlap`)."""

    # -- stop protocol -------------------------------------------------------------------------------------
    def request_stop(self, timeout: float | None = None) -> None:
        """Refuse new batches and wait for the one in flight, if any."""
        with self._idle:
            self._stopping = True
            self._idle.wait_for(lambda: not self._in_batch, timeout=timeout)

    # -- the batch -----------------------------------------------------------------------------------------
    def __call__(self, changes: DataFrame, batch_id: int) -> None:
        with self._lock:
            if self._stopping:
                raise StopRequested()
            self._in_batch = True
        try:
            self._process(changes, batch_id)
        except CdcsyncError as error:
            self.failure = error.add_context(f"source '{self.source_id}', batch {batch_id}")
            raise
        finally:
            with self._idle:
                self._in_batch = False
                self._idle.notify_all()

    @property
    def checkpoint_id(self) -> str:
        """The query id Spark keeps in the checkpoint: stable across restarts, new when the checkpoint is reset.

        Ledger rows are keyed by it, so a reset checkpoint (batch ids start again at 0) never matches the ledger
        rows of the old one; the reprocessed changes are then idempotent by ``_cdc_version``.
        """
        if self._checkpoint_id is None:
            self._checkpoint_id = checkpoint_id(self.checkpoint_dir)
            assert self._checkpoint_id is not None, "Spark writes the metadata before the first batch"
        return self._checkpoint_id

    def _decoder(
        self, dead_letters: Accumulator[int], wrappers: tuple[bytes, ...], met: Accumulator[set[bytes]] | None
    ) -> DecodeTask | TopicDecoders:
        """What decodes this source's rows on the executors: a :class:`DecodeTask`, or one per table (by topic)."""
        writer = None if self.source.on_decode_error == "fail" else self.dead_letter_writer
        return source_decoder(self.pipeline, self.source_id, self.specs, writer, dead_letters, wrappers, met)

    def _land(
        self, messages: KafkaBatch, batch_id: int, decode: DecodeTask | TopicDecoders, offsets: OffsetRanges | None
    ) -> dict[str, SinkOutcome] | None:
        """Land the batch in every sink, with retries; None when its merges run on while the next batch stages
        (they record the batch when done)."""

        def retried(plain: Callable[..., T], through_graph: Callable[..., T], keep: tuple[int, ...] = ()) -> T:
            attempt = self._on_batch(plain, through_graph, messages, batch_id, decode, offsets, keep)
            return self._retried(attempt, batch_id)

        if not self._overlaps(messages):
            self.merges.settle()  # (a source overlaps all its batches or none, unless schema_evolution changed it)
            return retried(land_batch, land_graph_batch)
        return self.merges.land(
            lambda keep: retried(stage_batch, stage_graph_batch, keep),
            lambda keep: retried(land_batch, land_graph_batch, keep),  # a merge that failed: landed again
            self.checkpoint_dir,
        )

    def _overlaps(self, messages: KafkaBatch) -> bool:
        """Whether the batch's merges may run on while the next batch stages (:mod:`cdcsync.runtime.overlap`): the
        tasks read Kafka by offset ranges (so the batch can be read again), every sink is a Postgres upsert sink
        (whose stages tell batches apart), and no dynamic table is filled from the source (the next batch's
        transforms would read it before this batch's keys landed)."""
        overlap = self.settings is not None and self.settings.run.overlap_merges
        postgres_only = bool(self.sinks) and all(isinstance(sink, PostgresUpsertSink) for sink in self.sinks.values())
        no_fills = self.graph is None or not self.graph.fills
        return overlap and no_fills and messages.fetch is not None and postgres_only

    def _on_batch(
        self,
        plain: Callable[..., T],
        through_graph: Callable[..., T],
        messages: KafkaBatch,
        batch_id: int,
        decode: DecodeTask | TopicDecoders,
        offsets: OffsetRanges | None,
        keep: tuple[int, ...],
    ) -> Callable[[], T]:
        """One attempt's work on the batch, ``plain`` or, for a source with a graph, ``through_graph`` (landing
        it, or staging it with its merges left to run)."""
        if self.graph is None:
            return functools.partial(
                plain, messages, batch_id, self.checkpoint_id, decode, self.sinks, self._file, offsets, keep
            )
        assert isinstance(decode, DecodeTask), "sources with transforms read one topic"
        return functools.partial(
            through_graph,
            messages,
            batch_id,
            self.checkpoint_id,
            decode,
            self.graph,
            self.sinks,
            self._file,
            offsets,
            keep,
        )

    @property
    def _file(self) -> str:
        """The pipeline's file, as errors name it."""
        return str(self.pipeline.path) if self.pipeline.path else "PIPELINE.yaml"

    def finish(self) -> None:
        """After the query stopped: the last batch's merges done (a failure becomes the handler's)."""
        try:
            self.merges.settle()
        except CdcsyncError as error:
            if self.failure is None:
                self.failure = error.add_context(f"source '{self.source_id}'")

    def _retried(self, land: Callable[[], T], batch_id: int) -> T:
        describe = f"source '{self.source_id}' batch {batch_id}"
        return with_retries(
            functools.partial(self._attempt, land), describe=describe, budget=self.retry_budget, on_wait=self._waiting
        )

    def _attempt(self, land: Callable[[], T]) -> T:
        """One attempt of the batch, after the lock check: a retry after Postgres came back takes the lock again
        (its session ended with the server) before it stages."""
        if self.lock_guard is not None:
            self.lock_guard()
        try:
            return land()
        except BrokerUnavailable as away:
            raise away.naming(source_brokers(self.pipeline.name, self.source, self.settings)) from None

    def fence_sinks(self, fence: MergeFence | None) -> None:
        """Make every merge of this source pass ``fence`` (again after ``schema_evolution: auto`` rebuilt its sinks),
        and let its ClickHouse sinks collect their tasks' source positions."""
        self.fence = fence
        fence_all(fence, [*self.sinks.values(), *(self.graph.tables.values() if self.graph else ())])
        track_positions(self.sinks.values(), self.spark_context)

    @property
    def retry_budget(self) -> RetryBudget:
        return retry_budget(self.settings)

    def _waiting(self, what: str | None) -> None:
        self.stats.waiting = what

    def _evolve(self, change: SchemaChangeError | NewTopicError, batch_id: int) -> None:
        """``schema_evolution: auto``: write the migration ``cdcsync init`` would write for the new columns, or
        for the new table of a ``topic_pattern`` source (so a later ``init`` writes nothing and the next ``run``
        finds nothing pending), apply it, and carry on with the pipeline as a restarted ``run`` would load it. The
        batch is then landed again, new columns (or table) and all."""
        assert self.settings is not None
        from cdcsync import migrations
        from cdcsync.config.load import load_pipeline

        if self.pipeline.path is None:
            raise change.add_context("schema_evolution: auto needs the pipeline's YAML file")
        migrations_dir = self.settings.migrations_dir
        changed_id, schema, what = self._evolved_schema(change)
        with _EVOLVE_LOCK:
            recorded = migrations.recorded_lookup(migrations_dir)
            wanted = load_pipeline(self.pipeline.path, evolved_lookup(recorded, changed_id, change.topic, schema))
            written = [
                path for target in migrations.TARGETS for path in migrations.init(target, wanted, migrations_dir)
            ]
            for target in migrations.TARGETS:
                if target.used_by(wanted):
                    with target.connect(self.settings) as connection:
                        migrations.apply_pending(target, connection, wanted.name, migrations_dir)
            # a fresh lookup: ``recorded`` cached the state before this migration
            self.pipeline = load_pipeline(self.pipeline.path, migrations.recorded_lookup(migrations_dir))
        self.source = self.pipeline.sources[self.source_id]
        before, self.specs = self.specs, decode_specs(self.pipeline, self.source_id, self.schema_registry)
        if changed_id not in self.specs or (
            changed_id in before and self.specs[changed_id].columns == before[changed_id].columns
        ):  # landing again would stop the same way
            raise change.add_context("schema_evolution: auto changed nothing")
        self.sinks = build_sinks(self.pipeline, self.source_id, self.settings)
        self.graph = build_graph(self.pipeline, self.source_id, self.settings.postgres_dsn)
        self.fence_sinks(self.fence)
        log.warning(
            "source '%s': schema_evolution auto: topic %s %s at partition %d, offset %d; wrote and applied %s; "
            "landing batch %d again",
            self.source_id,
            change.topic,
            what,
            change.partition,
            change.offset,
            ", ".join(str(path) for path in written) or "no migration (already written)",
            batch_id,
        )

    def _evolved_schema(self, change: SchemaChangeError | NewTopicError) -> tuple[str, SourceSchema, str]:
        """(source id, its schema from now on, what happened) for a change ``schema_evolution: auto`` handles."""
        from cdcsync.sources.introspect import introspect, merge

        if isinstance(change, NewTopicError):  # a new table: its schema, as init would read it
            assert self.settings is not None
            table = self.source.model_copy(update={"topic": change.topic, "topic_pattern": None})
            found = introspect(table, self.settings)
            if isinstance(found, str) or found.unmapped:
                why = found if isinstance(found, str) else f"column '{found.unmapped[0][0]}': {found.unmapped[0][1]}"
                raise change.add_context(f"schema_evolution: auto cannot read the new table's schema: {why}")
            return table_source_id(self.source_id, change.topic), found, "is a new source table"
        seen = SourceSchema(
            columns=tuple((name, type_text) for name, type_text, _ in change.fields if type_text is not None),
            origin=f"topic {change.topic} (partition {change.partition}, offset {change.offset})",
        )
        evolved = merge(self.pipeline.source_schemas.get(change.source_id), seen)
        return change.source_id, evolved, f"gained column(s) {', '.join(change.added)}"

    def record(self, outcome: dict[str, SinkOutcome], batch_id: int) -> None:
        """A landed batch in the figures the live view shows (from the batch's thread, or its merges')."""
        with self._record_lock:
            self._record(outcome, batch_id)

    def _record(self, outcome: dict[str, SinkOutcome], batch_id: int) -> None:
        for sink_id, result in outcome.items():
            stats = self.sink_stats.setdefault(sink_id, SinkStats())  # new: a table schema_evolution added
            stats.batches += 1
            stats.skipped_batches += int(result.skipped)
            stats.rows_in += result.rows_staged
            stats.rows_out += result.rows_merged
            if not result.skipped:
                stats.merge_durations.observe(result.merge_seconds)
        self.stats.batches += 1
        self.stats.last_batch_id = batch_id
        self.stats.last_batch_done_at = time.monotonic()

    def _process(self, raw: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        if self.stats.first_batch_at is None:
            self.stats.first_batch_at = started
        dead_letters = self.spark_context.accumulator(0)
        # A JSON source's schema wrappers cross into Python once, not with every message (sources.kafka).
        cut = self.source.format == "json"
        met: Accumulator[set[bytes]] | None = None
        if cut:
            met = self.spark_context.accumulator(set(), WrapperSet())  # type: ignore[arg-type]
        # What the batch reads, as Spark planned it (written before the batch runs): the ledger rows record it,
        # and the tasks read it themselves unless Spark's reader does (sources.kafka_fetch).
        offsets = batch_offsets(self.checkpoint_dir, batch_id)
        messages = KafkaBatch.of(raw, self.fetch, offsets)
        # The peek reads the checkpoint's ranges for this batch: only while it can still learn something.
        if cut and self.wrappers.wants_peek:
            self.wrappers.peeked_at(messages.first_wrappers(self.pipeline.name, self.source, self.settings))
        wrappers = self.wrappers.wrappers if cut else ()
        decode = self._decoder(dead_letters, wrappers, met)
        evolutions = 0
        while True:
            try:
                outcome = self._land(messages, batch_id, decode, offsets)
                break
            except (SchemaChangeError, NewTopicError) as change:
                self.merges.settle()  # the migration alters the tables they merge into
                evolutions += 1
                auto = self.source.schema_evolution == "auto" and self.settings is not None
                additive = isinstance(change, NewTopicError) or change.additive
                if not (auto and additive) or evolutions > _MAX_EVOLUTIONS_PER_BATCH:
                    raise
                self._evolve(change, batch_id)
                decode = self._decoder(dead_letters, wrappers, met)
        self.stats.dead_letters += int(dead_letters.value)
        self.stats.rows_in += messages.messages  # Spark's progress counts none of what the tasks read
        if met is not None:
            self.wrappers.learn(met.value)
        if outcome is not None:
            self.record(outcome, batch_id)
        took = time.monotonic() - started
        self.stats.durations.observe(took)
        if messages.fetch is not None:
            self.stats.rows_per_second = messages.messages / max(took, 1e-3)


class PipelineRunner:
    """Starts one query per source and supervises them until they finish, fail or are asked to stop."""

    def __init__(
        self, pipeline: Pipeline, settings: Settings, *, available_now: bool, wait_for_lock: bool = False
    ) -> None:
        self.pipeline = pipeline
        self.settings = settings
        self.available_now = available_now
        self.wait_for_lock = wait_for_lock
        """When another run holds the pipeline's lock: wait for it (``run --wait``) instead of refusing."""
        self.lock: PipelineLock | None = None
        self.handlers: dict[str, BatchHandler] = {}
        self.queries: dict[str, StreamingQuery] = {}
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._ledger_checked = False
        self._heartbeat: float | None = None
        """When the supervising loop last went round (None before the queries start)."""
        self._stop_deadline: threading.Timer | None = None

    def install_signal_handlers(self) -> None:
        """SIGINT and SIGTERM (a pod's shutdown) finish the batch in flight and stop; past
        ``run.stop_timeout_s`` (or at a second signal) the process exits 1 at once, leaving that batch
        uncommitted for the next run, so a shutdown is bounded even when a batch waits on a dependency."""

        def on_signal(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if self._stop.is_set():
                self._exit_now(f"received {name} again")
            timeout = self.settings.run.stop_timeout_s
            log.warning("received %s: finishing the current batch (at most %gs), then stopping", name, timeout)
            self._stop.set()
            self._stop_deadline = threading.Timer(
                timeout, self._exit_now, args=(f"the batch in flight did not finish within {timeout:g}s",)
            )
            self._stop_deadline.daemon = True
            self._stop_deadline.start()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    def _exit_now(self, why: str) -> None:
        """End the process without waiting for Spark: nothing uncommitted is lost (the checkpoint replays it, the
        ledgers skip what landed), and the pipeline's lock goes with the process's Postgres session."""
        log.error(
            "pipeline '%s': %s; exiting now without committing it (the next run replays it)", self.pipeline.name, why
        )
        for stream in (sys.stderr, sys.stdout):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)

    def health(self) -> Health:
        """What ``/healthz`` answers (:mod:`cdcsync.runtime.metrics`)."""
        now = time.monotonic()
        handlers = list(self.handlers.items())  # a scrape's thread: the main thread may be adding queries
        done = [h.stats.last_batch_done_at for _, h in handlers if h.stats.last_batch_done_at is not None]
        age = now - max(done) if done else None
        failed = [source_id for source_id, h in handlers if h.failure is not None]
        max_age = self.settings.metrics.max_batch_age_s
        if self._stop.is_set():
            return Health(False, "stopping", age)
        if failed:
            return Health(False, f"a batch of source '{failed[0]}' failed", age)
        if self._heartbeat is None:
            return Health(False, "starting", age)
        if not all(query.isActive for query in list(self.queries.values())):
            return Health(False, "a query has ended", age)
        if now - self._heartbeat > _STALLED_S:
            return Health(False, f"the supervising loop has not run for {now - self._heartbeat:.0f}s", age)
        if max_age is not None and (now - self._started if age is None else age) > max_age:
            return Health(False, f"no batch landed in the last {max_age:g}s (metrics.max_batch_age_s)", age)
        return Health(True, "streaming", age)

    def snapshot(self) -> RunSnapshot:
        """Also read by the metrics server's thread, so it copies the handlers first (queries may be starting)."""
        handlers = list(self.handlers.items())
        sinks: dict[str, SinkStats] = {}
        sink_targets: dict[str, str] = {}  # as each handler knows them now (schema_evolution: auto may add tables)
        sink_types: dict[str, str] = {}
        for _, handler in handlers:
            sinks.update(handler.sink_stats)
            for sid, sink in list(handler.sinks.items()):
                sink_targets[sid] = sink.target_name
                sink_types[sid] = sink.sink.type
        return RunSnapshot(
            pipeline=self.pipeline.name,
            sources={sid: h.stats for sid, h in handlers},
            sinks=sinks,
            sink_targets=sink_targets,
            elapsed=time.monotonic() - self._started,
            sink_types=sink_types,
        )

    @contextlib.contextmanager
    def locked(self) -> Iterator[PipelineLock]:
        """Hold the pipeline's lock (refused with exit 2, or waited for); a no-op when already held. The CLI
        takes it before starting Spark, so a second runner is turned away at once; :meth:`run` takes it anyway."""
        if self.lock is not None:
            yield self.lock
            return
        with PipelineLock(self.settings.postgres_dsn, self.pipeline.name) as lock:
            lock.acquire(wait=self.wait_for_lock, stop=self._stop)
            self.lock = lock
            try:
                yield lock
            finally:
                self.lock = None

    def check_ledger(self) -> None:
        """Refuse (exit 2) when a source's checkpoint has committed batches a sink's ledger lacks (the target went
        back in time, or the sink was added later): :mod:`cdcsync.runtime.checkpoint`. First, a batch the last run
        left committed before its merges ran (:mod:`cdcsync.runtime.overlap`) is made to run again. Once per run;
        the CLI calls it before Spark starts."""
        if self._ledger_checked:
            return
        import psycopg

        for source_id in self.pipeline.streams():
            again = rewind_unmerged(self.settings.checkpoint_dir(self.pipeline.name, source_id))
            if again is not None:
                log.warning(
                    "source '%s': the last run stopped before batch %d's merges were done; running it again from "
                    "the same offsets (sinks that merged it skip it)",
                    source_id,
                    again,
                )

        try:
            with psycopg.connect(self.settings.postgres_dsn, autocommit=True) as conn:
                check_ledger(conn, self.pipeline, self.settings)
        except psycopg.Error as error:
            raise ServiceError(
                f"pipeline '{self.pipeline.name}': reading the batch ledger: {str(error).strip()}", retriable=True
            ) from None
        self._ledger_checked = True

    def run(self, spark: SparkSession, on_progress: Callable[[RunSnapshot], None] | None = None) -> RunSnapshot:
        with self.locked():  # before anything touches a stage or the checkpoint
            self.check_ledger()
            from cdcsync.runtime.bounded import job_mode, run_bounded

            assert self.lock is not None
            finished = run_bounded(spark, self.pipeline, self.settings, self.lock, self._stop, self.handlers)
            streams = {} if not finished or job_mode(self.pipeline, self.settings) else self.pipeline.streams()
            for source_id, source in streams.items():
                self._start_query(spark, source_id, source)
            for plugin_source in self.pipeline.plan.plugin_sources.values() if finished else ():
                from cdcsync.runtime.plugin_sources import start_plugin_query

                handler, self.queries[plugin_source.id] = start_plugin_query(
                    spark, self.pipeline, plugin_source, self.settings, self.lock.ensure_held, self.available_now
                )
                fence_all(self.lock.fence, handler.sinks.values())
                self.handlers[plugin_source.id] = handler
            try:
                self._supervise(on_progress)
            finally:
                for query in self.queries.values():
                    if query.isActive:
                        query.stop()
                for source_handler in self.handlers.values():
                    source_handler.finish()  # the last batch's merges (overlapped ones run on after Spark's commit)
                if self._stop_deadline is not None:
                    self._stop_deadline.cancel()  # stopped in time
        self._raise_failures()
        return self.snapshot()

    def _start_query(self, spark: SparkSession, source_id: str, source: KafkaSource) -> None:
        checkpoint_dir = self.settings.checkpoint_dir(self.pipeline.name, source_id)
        checkpoint_dir.parent.mkdir(parents=True, exist_ok=True)
        sinks = build_sinks(self.pipeline, source_id, self.settings)
        check_delta_tables(spark, sinks)
        handler = BatchHandler(
            self.pipeline,
            source_id,
            source,
            sinks,
            self.settings.postgres_dsn,
            checkpoint_dir,
            spark.sparkContext,
            schema_registry=SchemaRegistryAccess.from_settings(self.settings),
            settings=self.settings,
        )
        assert self.lock is not None, "queries start only inside locked()"
        # Inside the batch's retries: an outage of Postgres is waited out (and reported) once, by the batch.
        handler.lock_guard = self.lock.ensure_held
        handler.fence_sinks(self.lock.fence)
        self.handlers[source_id] = handler

        reader = spark.readStream.format("kafka")
        for key, value in spark_kafka_options(self.pipeline.name, source, self.settings).items():
            reader = reader.option(key, value)
        writer = (
            reader.load()
            .writeStream.foreachBatch(handler)
            .option("checkpointLocation", str(checkpoint_dir))
            .queryName(f"{self.pipeline.name}.{source_id}")
        )
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=trigger_interval(self.settings))
        try:
            self.queries[source_id] = writer.start()
        except Exception as error:
            raise ServiceError(
                f"source '{source_id}': starting the Kafka stream from {self.settings.bootstrap_servers}: "
                f"{str(error).splitlines()[0][:300]}",
                retriable=True,
            ) from None

    def _supervise(self, on_progress: Callable[[RunSnapshot], None] | None) -> None:
        stopping = False
        while any(q.isActive for q in self.queries.values()):
            self._heartbeat = time.monotonic()
            self._refresh_progress()
            if on_progress is not None:
                on_progress(self.snapshot())
            if any(h.failure for h in self.handlers.values()):
                break
            if self._stop.is_set() and not stopping:
                stopping = True
                for handler in self.handlers.values():
                    handler.request_stop()
                for query in self.queries.values():
                    query.stop()
            _await_any(self.queries.values(), _POLL_SECONDS)
        self._refresh_progress()
        if on_progress is not None:
            on_progress(self.snapshot())

    def _refresh_progress(self) -> None:
        for source_id, query in self.queries.items():
            stats = self.handlers[source_id].stats
            record_progress(stats, new_progress(query._jsq.recentProgress(), stats))  # no public cheaper way

    def _raise_failures(self) -> None:
        for source_id, handler in self.handlers.items():
            if handler.failure is not None:
                raise handler.failure
            query = self.queries.get(source_id)
            error = query.exception() if query is not None else None
            if query is not None and error is not None and "StopRequested" not in str(error):
                away = query_broker_failure(query)
                if away is not None:  # the driver's offset requests gave up (Spark's fetchOffset.numRetries)
                    brokers = source_brokers(self.pipeline.name, self.pipeline.sources[source_id], self.settings)
                    raise away.naming(brokers).add_context(f"source '{source_id}'")
                message = str(error).strip().splitlines()[0][:500]
                raise ServiceError(f"source '{source_id}': streaming query failed: {message}")


def _await_any(queries: Iterable[StreamingQuery], timeout_s: float) -> None:
    """Wait up to ``timeout_s``, returning as soon as an active query ends: an ``--available-now`` run exits when
    its last batch is done, not up to a poll interval later. A query that failed is reported by the caller."""
    from pyspark.errors import StreamingQueryException

    active = next((query for query in queries if query.isActive), None)
    if active is None:
        return
    with contextlib.suppress(StreamingQueryException):
        active.awaitTermination(cast(int, timeout_s))  # typed int, takes seconds as any number (pyspark 4)


def trigger_interval(settings: Settings) -> str:
    """Spark's ``processingTime`` of every query (``run.trigger_interval_s``), in whole milliseconds."""
    return f"{round(settings.run.trigger_interval_s * 1000)} milliseconds"
