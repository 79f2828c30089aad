"""A source that went back (restored from a backup, replaced): its snapshot lies below the positions a sink has
merged (docs/operations.md#a-source-that-went-back). Postgres sinks check it in SQL over their stage
(``position_check.sql.j2``); sinks that merge a Spark DataFrame outside Postgres (Delta) check it here, against
the same ``cdcsync.source_positions`` row; sinks whose executor tasks write the target (ClickHouse) check each
task's rows before it writes (:class:`TaskPositions`), and their driver records what the tasks saw.

A version is ``commit * 2^64 + LSN``; a snapshot read is ``(0, S)`` or ``(L, 0)``, its position S or L; a Kafka
offset version has commit part 0 or 1, so only versions from commit part 2 up raise the mark.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cdcsync.core import names
from cdcsync.core.errors import SourceWentBack
from cdcsync.core.reports import ReportedFailure, source_went_back
from cdcsync.sql.render import render

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from cdcsync.config.pipeline import KafkaSource

LSN = Decimal(2**64)
FIRST_STREAMED = Decimal(2**65)


@dataclass(frozen=True)
class BatchPositions:
    """What one batch says of the source's positions."""

    newest: Decimal | None
    """The newest streamed version (commit part 2 or more): the mark to be."""
    snapshot: Decimal | None
    """The newest snapshot position of its reads."""
    lowest: Decimal | None
    """The lowest position of its reads that are not of the snapshot already seen."""
    below: int
    """How many of those lie below the mark."""


def batch_positions(rows: DataFrame, mark: Decimal | None, seen: Decimal | None) -> BatchPositions:
    """One aggregate over the batch's changes (``_cdc_op``, ``_cdc_version``)."""
    from pyspark.sql import functions as F

    version = F.col("_cdc_version")
    read = (F.col("_cdc_op") == "r") & ((version < F.lit(LSN)) | (version % F.lit(LSN) == 0))
    position = F.when(version < F.lit(LSN), version).otherwise(F.floor(version / F.lit(LSN)))
    other = read if seen is None else read & (position != F.lit(seen))
    below = other & (position < F.lit(mark)) if mark is not None else F.lit(False)
    row = rows.agg(
        F.max(F.when(version >= F.lit(FIRST_STREAMED), version)).alias("newest"),
        F.max(F.when(read, position)).alias("snapshot"),
        F.min(F.when(below, position)).alias("lowest"),
        F.count(F.when(below, True)).alias("below"),
    ).collect()[0]
    newest, snapshot, lowest = (
        None if row[name] is None else Decimal(row[name]) for name in ("newest", "snapshot", "lowest")
    )
    return BatchPositions(newest=newest, snapshot=snapshot, lowest=lowest, below=int(row["below"]))


def went_back(
    sink_id: str, source: KafkaSource, mark: str | Decimal, position: str | Decimal, reads: int
) -> SourceWentBack:
    """The error that stops the run before a batch whose snapshot lies below ``mark`` merges."""
    topic = f"topic '{source.topic}'" if source.topic else f"topics matching '{source.topic_pattern}'"
    return SourceWentBack(
        f"sink '{sink_id}': {reads} snapshot read(s) from {topic} at source position {lsn_text(position)} lie "
        f"below position {lsn_text(mark)}, which this sink has already merged: the source database went back "
        "(restored from a backup, or replaced), and its changes would rank below the rows the target holds",
        hint=(
            "see docs/operations.md#a-source-that-went-back: rebuild the target from the new source (reset the "
            "sink's tables and checkpoint), or, if the source did not go back, delete the sink's row from "
            f"{names.INTERNAL_SCHEMA}.{names.SOURCE_POSITIONS_TABLE} and run again"
        ),
    )


def lsn_text(position: str | Decimal) -> str:
    """An LSN as Postgres writes it (``16/B374D848``), for people to compare with ``pg_current_wal_lsn()``."""
    value = int(position)
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


# ---- the mark in cdcsync.source_positions, for sinks that merge outside Postgres ----------------------------------


def read_mark(conn: Any, pipeline: str, sink_id: str) -> tuple[Decimal | None, Decimal | None]:
    """(the commit position of the newest change ``sink_id`` merged, the snapshot seen), or Nones before the first."""
    sql = render("postgres/runtime/position_mark.sql.j2", **_where(pipeline, sink_id))
    row = conn.execute(sql).fetchone()
    if row is None:
        return None, None
    mark, seen = (None if value is None else Decimal(value) for value in row)
    return mark, seen


def save_mark(conn: Any, pipeline: str, sink_id: str, newest: Decimal | None, snapshot: Decimal | None) -> None:
    """Raise the mark after a batch landed: its newest streamed version and newest snapshot position (either may be
    None: then nothing of it changes)."""
    if newest is None and snapshot is None:
        return
    sql = render("postgres/runtime/position_save.sql.j2", **_where(pipeline, sink_id))
    conn.execute(sql, {"position": newest, "snapshot": snapshot})


def _where(pipeline: str, sink_id: str) -> dict[str, str]:
    return {"internal_schema": names.INTERNAL_SCHEMA, "pipeline": pipeline, "sink_id": sink_id}


# ---- executor tasks that write the target themselves (ClickHouse) ----------------------------------------------


class HighestPositions:
    """Spark accumulator parameter (``zero`` and ``addInPlace``) of a batch's (newest streamed version, newest
    snapshot position), each an int or None. Taking the highest is idempotent, so a task Spark runs twice (a
    speculative copy, a retry) adds nothing wrong; Spark drops the updates of failed tasks."""

    def zero(self, value: tuple[int | None, int | None]) -> tuple[int | None, int | None]:
        return None, None

    def addInPlace(
        self, ours: tuple[int | None, int | None], theirs: tuple[int | None, int | None]
    ) -> tuple[int | None, int | None]:
        newest, snapshot = (
            a if b is None else b if a is None else max(a, b) for a, b in zip(ours, theirs, strict=True)
        )
        return newest, snapshot


@dataclass(frozen=True)
class TaskPositions:
    """What a writing task needs to check its rows against the sink's mark before it writes them, and to report
    the positions it wrote to the driver (picklable; built by the driver per batch attempt)."""

    sink_id: str
    source: KafkaSource
    mark: Decimal | None
    """The commit position of the newest change the sink merged (None before the first)."""
    seen: Decimal | None
    """The snapshot whose reads the sink merged last: its reads are never a sign of a source that went back."""
    accumulator: Any = None
    """A Spark accumulator of :class:`HighestPositions`, read by the driver once the tasks are done; None without
    Spark (the rows are still checked)."""

    def check(self, rows: pa.Table) -> None:
        """Raise (a :class:`~cdcsync.core.reports.ReportedFailure`, before anything is written) when a snapshot
        read of ``rows`` (decoded changes) lies below the mark; else add the rows' positions to the accumulator."""
        found = task_positions(rows, self.mark, self.seen)
        if found.lowest is not None and self.mark is not None:
            error = went_back(self.sink_id, self.source, self.mark, found.lowest, found.below)
            raise ReportedFailure(source_went_back(error.message, error.hint or ""))
        if self.accumulator is not None and (found.newest is not None or found.snapshot is not None):
            self.accumulator.add(tuple(None if p is None else int(p) for p in (found.newest, found.snapshot)))


def task_positions(rows: pa.Table, mark: Decimal | None, seen: Decimal | None) -> BatchPositions:
    """:func:`batch_positions` of one task's decoded changes in Arrow. Snapshot reads are few (a snapshot's
    batches), so only they are turned into Python numbers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    versions = rows.column("_cdc_version").cast(pa.decimal128(38, 0))  # as the decoder yields it
    streamed = versions.filter(pc.greater_equal(versions, pa.scalar(FIRST_STREAMED, versions.type)))
    newest = pc.max(streamed).as_py() if len(streamed) else None
    read_versions = versions.filter(pc.equal(rows.column("_cdc_op"), "r")).to_pylist()
    lsn = 1 << 64
    reads = [
        version if version < lsn else version // lsn
        for version in (int(v) for v in read_versions if v is not None)
        if version < lsn or version % lsn == 0
    ]
    below = [p for p in reads if mark is not None and p < mark and p != seen]
    snapshot, lowest = max(reads, default=None), min(below, default=None)
    return BatchPositions(
        newest=None if newest is None else Decimal(newest),
        snapshot=None if snapshot is None else Decimal(snapshot),
        lowest=None if lowest is None else Decimal(lowest),
        below=len(below),
    )
