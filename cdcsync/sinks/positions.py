"""A source that went back (restored from a backup, replaced): its snapshot lies below the positions a sink has
merged (docs/operations.md#a-source-that-went-back). Postgres sinks check it in SQL over their stage
(``position_check.sql.j2``); sinks that merge a Spark DataFrame outside Postgres (Delta) check it here, against
the same ``cdcsync.source_positions`` row.

A version is ``commit * 2^64 + LSN``; a snapshot read is ``(0, S)`` or ``(L, 0)``, its position S or L; a Kafka
offset version has commit part 0 or 1, so only versions from commit part 2 up raise the mark.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from cdcsync.core import names
from cdcsync.core.errors import SourceWentBack

if TYPE_CHECKING:
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
