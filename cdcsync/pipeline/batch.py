"""One micro-batch of one source, landed in all of its sinks exactly once.

The expensive part of a batch is moving rows between the JVM and Python, so the executors cross that boundary
once: a single ``mapInArrow`` pass (:class:`StageTask`) decodes the partition's Kafka rows, records its dead
letters, and stages the decoded changes into every pending sink: a COPY into a Postgres sink's staging table,
an Arrow insert into a ClickHouse sink's table (:mod:`cdcsync.sinks.clickhouse`). Only a row count per sink comes
back. The driver then merges each sink in its own ledgered transaction (for ClickHouse: records the ledger row).

Order per batch, per sink: ledger lookup (skip a batch merged before) -> stage (executors) -> merge + ledger row
(driver). A transient failure anywhere retries the whole sequence, which is safe because each step is idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from cdcsync.runtime.executor_errors import DECODE_FAILURE_MARKER, executor_error
from cdcsync.sinks.clickhouse import ClickHouseTableSink
from cdcsync.sinks.postgres import PostgresUpsertSink
from cdcsync.sources.debezium import SCHEMA_CHANGE_MARKER
from cdcsync.sources.kafka import DECODER_INPUT_COLUMNS, DecodeTask, schema_change_error

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

_COUNTS_SCHEMA = "sink int, rows bigint, failure string"

BatchSink = PostgresUpsertSink | ClickHouseTableSink
"""Driver side of a sink: ``ledger_key``, ``prepare``, ``stage_writer``, ``merge``."""


class ExecutorWriter(Protocol):
    """Executor side of a sink (picklable): lands one decoded partition, returns the rows it wrote."""

    def stage(self, table: pa.Table) -> int: ...


def _writer(sink: BatchSink, batch_id: int, checkpoint_id: str) -> ExecutorWriter:
    if isinstance(sink, ClickHouseTableSink):  # its insert tokens name the checkpoint too
        return sink.stage_writer(batch_id, checkpoint_id)
    return sink.stage_writer(batch_id)


@dataclass(frozen=True)
class StageTask:
    """Executor side: decode one partition, then stage it into each pending sink (picklable)."""

    decode: DecodeTask
    writers: tuple[ExecutorWriter, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        schema = pa.schema([("sink", pa.int32()), ("rows", pa.int64()), ("failure", pa.string())])
        try:
            decoded = list(self.decode(batches))
        except RuntimeError as error:
            if DECODE_FAILURE_MARKER not in str(error) and SCHEMA_CHANGE_MARKER not in str(error):
                raise
            # on_decode_error: fail, or a schema change. Reported as data, not raised: a failed task makes Spark
            # kill the other tasks' Python workers, whose tracebacks would end up on the user's terminal.
            yield pa.RecordBatch.from_pydict({"sink": [-1], "rows": [0], "failure": [str(error)]}, schema=schema)
            return
        table = pa.Table.from_batches(decoded) if decoded else None
        counts = [writer.stage(table) if table is not None else 0 for writer in self.writers]
        yield pa.RecordBatch.from_pydict(
            {"sink": list(range(len(self.writers))), "rows": counts, "failure": [None] * len(counts)}, schema=schema
        )


@dataclass
class SinkOutcome:
    skipped: bool
    rows_staged: int = 0
    rows_merged: int = 0


def land_batch(
    raw: DataFrame,
    batch_id: int,
    checkpoint_id: str,
    decode: DecodeTask,
    sinks: dict[str, BatchSink],
    pipeline_file: str = "PIPELINE.yaml",
) -> dict[str, SinkOutcome]:
    """Land one micro-batch of Kafka rows (Spark's Kafka source columns) in every sink; see the module doc."""
    outcome: dict[str, SinkOutcome] = {}
    keys = {sink_id: sink.ledger_key(batch_id, checkpoint_id) for sink_id, sink in sinks.items()}
    pending = {sink_id: sink for sink_id, sink in sinks.items() if sink.prepare(keys[sink_id])}
    for sink_id in sinks.keys() - pending.keys():
        outcome[sink_id] = SinkOutcome(skipped=True)
    if not pending:
        return outcome

    started = time.monotonic()
    task = StageTask(decode=decode, writers=tuple(_writer(sink, batch_id, checkpoint_id) for sink in pending.values()))
    try:
        counts = raw.select(*DECODER_INPUT_COLUMNS).mapInArrow(task, _COUNTS_SCHEMA).collect()
    except Exception as error:  # Spark wraps executor failures; see executor_error
        raise executor_error(error, f"staging batch {batch_id}") from None
    failures = [row["failure"] for row in counts if row["failure"]]
    changes = [failure for failure in failures if failure.startswith(SCHEMA_CHANGE_MARKER)]
    if changes:  # the source's schema gained a column (or retyped one); nothing is merged
        raise schema_change_error(changes[0], pipeline_file)
    if failures:  # a message could not be decoded under on_decode_error: fail; nothing is merged
        raise executor_error(RuntimeError(failures[0]), f"staging batch {batch_id}")
    staged = dict.fromkeys(range(len(pending)), 0)
    for row in counts:
        staged[row["sink"]] += row["rows"]
    staged_at = time.monotonic()

    for index, (sink_id, sink) in enumerate(pending.items()):
        if isinstance(sink, ClickHouseTableSink):  # rows were inserted by the executors; record the batch
            merged = sink.merge(keys[sink_id], staged[index])
        else:
            merged = sink.merge(keys[sink_id])
        outcome[sink_id] = SinkOutcome(skipped=merged is None, rows_staged=staged[index], rows_merged=merged or 0)
    log.info(
        "batch %d: decoded and staged in %.2fs, merged %s in %.2fs",
        batch_id,
        staged_at - started,
        {sink_id: o.rows_merged for sink_id, o in outcome.items()},
        time.monotonic() - staged_at,
    )
    return outcome
