"""What every sink's driver side shares: its name in errors and its rows in ``cdcsync.batch_ledger``.

The batch ledger lives in Postgres for every sink, ClickHouse ones included: one row per (pipeline, sink,
checkpoint, batch) that landed, with the Kafka offset ranges the batch read, so that a replayed micro-batch is
recognised and skipped, and only when it reads what the ledgered one read: a batch id whose ranges differ (a
checkpoint edited by hand, a re-planned or rewound batch) is applied again, which the versioned merges make
idempotent, and its row takes the new ranges.

The ledger also tells when the target went back in time (a restore, a failover to a replica that had not caught
up): Spark runs batch N only after committing N-1, so a sink that has batches of this checkpoint but not N-1 has
lost it (:meth:`LedgeredSink.landed`); before a run starts, :func:`first_missing` compares the whole ledger with
the checkpoint (:mod:`cdcsync.runtime.checkpoint`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import CheckpointAheadError, SinkError
from cdcsync.db.fence import MergeFence
from cdcsync.db.postgres import reused_connection
from cdcsync.db.retry import classify_postgres_error
from cdcsync.sql.render import render

if TYPE_CHECKING:
    from cdcsync.config.pipeline import Pipeline

OffsetRanges = dict[str, dict[str, list[int | None]]]
"""``topic -> partition -> [start, end]`` (end exclusive, as Spark's offset log has them); start is None where the
checkpoint does not say (a partition new in this batch)."""

REWIND_HINT = "run `cdcsync rewind {pipeline_file} --to-ledger`, then run again (see docs/operations.md#rewind)"


def offsets_json(ranges: OffsetRanges | None) -> str | None:
    """The ranges as the ledger stores them (canonical JSON), None when unknown."""
    return None if ranges is None else json.dumps(ranges, sort_keys=True, separators=(",", ":"))


class LedgeredSink:
    def __init__(self, pipeline: Pipeline, sink_id: str, dsn: str) -> None:
        self.pipeline = pipeline
        self.sink_id = sink_id
        self.dsn = dsn
        """The Postgres database holding the ledger (and, for Postgres sinks, the target)."""
        self._ledger_lookup_sql = render("postgres/runtime/ledger_lookup.sql.j2")
        self._ledger_record_sql = render("postgres/runtime/ledger_record.sql.j2")
        self._ledger_rows_sql = render("postgres/runtime/ledger_rows_written.sql.j2")
        self.fence: MergeFence | None = None
        """Set by the run that holds the pipeline's lock: each merge transaction passes it before writing."""

    @property
    def label(self) -> str:
        return f"sink '{self.sink_id}'"

    def ledger_key(self, batch_id: int, checkpoint_id: str, offsets: OffsetRanges | None = None) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline.name,
            "sink": self.sink_id,
            "checkpoint_id": checkpoint_id,
            "batch_id": batch_id,
            "offsets": offsets_json(offsets),
        }

    def landed(self, conn: Any, ledger_key: dict[str, Any], merging: tuple[int, ...] = ()) -> bool:
        """Whether the ledger holds this batch with the same offset ranges (so it is skipped).

        Raises :class:`CheckpointAheadError` when the sink has earlier batches of this checkpoint but not the
        previous one, which Spark committed before it started this one: the target lost it. (A sink whose batches
        start later, a new table's or one whose checkpoint was rewound to the start, has no earlier batch.)
        ``merging``: batches whose merges still run (:mod:`cdcsync.runtime.overlap`), not yet expected.
        """
        batch_id = ledger_key["batch_id"]
        previous = batch_id - 1
        while previous in merging:
            previous -= 1
        row = conn.execute(self._ledger_lookup_sql, {**ledger_key, "previous": previous}).fetchone()
        landed, has_previous, earlier = row if row else (False, False, False)
        if landed:
            return True
        if earlier and not has_previous:
            pipeline_file = str(self.pipeline.path) if self.pipeline.path else "PIPELINE.yaml"
            raise CheckpointAheadError(
                f"{self.label}: the ledger lacks batch {previous}, which Spark's checkpoint committed before "
                f"batch {batch_id}: the target went back in time while the pipeline ran (a failover to a replica "
                "that had not caught up, a restore); nothing of this batch was landed",
                hint=REWIND_HINT.format(pipeline_file=pipeline_file),
            )
        return False

    def not_landed(self, ledger_key: dict[str, Any]) -> bool:
        """``prepare`` of a sink whose target is not the ledger's database (ClickHouse, Delta): False when the
        ledger holds this batch with the same offset ranges (it landed before)."""
        import psycopg

        try:
            with reused_connection(self.dsn) as conn:
                return not self.landed(conn, ledger_key)
        except psycopg.Error as error:
            raise self._error(f"preparing batch {ledger_key['batch_id']}", error) from None

    def record_landed(
        self, ledger_key: dict[str, Any], rows_written: int, also: Callable[[Any], None] | None = None
    ) -> bool:
        """Record a batch whose target was written outside the ledger's transaction (ClickHouse's inserts, a webhook's
        posts, a Delta commit), with its rows, while this run still owns the pipeline; False when another attempt
        recorded it first. ``also`` writes what else belongs to the batch's record, in the same transaction."""
        import psycopg

        try:
            with reused_connection(self.dsn) as conn, conn.transaction():
                self.enter_fence(conn)
                if conn.execute(self._ledger_record_sql, ledger_key).rowcount == 0:
                    return False
                conn.execute(self._ledger_rows_sql, {**ledger_key, "rows_written": rows_written})
                if also is not None:
                    also(conn)
        except psycopg.Error as error:
            raise self._error(f"recording batch {ledger_key['batch_id']} in the ledger", error) from None
        return True

    def enter_fence(self, conn: Any) -> None:
        """First in a merge transaction: go on only while this run owns the pipeline (:mod:`cdcsync.db.fence`)."""
        if self.fence is not None:
            self.fence.check(conn)

    def _error(self, doing: str, error: Exception) -> SinkError:
        """A Postgres failure as this sink's error: what it was doing, the first line of the cause, retriable
        when a retry may help."""
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        failure = SinkError(f"{doing}: {message}", retriable=classify_postgres_error(error))
        return failure.add_context(self.label)  # type: ignore[return-value]


@dataclass(frozen=True)
class SinkLedger:
    """What the ledger holds of one sink for one checkpoint (see :func:`first_missing`)."""

    first_batch: int | None
    """Its first ledgered batch; None when it has none."""
    first_missing: int
    """The first batch id after ``first_batch`` it lacks (0 when it has none)."""


def first_missing(conn: Any, pipeline: str, checkpoint_id: str, sinks: list[str]) -> dict[str, SinkLedger]:
    """Per sink: its first ledgered batch of ``checkpoint_id`` and the first batch after it that it lacks."""
    rows = conn.execute(
        render("postgres/runtime/ledger_first_missing.sql.j2"),
        {"pipeline": pipeline, "checkpoint_id": checkpoint_id, "sinks": sinks},
    ).fetchall()
    found = {sink: SinkLedger(int(first), int(missing)) for sink, first, missing in rows}
    return {sink: found.get(sink, SinkLedger(None, 0)) for sink in sinks}


def recorded_offsets(conn: Any, pipeline: str, sink: str, checkpoint_id: str, batch_id: int) -> OffsetRanges | None:
    """The offset ranges the ledger holds for one batch of one sink; None when it has none."""
    row = conn.execute(
        render("postgres/runtime/ledger_offsets.sql.j2"),
        {"pipeline": pipeline, "sink": sink, "checkpoint_id": checkpoint_id, "batch_id": batch_id},
    ).fetchone()
    return row[0] if row and row[0] is not None else None


def rows_written_by_sink(conn: Any, pipeline: str, checkpoint_id: str, sinks: list[str]) -> dict[str, int]:
    """Per sink with batches of ``checkpoint_id``: the rows the ledger says they wrote."""
    rows = conn.execute(
        render("postgres/runtime/ledger_rows_by_sink.sql.j2"),
        {"pipeline": pipeline, "checkpoint_id": checkpoint_id, "sinks": sinks},
    ).fetchall()
    return {sink: int(written or 0) for sink, written in rows}


def forget_sink(conn: Any, pipeline: str, checkpoint_id: str, sink: str) -> None:
    """Delete a sink's ledger rows of ``checkpoint_id``: its target lost them, and they are to land again."""
    conn.execute(
        render("postgres/runtime/ledger_forget.sql.j2"),
        {"pipeline": pipeline, "checkpoint_id": checkpoint_id, "sink": sink},
    )


def fence_all(fence: MergeFence | None, ledgered: Iterable[LedgeredSink]) -> None:
    """Make every merge transaction of these sinks (and dynamic tables) pass ``fence``."""
    for sink in ledgered:
        sink.fence = fence
