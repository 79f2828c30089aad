"""The dead-letter table: messages that could not be decoded, kept with their raw bytes and the reason.

Written from the executors by the decoding tasks themselves (COPY into a temp table, then one insert), and
idempotent: ``(pipeline, topic, partition, offset)`` is unique, so a retried task or a replayed batch records
nothing twice. ``cdcsync dead-letters replay`` reads them back (:func:`read_dead_letters`) and removes those it
applied (:func:`settle_replayed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdcsync.db.executor_errors import task_failure
from cdcsync.db.pgcopy import arrow_to_copy_csv, copy_then_insert
from cdcsync.sql.render import render

if TYPE_CHECKING:
    from datetime import datetime

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


@dataclass(frozen=True)
class DeadLetter:
    """One row of ``cdcsync.dead_letters``."""

    id: int
    source: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    failed_at: datetime

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}@{self.offset}"


def read_dead_letters(dsn: str, pipeline: str) -> list[DeadLetter]:
    """The pipeline's dead letters, by source and then in Kafka order."""
    import psycopg

    with psycopg.connect(dsn, connect_timeout=10) as conn:
        rows = conn.execute(render("postgres/runtime/dead_letters_list.sql.j2"), {"pipeline": pipeline}).fetchall()
    return [
        DeadLetter(
            id=row[0],
            source=row[1],
            topic=row[2],
            partition=row[3],
            offset=row[4],
            key=bytes(row[5]) if row[5] is not None else None,
            value=bytes(row[6]) if row[6] is not None else None,
            reason=row[7],
            failed_at=row[8],
        )
        for row in rows
    ]


def settle_replayed(dsn: str, pipeline: str, applied: list[int], still_failing: dict[int, str]) -> None:
    """After a replay landed ``applied`` in every sink: remove them, and give the others the reason they fail
    with now; one transaction."""
    import psycopg

    with psycopg.connect(dsn, connect_timeout=10) as conn, conn.transaction():
        if applied:
            conn.execute(render("postgres/runtime/dead_letters_delete.sql.j2"), {"pipeline": pipeline, "ids": applied})
        with conn.cursor() as cur:
            cur.executemany(
                render("postgres/runtime/dead_letters_reason.sql.j2"),
                [{"pipeline": pipeline, "id": id_, "reason": reason} for id_, reason in still_failing.items()],
            )
