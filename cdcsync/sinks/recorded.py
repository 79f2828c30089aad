"""Driver side of a sink whose executor tasks write the target themselves (ClickHouse, print, blackhole,
webhook): the driver only looks the batch up in the ledger before and records it after.

Such a sink's effects are exactly once only as far as its writes are idempotent on a replay: ClickHouse's
deduplication tokens, a webhook receiver that drops repeated idempotency keys. A batch whose writes were done but
not yet recorded (a crash between the two) is written again when it is replayed.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from cdcsync.db.ledger import LedgeredSink


class RecordedSink(LedgeredSink):
    def key_prefix(self, checkpoint_id: str, batch_id: int) -> str:
        """``<pipeline>/<sink>/<checkpoint id>/<batch id>`` (each quoted): the start of the idempotency keys of a
        batch's writes; a task adds the Kafka range it read (the same on a replay) and the part."""
        parts = (self.pipeline.name, self.sink_id, checkpoint_id, str(batch_id))
        return "/".join(quote(part, safe="") for part in parts)

    def prepare(self, ledger_key: dict[str, Any]) -> bool:
        """False when the ledger already holds this batch with the same offset ranges (it landed before)."""
        return self.not_landed(ledger_key)

    def merge(self, ledger_key: dict[str, Any], rows_staged: int = 0) -> int | None:
        """Record the batch (its writes are done) in the ledger; None if another attempt recorded it first."""
        return rows_staged if self.record_landed(ledger_key, rows_staged) else None
