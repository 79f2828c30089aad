"""The dead-letter table: messages that could not be decoded, kept with their raw bytes and the reason.

Written from the executors like every other Postgres write (COPY into a temp table, then one insert), and
idempotent: ``(pipeline, topic, partition, offset)`` is unique, so a replayed batch records nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcsync.errors import SinkError
from cdcsync.runtime.dbretry import classify_postgres_error
from cdcsync.runtime.executor_errors import RETRIABLE_MARKER, executor_failure
from cdcsync.sinks.pgcopy import arrow_to_copy_csv
from cdcsync.sql.render import render

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

DEAD_LETTER_COLUMNS = ("_cdc_topic", "_cdc_partition", "_cdc_offset", "_dlq_key", "_dlq_value", "_dlq_reason")


@dataclass(frozen=True)
class DeadLetterWriter:
    dsn: str
    pipeline: str
    source_id: str
    statements: tuple[str, str, str]  # create temp table, copy, insert

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psycopg
        import pyarrow as pa

        received = [b for b in batches if b.num_rows]
        written = 0
        if received:
            table = pa.Table.from_batches(received)
            n = table.num_rows
            payload = arrow_to_copy_csv(
                [
                    pa.array([self.pipeline] * n, pa.string()),
                    pa.array([self.source_id] * n, pa.string()),
                    *(table.column(c) for c in DEAD_LETTER_COLUMNS),
                ]
            )
            create, copy_sql, insert = self.statements
            try:
                with psycopg.connect(self.dsn) as conn, conn.transaction(), conn.cursor() as cur:
                    cur.execute(create)
                    with cur.copy(copy_sql) as copy:
                        copy.write(payload)
                    written = cur.execute(insert).rowcount
            except psycopg.Error as error:
                marker = f" {RETRIABLE_MARKER}" if classify_postgres_error(error) else ""
                raise RuntimeError(f"recording dead letters failed: {error}{marker}") from None
        yield pa.RecordBatch.from_pydict({"rows": [written]}, schema=pa.schema([("rows", pa.int64())]))


def record_dead_letters(bad_rows: DataFrame, dsn: str, pipeline: str, source_id: str) -> int:
    """Write the batch's undecodable messages; returns how many were new."""
    writer = DeadLetterWriter(
        dsn=dsn,
        pipeline=pipeline,
        source_id=source_id,
        statements=(
            render("postgres/runtime/dead_letters_temp.sql.j2"),
            render("postgres/runtime/dead_letters_copy.sql.j2"),
            render("postgres/runtime/dead_letters_insert.sql.j2"),
        ),
    )
    try:
        rows = bad_rows.select(*DEAD_LETTER_COLUMNS).mapInArrow(writer, "rows bigint").collect()
    except Exception as error:  # Spark wraps executor failures; see executor_failure
        detail, retriable = executor_failure(error)
        raise SinkError(f"recording dead letters: {detail}", retriable=retriable) from None
    return sum(row["rows"] for row in rows)
