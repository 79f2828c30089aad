"""The ``webhook`` sink: batches of changes POSTed as JSON, at least once, each request with an idempotency key.

How a micro-batch lands (orchestrated by :mod:`cdcsync.engine.batch`, like every sink):

1. the driver looks the batch up in the ledger; a batch recorded there is skipped;
2. each executor task splits its partition's changes, in offset order, into parts of at most ``batch_size`` and
   POSTs them one after the other (the driver never sees the rows). A transient failure (connection, timeout, 5xx,
   408, 429) is retried with backoff within the retry budget (``CDCSYNC__RETRY__BUDGET_S``), then fails the batch
   as retriable; any other 4xx stops the run as the user's to fix (exit 2);
3. the driver records the batch in the ledger.

A crash, a kill or a failed part between 2 and 3 sends the batch again when it is replayed, so a receiver sees
every change at least once. Each request carries ``Idempotency-Key: <pipeline>/<sink>/<checkpoint id>/<batch
id>/<Kafka range the task read>/<part>``: Spark replays a batch with the offsets its checkpoint recorded, so a
replayed part carries the same key and the same changes, and a receiver that keeps the keys it has seen counts
every change exactly once.

Body: ``{"pipeline", "sink", "batch_id", "part", "idempotency_key", "changes": [...]}``, each change as
:mod:`cdcsync.core.changes_json` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdcsync.config.operators import IDEMPOTENCY_HEADER
from cdcsync.core import changes_json
from cdcsync.core.errors import CdcsyncError, TargetRefused
from cdcsync.core.reports import ReportedFailure, refused, write_failed
from cdcsync.db.http import post_json, shown_url
from cdcsync.db.retry import RetryBudget, with_retries
from cdcsync.sinks.clickhouse import deduplication_token
from cdcsync.sinks.recorded import RecordedSink

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.config.operators import WebhookSink
    from cdcsync.config.pipeline import Pipeline


@dataclass(frozen=True)
class WebhookWriter:
    """Executor side (picklable): POST one task's changes in parts."""

    url: str
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    """Never in a message or a log line: they may hold credentials."""
    timeout_s: float
    batch_size: int
    key_prefix: str
    """``<pipeline>/<sink>/<checkpoint id>/<batch id>``, each part quoted; the task adds its range and part."""
    pipeline: str
    sink_id: str
    batch_id: int
    budget: RetryBudget

    def stage(self, table: pa.Table) -> int:
        if table.num_rows == 0:
            return 0
        task_key = deduplication_token(self.key_prefix, table)  # the Kafka range this task read: same on replay
        changes = changes_json.rows(table)
        for part, start in enumerate(range(0, len(changes), self.batch_size)):
            key = f"{task_key}/{part}"
            body = changes_json.dumps(
                {
                    "pipeline": self.pipeline,
                    "sink": self.sink_id,
                    "batch_id": self.batch_id,
                    "part": part,
                    "idempotency_key": key,
                    "changes": changes[start : start + self.batch_size],
                }
            )
            self._send(key, body)
        return len(changes)

    def _send(self, key: str, body: bytes) -> None:
        doing = f"sink '{self.sink_id}': sending batch {self.batch_id} to {shown_url(self.url)} ({key})"
        headers = {**dict(self.headers), IDEMPOTENCY_HEADER: key}
        try:
            with_retries(lambda: post_json(self.url, body, headers, self.timeout_s), describe=doing, budget=self.budget)
        except TargetRefused as error:
            raise ReportedFailure(refused(f"{doing}: {error.message}")) from None
        except CdcsyncError as error:
            raise ReportedFailure(write_failed(str(error), retriable=error.retriable)) from None


class WebhookTableSink(RecordedSink):
    """Driver side of one ``type: webhook`` sink."""

    def __init__(self, pipeline: Pipeline, sink_id: str, sink: WebhookSink, dsn: str, budget: RetryBudget) -> None:
        super().__init__(pipeline, sink_id, dsn)
        self.sink = sink
        self.budget = budget

    @property
    def target_name(self) -> str:
        return shown_url(self.sink.url)

    def stage_writer(self, batch_id: int, checkpoint_id: str = "") -> WebhookWriter:
        return WebhookWriter(
            url=self.sink.url,
            headers=tuple(self.sink.headers.items()),
            timeout_s=self.sink.timeout_s,
            batch_size=self.sink.batch_size,
            key_prefix=self.key_prefix(checkpoint_id, batch_id),
            pipeline=self.pipeline.name,
            sink_id=self.sink_id,
            batch_id=batch_id,
            budget=self.budget,
        )
