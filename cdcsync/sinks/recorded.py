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
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                return not self.landed(conn, ledger_key)
        except psycopg.Error as error:
            raise self._error(f"preparing batch {ledger_key['batch_id']}", error) from None

    def merge(self, ledger_key: dict[str, Any], rows_staged: int = 0) -> int | None:
        """Record the batch (its writes are done) in the ledger; None if another attempt recorded it first."""
        import psycopg

        try:
            with psycopg.connect(self.dsn) as conn, conn.transaction():
                if conn.execute(self._ledger_record_sql, ledger_key).rowcount == 0:
                    return None
                conn.execute(self._ledger_rows_sql, {**ledger_key, "rows_written": rows_staged})
        except psycopg.Error as error:
            raise self._error(f"recording batch {ledger_key['batch_id']} in the ledger", error) from None
        return rows_staged
