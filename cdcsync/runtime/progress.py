"""What a run has done so far, as plain data: per source (batches, rows in, lag per partition, durations) and per
sink (rows staged and merged, replays skipped), folded from the batch handler's outcomes and Spark's progress
events. The live view, ``/metrics`` and ``/healthz`` read it through :class:`RunSnapshot`."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdcsync.runtime.metrics import Durations

log = logging.getLogger(__name__)


@dataclass
class SinkStats:
    rows_in: int = 0
    rows_out: int = 0
    batches: int = 0
    skipped_batches: int = 0
    merge_durations: Durations = field(default_factory=Durations)


@dataclass
class SourceStats:
    batches: int = 0
    last_batch_id: int | None = None
    rows_in: int = 0
    dead_letters: int = 0
    rows_per_second: float = 0.0
    lag: dict[str, int] = field(default_factory=dict)
    """``topic/partition`` -> messages not yet processed, from the query's last progress."""
    first_batch_at: float | None = None
    last_batch_done_at: float | None = None
    waiting: str | None = None
    """What the batch in flight is retrying (a dependency that is away), while it does."""
    durations: Durations = field(default_factory=Durations)
    """Wall time of each batch the handler landed."""
    progress_seen: set[int] = field(default_factory=set, repr=False)
    newest_progress: tuple[Any, Any] | None = field(default=None, repr=False)
    """(batch id, timestamp) of the newest progress event read (:func:`new_progress`)."""


@dataclass
class RunSnapshot:
    """What the live view renders; plain data so it can be tested and logged."""

    pipeline: str
    sources: dict[str, SourceStats]
    sinks: dict[str, SinkStats]
    sink_targets: dict[str, str]
    elapsed: float
    sink_types: dict[str, str] = field(default_factory=dict)
    """Sink id -> its YAML ``type`` (the metrics' ``operator_type``)."""


def new_progress(recent: Sequence[Any], stats: SourceStats) -> list[dict[str, Any]]:
    """The progress events of ``recent`` (the JVM's ``recentProgress`` array, oldest first: each item has
    ``json()``) newer than the newest ``stats`` has read, oldest first.

    Read from the newest back to the last one read, so a poll costs a few Py4J calls. PySpark's own
    ``recentProgress`` converts all the events Spark keeps (100), three Py4J calls and a JSON document each, on
    every poll: twice a second, that was most of what the driver did between batches, on both sides of Py4J."""
    fresh: list[dict[str, Any]] = []
    for index in range(len(recent) - 1, -1, -1):
        event = json.loads(recent[index].json())
        if (event.get("batchId"), event.get("timestamp")) == stats.newest_progress:
            break
        fresh.append(event)
    if fresh:
        stats.newest_progress = (fresh[0].get("batchId"), fresh[0].get("timestamp"))
    return fresh[::-1]


def record_progress(stats: SourceStats, events: Iterable[dict[str, Any]]) -> None:
    """Fold Spark's recent progress events into the source's figures: rows in once per batch, lag as of the
    newest event (idle triggers included, so lag stays current while nothing arrives)."""
    for progress in events:
        for source_progress in progress.get("sources") or []:
            stats.lag.update(_lag(source_progress))
        batch_id = int(progress.get("batchId", -1))
        if batch_id in stats.progress_seen or not _ran_a_batch(progress):
            continue
        stats.progress_seen.add(batch_id)
        log.debug("batch %d: Spark's durations (ms): %s", batch_id, json.dumps(progress.get("durationMs") or {}))
        stats.rows_in += int(progress.get("numInputRows") or 0)
        if progress.get("numInputRows"):  # none when the tasks read the batch (sources.kafka_fetch)
            stats.rows_per_second = float(progress.get("processedRowsPerSecond") or 0.0)


def _ran_a_batch(progress: dict[str, Any]) -> bool:
    """Spark also reports idle triggers (no new data, every ``noDataProgressEventInterval``) under the id of the
    batch still to come; counting one as that batch would hide the batch's own rows when it runs."""
    return bool(progress.get("numInputRows")) or "addBatch" in (progress.get("durationMs") or {})


def _lag(source_progress: dict[str, Any]) -> dict[str, int]:
    """``topic/partition -> latest - end`` from a Kafka source's progress entry."""

    def offsets(name: str) -> dict[str, dict[str, int]]:
        value = source_progress.get(name)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return {}
        return value if isinstance(value, dict) else {}

    end, latest = offsets("endOffset"), offsets("latestOffset")
    lag: dict[str, int] = {}
    for topic, partitions in latest.items():
        for partition, latest_offset in partitions.items():
            done = end.get(topic, {}).get(partition, 0)
            lag[f"{topic}/{partition}"] = max(int(latest_offset) - int(done), 0)
    return lag
