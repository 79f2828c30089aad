"""Bounded phases at run time: each source's bounded reads, chunk by chunk, before its Kafka query starts.

Every chunk is one micro-batch through the same path as a plugin source's (:func:`cdcsync.engine.batch.land_rows`):
the ledger lookup, one staging pass, a ledgered merge per sink, under the pipeline's lock and fence, with the
same retries. A source that feeds SQL transforms, dynamic tables or Delta sinks lands each chunk through its
transform graph instead, like a decoded Kafka batch (:func:`cdcsync.engine.graph.land_graph_rows`); a Delta sink's
MERGE of a chunk is then idempotent under Delta's ``txnAppId`` (the chunk's checkpoint id) and ``txnVersion`` (its
batch id), as for a Kafka batch. Its batch id is the chunk's number across the source's phases, its checkpoint id
``bounded-<plan id>``, so the ledger rows of a backfill never meet those of a Kafka checkpoint.

Progress lives in ``<state dir>/checkpoints/<pipeline>/<source>.bounded/progress.json``: the plan of each phase
(its key bounds, computed once, :mod:`cdcsync.sources.bounded`) and how many of its chunks have landed,
rewritten atomically after each chunk. After a crash (SIGKILL included) the next run starts at the first chunk not
recorded; a chunk that landed just before the crash, its progress not yet written, is found in the ledgers and
skipped without being read. ``cdcsync reset`` removes the progress with the checkpoints.

Rows carry ``_cdc_op = 'c'`` and ``_cdc_version`` = (0, phase) (:func:`cdcsync.config.bounded.phase_version`),
below every streamed change: whatever the order in which backfill and stream land, the newest state wins.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcsync.config.bounded import (
    BoundedModel,
    BoundedPlan,
    ClickHouseTableSource,
    DeltaTableSource,
    PostgresTableSource,
    phase_version,
)
from cdcsync.config.load import job_mode_problems
from cdcsync.core.errors import ConfigError, UserError
from cdcsync.db.retry import with_retries
from cdcsync.engine.batch import BatchSink, SinkOutcome, land_rows
from cdcsync.engine.graph import land_graph_rows
from cdcsync.runtime.stream import BatchHandler, StopRequested
from cdcsync.runtime.wiring import build_graph, build_sinks, check_delta_tables
from cdcsync.sources.bounded import Bound, chunk_count, chunk_ranges, clickhouse, delta, postgres, read_ranges

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame, SparkSession

    from cdcsync.config.pipeline import Pipeline
    from cdcsync.config.settings import Settings
    from cdcsync.runtime.lock import PipelineLock

log = logging.getLogger(__name__)

PROGRESS_FILE = "progress.json"
RangeTask = postgres.PostgresRangeTask | clickhouse.ClickHouseRangeTask


def progress_dir(settings: Settings, pipeline: str, source_id: str) -> Path:
    """Where a source's bounded progress lives (beside the checkpoints, removed with them by ``reset``)."""
    return settings.checkpoint_dir(pipeline, f"{source_id}.bounded")


def job_mode(pipeline: Pipeline, settings: Settings) -> bool:
    """Whether the run ends after the bounded phases: ``job_mode: true`` or ``CDCSYNC__JOB_MODE=true``; refused
    (exit 2, before Spark starts) when a source only streams."""
    if not (pipeline.job_mode or settings.job_mode):
        return False
    why = "job_mode: true" if pipeline.job_mode else "CDCSYNC__JOB_MODE=true"
    problems = job_mode_problems(pipeline.sources, pipeline.plan.plugin_sources, pipeline.bounded, why)
    if problems:
        raise ConfigError(f"pipeline '{pipeline.name}' cannot run in job mode", problems)
    return True


def progress_of(pipeline: Pipeline, settings: Settings) -> list[tuple[str, str, int, int | None]]:
    """(source, phase, chunks landed, chunks or None before the plan) of every bounded phase, for ``status``."""
    found = []
    for source_id, plan in pipeline.bounded.items():
        path = progress_dir(settings, pipeline.name, source_id) / PROGRESS_FILE
        unplanned = [{"bounds": None, "done": 0} for _ in plan.phases]
        states = json.loads(path.read_text())["phases"] if path.exists() else unplanned
        for phase, state in zip(plan.phases, states, strict=True):
            chunks = None if state["bounds"] is None else chunk_count(state["bounds"], phase.parallelism)
            found.append((source_id, phase.label, int(state["done"]), chunks))
    return found


@dataclass
class Progress:
    """A source's bounded progress (module doc); ``phases[i]`` is ``{"bounds": [...] | None, "done": n}``."""

    path: Path
    plan_id: str
    fingerprint: str
    phases: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, directory: Path, plan: BoundedPlan) -> Progress:
        fingerprint = _fingerprint(plan)
        path = directory / PROGRESS_FILE
        if not path.exists():
            fresh = cls(path, uuid.uuid4().hex, fingerprint, [{"bounds": None, "done": 0} for _ in plan.phases])
            fresh.save()
            return fresh
        data = json.loads(path.read_text())
        if data.get("fingerprint") != fingerprint:
            raise UserError(
                f"source '{plan.source_id}': its bounded sources changed since their progress was recorded in {path}",
                hint="restore them, or start the backfill again with `cdcsync reset` (which removes the progress)",
            )
        return cls(path, str(data["plan_id"]), fingerprint, list(data["phases"]))

    def save(self) -> None:
        """Atomically: a crash leaves the old progress or the new one, never half of it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"plan_id": self.plan_id, "fingerprint": self.fingerprint, "phases": self.phases}
        temporary = self.path.with_suffix(".tmp")
        with temporary.open("w") as handle:
            json.dump(body, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)


def _fingerprint(plan: BoundedPlan) -> str:
    described = [phase.model_dump(mode="json", exclude={"dsn", "url"}) for phase in plan.phases]
    text = json.dumps([described, [name for name, _ in plan.columns], plan.primary_key], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class BoundedHandler(BatchHandler):
    """Lands the chunks of one source's bounded phases, one micro-batch each (module doc)."""

    def __init__(
        self,
        pipeline: Pipeline,
        plan: BoundedPlan,
        sinks: dict[str, BatchSink],
        settings: Settings,
        spark_context: SparkContext,
    ):
        self.pipeline = pipeline
        self.source_id = plan.source_id
        self.plan = plan
        self.sinks = sinks
        self.settings = settings
        self.graph = build_graph(pipeline, plan.source_id, settings.postgres_dsn)
        """Its transforms, dynamic tables and Delta sinks; None when every sink reads the chunks directly."""
        self.progress = Progress.load(progress_dir(settings, pipeline.name, plan.source_id), plan)
        self.spark_context = spark_context
        self._init_run_state()

    @property
    def checkpoint_id(self) -> str:
        return f"bounded-{self.progress.plan_id}"

    def _process(self, changes: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        if self.stats.first_batch_at is None:
            self.stats.first_batch_at = started
        pipeline_file = str(self.pipeline.path) if self.pipeline.path else "PIPELINE.yaml"
        land: Callable[[], dict[str, SinkOutcome]]
        if self.graph is None:
            land = functools.partial(land_rows, changes, batch_id, self.checkpoint_id, self.sinks, pipeline_file)
        else:
            land = functools.partial(
                land_graph_rows, changes, batch_id, self.checkpoint_id, self.graph, self.sinks, pipeline_file
            )
        describe = f"source '{self.source_id}' chunk {batch_id}"
        outcome = with_retries(
            functools.partial(self._attempt, land), describe=describe, budget=self.retry_budget, on_wait=self._waiting
        )
        self.record(outcome, batch_id)
        self.stats.durations.observe(time.monotonic() - started)

    def run(self, spark: SparkSession, stop: threading.Event) -> bool:
        """Land every chunk not landed yet, phase by phase; False when a stop was requested before the end."""
        batch_id = 0
        for index, phase in enumerate(self.plan.phases):
            state = self.progress.phases[index]
            key_bounds, read_chunk = self._reader(spark, phase, state)
            if state["bounds"] is None:
                state["bounds"] = key_bounds()
                self.progress.save()
            chunks = chunk_count(state["bounds"], phase.parallelism)
            label = f"{self.source_id}:{phase.label}"
            for chunk in range(chunks):
                if chunk < state["done"]:
                    batch_id += 1
                    continue
                if stop.is_set():
                    return False
                rows = read_chunk(chunk_ranges(state["bounds"], phase.parallelism, chunk))
                try:
                    self(bounded_changes(rows, index + 1, phase.label), batch_id)
                except StopRequested:
                    return False
                state["done"] = chunk + 1
                self.progress.save()
                log.info("source '%s': %s chunk %d/%d landed", self.source_id, label, chunk + 1, chunks)
                batch_id += 1
        return True

    def _reader(
        self, spark: SparkSession, phase: BoundedModel, state: dict[str, Any]
    ) -> tuple[Callable[[], list[list[str]]], Callable[[list[tuple[Bound, Bound]]], DataFrame]]:
        """How ``phase`` is planned and how a chunk of it is read (lazily: a chunk every sink holds is not read)."""
        assert self.settings is not None
        columns, key = self.plan.columns, self.plan.primary_key
        if isinstance(phase, DeltaTableSource):
            if state.get("version") is None:  # the snapshot every chunk reads, also after a restart
                state["version"] = delta.newest_version(spark, phase)
                self.progress.save()
            rows = delta.changes(spark, phase, columns, key, int(state["version"]))
            return functools.partial(delta.key_bounds, rows, phase, key), lambda ranges: rows.where(
                delta.in_range(columns, key, *ranges[0])
            )
        task: RangeTask
        if isinstance(phase, ClickHouseTableSource):
            task = clickhouse.ClickHouseRangeTask.of(_location(phase, self.settings), phase, columns, key)
        else:
            task = postgres.PostgresRangeTask.of(_location(phase, self.settings), phase, columns, key)
        return functools.partial(_key_bounds, phase, key, self.settings), functools.partial(
            read_ranges, spark, task, columns
        )


def _location(phase: PostgresTableSource | ClickHouseTableSource, settings: Settings) -> str:
    """The phase's own DSN or URL, else the settings' Postgres DSN or ClickHouse URL."""
    if isinstance(phase, ClickHouseTableSource):
        return phase.url.get_secret_value() if phase.url is not None else settings.clickhouse_url
    return phase.dsn.get_secret_value() if phase.dsn is not None else settings.postgres_dsn


def _key_bounds(
    phase: PostgresTableSource | ClickHouseTableSource, key: tuple[str, ...], settings: Settings
) -> list[list[str]]:
    if isinstance(phase, ClickHouseTableSource):
        return clickhouse.key_bounds(_location(phase, settings), phase, key)
    return postgres.key_bounds(_location(phase, settings), phase, key)


def plan_before_spark(pipeline: Pipeline, settings: Settings) -> None:
    """Plan the Postgres and ClickHouse phases not planned yet, before Spark starts: a table that is missing or
    unreachable stops the run at once. (A Delta phase is planned with Spark.) Under the pipeline's lock."""
    for source_id, plan in pipeline.bounded.items():
        progress = Progress.load(progress_dir(settings, pipeline.name, source_id), plan)
        for phase, state in zip(plan.phases, progress.phases, strict=True):
            if state["bounds"] is None and not isinstance(phase, DeltaTableSource):
                state["bounds"] = _key_bounds(phase, plan.primary_key, settings)
                progress.save()


def bounded_changes(rows: DataFrame, phase: int, label: str) -> DataFrame:
    """A chunk's rows as change rows: the business columns, then the ``_cdc_*`` columns (module doc)."""
    from pyspark.sql import functions as F

    op = F.col("_cdc_op") if "_cdc_op" in rows.columns else F.lit("c")  # a change feed's own ops
    return rows.select(
        *(F.col(name) for name in rows.columns if name != "_cdc_op"),
        op.alias("_cdc_op"),
        F.lit(phase_version(phase)).cast("decimal(38,0)").alias("_cdc_version"),
        F.current_timestamp().alias("_cdc_ts"),
        F.lit(label).alias("_cdc_topic"),
        F.spark_partition_id().alias("_cdc_partition"),
        F.monotonically_increasing_id().alias("_cdc_offset"),
    )


def run_bounded(
    spark: SparkSession,
    pipeline: Pipeline,
    settings: Settings,
    lock: PipelineLock,
    stop: threading.Event,
    handlers: dict[str, BatchHandler],
) -> bool:
    """Every source's bounded phases, one source after the other; False when stopped before the end. Each
    handler is added to ``handlers`` (as ``<source>.bounded``) so that the live view and metrics show it."""
    for source_id, plan in pipeline.bounded.items():
        sinks = build_sinks(pipeline, source_id, settings)
        check_delta_tables(spark, sinks)
        handler = BoundedHandler(pipeline, plan, sinks, settings, spark.sparkContext)
        handler.lock_guard = lock.ensure_held
        handler.fence_sinks(lock.fence)
        handlers[f"{source_id}.bounded"] = handler
        if not handler.run(spark, stop):
            return False
    return True
