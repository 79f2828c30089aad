"""The dead-letter table: messages that could not be decoded, kept with their raw bytes and the reason.

Written from the executors by the decoding tasks themselves (COPY into a temp table, then one insert), and
idempotent: ``(pipeline, topic, partition, offset)`` is unique, so a retried task or a replayed batch records
nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdcsync.db.executor_errors import task_failure
from cdcsync.db.pgcopy import arrow_to_copy_csv, copy_then_insert
from cdcsync.sql.render import render

if TYPE_CHECKING:
    import pyarrow as pa

DEAD_LETTER_COLUMNS = ("_cdc_topic", "_cdc_partition", "_cdc_offset", "_dlq_key", "_dlq_value", "_dlq_reason")


def _statements() -> tuple[str, str, str]:
    return (
        render("postgres/runtime/dead_letters_temp.sql.j2"),
        render("postgres/runtime/dead_letters_copy.sql.j2"),
        render("postgres/runtime/dead_letters_insert.sql.j2"),
    )


@dataclass(frozen=True)
class DeadLetterWriter:
    """Picklable; rendered on the driver, used on the executors."""

    dsn: str
    pipeline: str
    source_id: str
    statements: tuple[str, str, str] = field(default_factory=_statements)  # create temp table, copy, insert

    def write(self, bad: pa.RecordBatch | pa.Table) -> int:
        """Record the undecodable messages of ``bad`` (decoder output rows); returns how many were new."""
        import psycopg
        import pyarrow as pa

        n = bad.num_rows
        payload = arrow_to_copy_csv(
            [
                pa.array([self.pipeline] * n, pa.string()),
                pa.array([self.source_id] * n, pa.string()),
                *(bad.column(c) for c in DEAD_LETTER_COLUMNS),
            ]
        )
        try:
            return copy_then_insert(self.dsn, self.statements, payload)
        except psycopg.Error as error:
            raise task_failure(f"recording dead letters of source '{self.source_id}' failed", error) from None
