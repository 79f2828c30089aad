"""Plugin sources at run time: each is a streaming query of its own over the DataFrame its operator returns.

Each micro-batch (:class:`PluginSourceHandler`) gets the ``_cdc_*`` columns a Kafka source's decoder would give
it, then lands in every sink fed by the source through the same ledgered path as decoded Kafka rows
(:func:`cdcsync.engine.batch.land_rows`):

* ``_cdc_op``: the DataFrame's own ``_cdc_op`` column when it has one, else ``c`` (an upsert);
* ``_cdc_version``: ``batch id * 2^64 + monotonically_increasing_id()``: later batches rank above earlier ones,
  and a replayed batch (Spark reads the same input again from the checkpoint) gets the same versions;
* ``_cdc_ts``: the time the batch ran; ``_cdc_topic``: the source id; ``_cdc_partition``: the Spark partition;
  ``_cdc_offset``: the row's id in the batch.

The columns are cast to the types the operator declares. Checkpointing, the lock, stopping and retries are the
Kafka sources' (:class:`~cdcsync.runtime.stream.BatchHandler`); there are no dead letters and no lag figures, and
the ledger rows carry no offset ranges, so ``run`` does not compare the checkpoint with the ledger for them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cdcsync.config.plan import PluginSourceStep
from cdcsync.config.plugins import operator_of, options_of
from cdcsync.core.errors import ServiceError
from cdcsync.db.retry import with_retries
from cdcsync.engine.batch import BatchSink, land_rows
from cdcsync.runtime.stream import BatchHandler, trigger_interval
from cdcsync.runtime.wiring import build_sinks

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from cdcsync.config.pipeline import Pipeline
    from cdcsync.config.settings import Settings


class PluginSourceHandler(BatchHandler):
    """``foreachBatch`` function of a plugin source's query."""

    def __init__(
        self,
        pipeline: Pipeline,
        step: PluginSourceStep,
        sinks: dict[str, BatchSink],
        checkpoint_dir: Path,
        settings: Settings,
    ) -> None:
        self.pipeline = pipeline
        self.source_id = step.id
        self.step = step
        self.sinks = sinks
        self.checkpoint_dir = checkpoint_dir
        self.settings = settings
        self._init_run_state()

    def _process(self, raw: DataFrame, batch_id: int) -> None:
        if self.stats.first_batch_at is None:
            self.stats.first_batch_at = time.monotonic()
        pipeline_file = str(self.pipeline.path) if self.pipeline.path else "PIPELINE.yaml"
        changes = with_metadata(raw, self.step, batch_id)
        land = functools.partial(land_rows, changes, batch_id, self.checkpoint_id, self.sinks, pipeline_file)
        describe = f"source '{self.source_id}' batch {batch_id}"
        attempt = functools.partial(self._attempt, land)  # the lock check first, as for Kafka sources
        outcome = with_retries(attempt, describe=describe, budget=self.retry_budget, on_wait=self._waiting)
        self.record(outcome, batch_id)


def with_metadata(rows: DataFrame, step: PluginSourceStep, batch_id: int) -> DataFrame:
    """The plugin's rows as change rows: its declared columns, cast, then the ``_cdc_*`` columns (module doc)."""
    from pyspark.sql import functions as F

    position = F.monotonically_increasing_id()
    op = F.col("_cdc_op").cast("string") if "_cdc_op" in rows.columns else F.lit("c")
    version = F.lit(batch_id).cast("decimal(38,0)") * F.expr("CAST(18446744073709551616 AS DECIMAL(38,0))")
    return rows.select(
        *(F.col(name).cast(pg.spark_type).alias(name) for name, pg in step.columns),
        op.alias("_cdc_op"),
        (version + position).cast("decimal(38,0)").alias("_cdc_version"),
        F.current_timestamp().alias("_cdc_ts"),
        F.lit(step.id).alias("_cdc_topic"),
        F.spark_partition_id().alias("_cdc_partition"),
        position.alias("_cdc_offset"),
    )


def start_plugin_query(
    spark: SparkSession,
    pipeline: Pipeline,
    step: PluginSourceStep,
    settings: Settings,
    lock_guard: Callable[[], None],
    available_now: bool,
) -> tuple[PluginSourceHandler, StreamingQuery]:
    """Start the streaming query of plugin source ``step``; its handler and the query."""
    where = f"source '{step.id}' ({step.type})"
    try:
        frame = operator_of(step.type)(options_of(step.type, dict(step.options))).dataframe(spark)  # type: ignore[attr-defined]
    except Exception as error:
        raise ServiceError(f"{where}: building its DataFrame: {type(error).__name__}: {error}") from None
    checkpoint_dir = settings.checkpoint_dir(pipeline.name, step.id)
    checkpoint_dir.parent.mkdir(parents=True, exist_ok=True)
    handler = PluginSourceHandler(pipeline, step, build_sinks(pipeline, step.id, settings), checkpoint_dir, settings)
    handler.lock_guard = lock_guard
    writer = (
        frame.writeStream.foreachBatch(handler)
        .option("checkpointLocation", str(checkpoint_dir))
        .queryName(f"{pipeline.name}.{step.id}")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=trigger_interval(settings))
    try:
        return handler, writer.start()
    except Exception as error:
        raise ServiceError(f"{where}: starting its stream: {str(error).splitlines()[0][:300]}") from None
