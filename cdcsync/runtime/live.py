"""How ``cdcsync run`` shows progress: a Rich live table on a terminal, plain log lines elsewhere.

Progress goes to stderr, so stdout stays free for results (and for pipes).
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cdcsync.runtime.progress import RunSnapshot


def render_snapshot(snapshot: RunSnapshot) -> Group:
    sources = Table(title=f"pipeline {snapshot.pipeline}  ({snapshot.elapsed:,.0f}s)", title_justify="left")
    for column in ("source", "last batch", "rows in", "rows/s", "dead letters", "lag"):
        sources.add_column(column, justify="right" if column != "source" else "left")
    for source_id, stats in snapshot.sources.items():
        lag = ", ".join(f"{k.rsplit('/', 1)[1]}:{v:,}" for k, v in sorted(stats.lag.items())) or "-"
        sources.add_row(
            source_id,
            "-" if stats.last_batch_id is None else str(stats.last_batch_id),
            f"{stats.rows_in:,}",
            f"{stats.rows_per_second:,.0f}",
            f"{stats.dead_letters:,}",
            lag,
        )
    sinks = Table()
    for column in ("sink", "target", "batches", "skipped (replayed)", "rows in", "rows out"):
        sinks.add_column(column, justify="right" if column not in ("sink", "target") else "left")
    for sink_id, sink_stats in snapshot.sinks.items():
        sinks.add_row(
            Text(sink_id),
            Text(snapshot.sink_targets.get(sink_id, "")),
            str(sink_stats.batches),
            str(sink_stats.skipped_batches),
            f"{sink_stats.rows_in:,}",
            f"{sink_stats.rows_out:,}",
        )
    waiting = [
        f"{source_id}: retrying {stats.waiting}" for source_id, stats in snapshot.sources.items() if stats.waiting
    ]
    if waiting:
        return Group(sources, sinks, Text("\n".join(waiting), style="yellow"))
    return Group(sources, sinks)


def snapshot_line(snapshot: RunSnapshot) -> str:
    parts = []
    for source_id, stats in snapshot.sources.items():
        lag = sum(stats.lag.values())
        parts.append(
            f"source {source_id}: batch {stats.last_batch_id} rows_in={stats.rows_in} "
            f"rows_per_s={stats.rows_per_second:.0f} dead_letters={stats.dead_letters} lag={lag}"
        )
    for sink_id, sink_stats in snapshot.sinks.items():
        parts.append(
            f"sink {sink_id}: batches={sink_stats.batches} rows_in={sink_stats.rows_in} rows_out={sink_stats.rows_out}"
        )
    return "; ".join(parts)


class ProgressView:
    """Call ``update`` with each snapshot; use as a context manager around the run."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._live: Live | None = None
        self._last_line = ""

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def update(self, snapshot: RunSnapshot) -> None:
        if self._live is not None:
            self._live.update(render_snapshot(snapshot))
            return
        # One line per finished batch, once Spark's progress for it (rows in, lag) has arrived.
        finished = [s for s in snapshot.sources.values() if s.last_batch_id is not None]
        if not finished or any(s.last_batch_id not in s.progress_seen for s in finished):
            return
        line = snapshot_line(snapshot)
        if line != self._last_line:
            self.console.print(line, soft_wrap=True, highlight=False, markup=False)
            self._last_line = line

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
