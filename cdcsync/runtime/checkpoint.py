"""Spark's checkpoint of a source's query, read (and, for ``cdcsync rewind``, rewritten) without Spark.

A query's checkpoint (``<state_dir>/checkpoints/<pipeline>/<source>``) holds ``metadata`` (the query id, which
the ledger calls ``checkpoint_id``), ``sources/0/0`` (the Kafka offsets the query started from), ``offsets/N``
(the end offsets of batch N, written before the batch runs) and ``commits/N`` (written once batch N is done).
On restart Spark runs the batch after the newest commit, from that batch's end offsets.

So the checkpoint says which batches every sink must have, and the ledger says which ones each has. Before a run
starts, :func:`ledger_gaps` compares them: a sink lacking committed batches lost them (the target went back in
time: a restore, a failover to a replica that had not caught up) or never had them (it was added after the
pipeline had run). ``run`` then lands nothing and names the way on, :func:`rewind_to_ledger`, which deletes the
checkpoint's batches after the last one every sink has, so Spark reads the rest again. Batch ids after that point
are re-planned: a sink that has one with other offset ranges applies it again, idempotently (:mod:`cdcsync.db.ledger`).

A ClickHouse sink's ledger rows live in Postgres, so a ClickHouse table that goes back on its own (truncated,
restored from a copy) leaves them behind. What can be told without doubt is checked here too: a table holding no
row at all while the ledger says the sink's batches wrote some (:func:`emptied_clickhouse_sinks`). Rewinding then
forgets that sink's ledger rows of the checkpoint and reads the source again from its start. A table restored to
a copy with some of its batches holds nothing that says which (no batch column; merges and ``OPTIMIZE … CLEANUP``
remove rows legitimately), so that case is not detected: docs/operations.md says how to rebuild such a sink.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcsync.config.pipeline import ClickHouseSink, RoutedClickHouseSink, RoutedPostgresSink
from cdcsync.core.errors import CdcsyncError, CheckpointAheadError
from cdcsync.db.clickhouse import connect_from_settings, raw_rows, wrap_clickhouse_error
from cdcsync.db.ledger import (
    REWIND_HINT,
    OffsetRanges,
    first_missing,
    forget_sink,
    recorded_offsets,
    rows_written_by_sink,
)
from cdcsync.engine.graph import SourceGraph

if TYPE_CHECKING:
    from cdcsync.config.pipeline import Pipeline
    from cdcsync.config.settings import Settings

_COMMIT = 'v1\n{"nextBatchWatermarkMs":0}'
"""What Spark writes into ``commits/N`` for a query without watermarks."""


# ---------------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------------


def checkpoint_id(checkpoint_dir: Path) -> str | None:
    """The query id Spark keeps in the checkpoint; None before the query first started."""
    metadata = checkpoint_dir / "metadata"
    return str(json.loads(metadata.read_text())["id"]) if metadata.is_file() else None


def batch_ids(checkpoint_dir: Path, log: str) -> list[int]:
    """The batch ids in ``offsets`` or ``commits``, ascending."""
    folder = checkpoint_dir / log
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def last_committed(checkpoint_dir: Path) -> int:
    """The newest batch Spark committed; -1 when none."""
    return max(batch_ids(checkpoint_dir, "commits"), default=-1)


def _parse_offsets(lines: list[str]) -> dict[str, dict[int, int]]:
    """``topic -> partition -> offset`` from the offset lines of a log entry (one JSON line per source)."""
    result: dict[str, dict[int, int]] = {}
    for line in lines:
        if line.startswith("{"):
            for topic, partitions in json.loads(line).items():
                result[topic] = {int(p): int(o) for p, o in partitions.items()}
    return result


def end_offsets(checkpoint_dir: Path, batch_id: int) -> dict[str, dict[int, int]] | None:
    """Where batch ``batch_id`` ends (batch -1: where the query started); None when the checkpoint lacks it.

    ``offsets/N``: a version line, a metadata line, then the offsets. ``sources/0/0``: a NUL byte and a version
    line (Spark 2.1's format, kept), then the offsets."""
    if batch_id < 0:
        path = checkpoint_dir / "sources" / "0" / "0"
        return _parse_offsets(path.read_text().lstrip("\0").splitlines()[1:]) if path.is_file() else None
    path = checkpoint_dir / "offsets" / str(batch_id)
    return _parse_offsets(path.read_text().splitlines()[2:]) if path.is_file() else None


def committed_offsets(checkpoint_dir: Path) -> dict[str, dict[int, int]]:
    """Offsets after the newest batch that Spark committed: ``topic -> partition -> next offset``."""
    for batch_id in reversed(batch_ids(checkpoint_dir, "commits")):
        offsets = end_offsets(checkpoint_dir, batch_id)
        if offsets is not None:
            return offsets
    return {}


def batch_offsets(checkpoint_dir: Path, batch_id: int) -> OffsetRanges | None:
    """The offset ranges batch ``batch_id`` reads, as the checkpoint planned them (None without its entry)."""
    end = end_offsets(checkpoint_dir, batch_id)
    if end is None:
        return None
    start = end_offsets(checkpoint_dir, batch_id - 1) or {}
    return {
        topic: {str(p): [start.get(topic, {}).get(p), offset] for p, offset in sorted(partitions.items())}
        for topic, partitions in sorted(end.items())
    }


# ---------------------------------------------------------------------------------------------------------------
# The checkpoint against the ledger
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerGap:
    """Committed batches of a source's checkpoint that a sink's ledger lacks."""

    source: str
    sink: str
    missing_from: int
    last_committed: int
    has_batches: bool
    """False when the sink has no batch of this checkpoint at all (added later, or restored to before it ran)."""
    emptied: str | None = None
    """A ClickHouse sink's table that holds no row although the ledger has its batches (see the module doc)."""
    checkpoint_id: str = ""

    def describe(self) -> str:
        if self.emptied is not None:
            return f"sink '{self.sink}' has them in the ledger, but its ClickHouse table {self.emptied} holds no rows"
        if not self.has_batches:
            return f"sink '{self.sink}' has none of them"
        return f"sink '{self.sink}' lacks batches {self.missing_from} to {self.last_committed}"


def _ledger_ids(pipeline: Pipeline, source_id: str, dsn: str) -> dict[str, bool]:
    """The ids the ledger keeps for ``source_id``'s batches (sinks, Postgres side outputs), each with whether it
    is a routed table's sink (which starts with its table's first batch, not the source's)."""
    sinks = pipeline.sinks_of(source_id)
    ids = {sink_id: isinstance(sink, RoutedPostgresSink | RoutedClickHouseSink) for sink_id, sink in sinks.items()}
    inputs = {sink_id: pipeline.plan.view_of(sink.from_) for sink_id, sink in sinks.items()}
    graph = SourceGraph.of(pipeline, source_id, inputs, dsn)
    if graph is not None:
        for table_id, table in graph.tables.items():
            if table_id in graph.fills and not table.in_memory:
                ids[table.sink_id] = False
    return ids


def ledger_gaps(conn: Any, pipeline: Pipeline, settings: Settings) -> list[LedgerGap]:
    """Every sink lacking batches its source's checkpoint has committed (see the module doc)."""
    gaps: list[LedgerGap] = []
    for source_id in pipeline.streams():
        checkpoint_dir = settings.checkpoint_dir(pipeline.name, source_id)
        query_id = checkpoint_id(checkpoint_dir)
        last = last_committed(checkpoint_dir)
        if query_id is None or last < 0:
            continue
        ids = _ledger_ids(pipeline, source_id, settings.postgres_dsn)
        emptied = emptied_clickhouse_sinks(conn, pipeline, settings, source_id, query_id)
        for sink_id, table in sorted(emptied.items()):
            gaps.append(LedgerGap(source_id, sink_id, 0, last, has_batches=True, emptied=table, checkpoint_id=query_id))
        for sink_id, ledger in sorted(first_missing(conn, pipeline.name, query_id, sorted(ids)).items()):
            routed = ids[sink_id]
            if sink_id in emptied:
                continue
            if ledger.first_batch is None:
                if not routed:  # a routed table's sink without batches: its table is new
                    gaps.append(LedgerGap(source_id, sink_id, 0, last, has_batches=False))
            elif ledger.first_batch > 0 and not routed:
                gaps.append(LedgerGap(source_id, sink_id, 0, last, has_batches=True))
            elif ledger.first_missing <= last:
                gaps.append(LedgerGap(source_id, sink_id, ledger.first_missing, last, has_batches=True))
    return gaps


def emptied_clickhouse_sinks(
    conn: Any, pipeline: Pipeline, settings: Settings, source_id: str, query_id: str
) -> dict[str, str]:
    """The ClickHouse sinks of ``source_id`` (with their tables) whose table holds no row although the ledger says
    their batches of this checkpoint wrote some: it was truncated, or restored from an empty or early copy."""
    sinks = {sid: s for sid, s in pipeline.sinks_of(source_id).items() if isinstance(s, ClickHouseSink)}
    written = rows_written_by_sink(conn, pipeline.name, query_id, sorted(sinks)) if sinks else {}
    suspects = sorted(sink_id for sink_id, rows in written.items() if rows > 0)
    if not suspects:
        return {}
    client = connect_from_settings(settings)
    emptied: dict[str, str] = {}
    try:
        for sink_id in suspects:
            sink = sinks[sink_id]
            try:
                empty = raw_rows(client, sink.database, sink.table) == 0
            except Exception as error:
                raise wrap_clickhouse_error(
                    error, f"sink '{sink_id}': counting the rows of {sink.database}.{sink.table}"
                ) from None
            if empty:
                emptied[sink_id] = f"{sink.database}.{sink.table}"
    finally:
        client.close()
    return emptied


def check_ledger(conn: Any, pipeline: Pipeline, settings: Settings) -> None:
    """Before a run: refuse (exit 2, naming every sink and the way on) when a checkpoint is past its ledger."""
    gaps = ledger_gaps(conn, pipeline, settings)
    if not gaps:
        return
    by_source: dict[str, list[LedgerGap]] = {}
    for gap in gaps:
        by_source.setdefault(gap.source, []).append(gap)
    parts = [
        f"source '{source_id}': its checkpoint ({settings.checkpoint_dir(pipeline.name, source_id)}) has committed "
        f"batches up to {found[0].last_committed}, but {', '.join(gap.describe() for gap in found)}"
        for source_id, found in by_source.items()
    ]
    pipeline_file = str(pipeline.path) if pipeline.path else "PIPELINE.yaml"
    raise CheckpointAheadError(
        "; ".join(parts) + ". The target went back in time (restored from a backup, failed over to a replica that "
        "had not caught up, a ClickHouse table truncated), or a sink was added after the pipeline had run: those "
        "changes would never reach it. Nothing was run",
        hint=REWIND_HINT.format(pipeline_file=pipeline_file)
        + ": the sources read again from the end of the last batch every sink has (a new sink: from their start)",
    )


# ---------------------------------------------------------------------------------------------------------------
# Rewinding
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rewound:
    source: str
    from_batch: int
    """The newest batch the checkpoint had committed."""
    to_batch: int
    """The batch the checkpoint now ends with (-1: it starts again from the source's start offsets)."""


def rewind_to_ledger(conn: Any, pipeline: Pipeline, settings: Settings) -> list[Rewound]:
    """Rewrite each source's checkpoint so that its next batch starts after the last batch every sink has.

    Call it holding the pipeline's lock: a running query would overwrite what this deletes.
    """
    gaps: dict[str, int] = {}
    for gap in ledger_gaps(conn, pipeline, settings):
        gaps[gap.source] = min(gaps.get(gap.source, gap.missing_from), gap.missing_from)
        if gap.emptied is not None:  # its ledger rows name batches its table lost: they are to land again
            forget_sink(conn, pipeline.name, gap.checkpoint_id, gap.sink)
    done: list[Rewound] = []
    for source_id, missing_from in sorted(gaps.items()):
        checkpoint_dir = settings.checkpoint_dir(pipeline.name, source_id)
        to_batch = missing_from - 1
        if to_batch >= 0 and end_offsets(checkpoint_dir, to_batch) is None:
            _restore_batch(conn, pipeline, settings, source_id, to_batch)
        last = last_committed(checkpoint_dir)
        for log in ("offsets", "commits"):
            for batch_id in batch_ids(checkpoint_dir, log):
                if batch_id > to_batch:
                    _remove(checkpoint_dir / log / str(batch_id))
        if to_batch >= 0 and not (checkpoint_dir / "commits" / str(to_batch)).is_file():
            _write(checkpoint_dir / "commits" / str(to_batch), _COMMIT)
        done.append(Rewound(source_id, last, to_batch))
    return done


def _restore_batch(conn: Any, pipeline: Pipeline, settings: Settings, source_id: str, batch_id: int) -> None:
    """Write the offset log entry and commit of ``batch_id`` back from the ledger's ranges: Spark keeps only the
    newest batches (100 by default), and a restore may reach further back."""
    checkpoint_dir = settings.checkpoint_dir(pipeline.name, source_id)
    query_id = checkpoint_id(checkpoint_dir)
    assert query_id is not None
    ranges = None
    for sink_id in sorted(_ledger_ids(pipeline, source_id, settings.postgres_dsn)):
        ranges = recorded_offsets(conn, pipeline.name, sink_id, query_id, batch_id)
        if ranges is not None:
            break
    newer = [b for b in batch_ids(checkpoint_dir, "offsets") if b > batch_id]
    if ranges is None or not newer:
        raise CdcsyncError(
            f"source '{source_id}': cannot rewind its checkpoint to batch {batch_id}: Spark no longer keeps that "
            "batch's offsets and the ledger has none recorded for it (it was written by an older cdcsync)",
            hint=f"delete {checkpoint_dir} to read the source again from its starting_offsets (the versioned merges "
            "make the re-read changes harmless)",
        )
    metadata = (checkpoint_dir / "offsets" / str(newer[0])).read_text().splitlines()[1]
    ends = {topic: {p: end for p, (_start, end) in partitions.items()} for topic, partitions in ranges.items()}
    _write(checkpoint_dir / "offsets" / str(batch_id), f"v1\n{metadata}\n{json.dumps(ends, separators=(',', ':'))}")
    _write(checkpoint_dir / "commits" / str(batch_id), _COMMIT)


# ---------------------------------------------------------------------------------------------------------------
# A batch committed before its merge (cdcsync.runtime.overlap)
# ---------------------------------------------------------------------------------------------------------------

UNMERGED_MARKER = "cdcsync-unmerged"
"""The file, in a source's checkpoint, naming the oldest batch Spark may have committed before its merges ran."""


def mark_unmerged(checkpoint_dir: Path, batch_id: int) -> None:
    """Name ``batch_id`` as the oldest batch that may be committed unmerged, on disk before Spark's commit of it:
    written aside, synced, renamed over the old marker, and the folder synced."""
    path = checkpoint_dir / UNMERGED_MARKER
    aside = checkpoint_dir / f".{UNMERGED_MARKER}.tmp"
    with aside.open("w") as file:
        file.write(f"{batch_id}\n")
        file.flush()
        os.fsync(file.fileno())
    aside.replace(path)
    folder = os.open(checkpoint_dir, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def clear_unmerged(checkpoint_dir: Path) -> None:
    """Every batch Spark committed is merged (a stale marker only costs a batch read again)."""
    (checkpoint_dir / UNMERGED_MARKER).unlink(missing_ok=True)


def rewind_unmerged(checkpoint_dir: Path) -> int | None:
    """Before a run: when the last run stopped with a batch committed before its merges ran, delete its commit and
    everything Spark planned after it, so that Spark runs it again from the same offsets (each sink that merged it
    skips it by the ledger). The batch, or None when there was none."""
    path = checkpoint_dir / UNMERGED_MARKER
    if not path.is_file():
        return None
    text = path.read_text().strip()
    if not text.isdigit():
        raise CdcsyncError(
            f"{path} names no batch ({text[:40]!r})",
            hint="restore it from a backup of the checkpoint, or delete the whole checkpoint folder to read the "
            "source again from its starting_offsets (the versioned merges make the re-read changes harmless)",
        )
    batch_id = int(text)
    for log, first_removed in (("commits", batch_id), ("offsets", batch_id + 1)):
        for found in batch_ids(checkpoint_dir, log):
            if found >= first_removed:
                _remove(checkpoint_dir / log / str(found))
    clear_unmerged(checkpoint_dir)
    return batch_id


def _remove(path: Path) -> None:
    """A log entry and the checksum file Hadoop's local file system keeps beside it."""
    path.unlink(missing_ok=True)
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)


def _write(path: Path, text: str) -> None:
    _remove(path)  # a stale checksum beside new content would fail Spark's read
    path.write_text(text)
