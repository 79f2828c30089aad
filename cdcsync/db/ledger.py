"""What every sink's driver side shares: its name in errors and its rows in ``cdcsync.batch_ledger``.

The batch ledger lives in Postgres for every sink, ClickHouse ones included: one row per (pipeline, sink,
checkpoint, batch) that landed, so that a replayed micro-batch is recognised and skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import SinkError
from cdcsync.db.retry import classify_postgres_error
from cdcsync.sql.render import render

if TYPE_CHECKING:
    from cdcsync.config.pipeline import Pipeline


class LedgeredSink:
    def __init__(self, pipeline: Pipeline, sink_id: str, dsn: str) -> None:
        self.pipeline = pipeline
        self.sink_id = sink_id
        self.dsn = dsn
        """The Postgres database holding the ledger (and, for Postgres sinks, the target)."""
        self._ledger_lookup_sql = render("postgres/runtime/ledger_lookup.sql.j2")
        self._ledger_record_sql = render("postgres/runtime/ledger_record.sql.j2")
        self._ledger_rows_sql = render("postgres/runtime/ledger_rows_written.sql.j2")

    @property
    def label(self) -> str:
        return f"sink '{self.sink_id}'"

    def ledger_key(self, batch_id: int, checkpoint_id: str) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline.name,
            "sink": self.sink_id,
            "checkpoint_id": checkpoint_id,
            "batch_id": batch_id,
        }

    def _error(self, doing: str, error: Exception) -> SinkError:
        """A Postgres failure as this sink's error: what it was doing, the first line of the cause, retriable
        when a retry may help."""
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        failure = SinkError(f"{doing}: {message}", retriable=classify_postgres_error(error))
        return failure.add_context(self.label)  # type: ignore[return-value]
