"""The ``type: postgres`` bounded source: its plan and its ranges, each read with ``COPY ... TO STDOUT`` as CSV
(:mod:`cdcsync.sources.bounded`)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcsync.config.bounded import PostgresTableSource
from cdcsync.config.types import PgType
from cdcsync.core.errors import ServiceError, UserError, first_line
from cdcsync.db.executor_errors import task_failure
from cdcsync.sources.bounded import Bound, bound_parameters, range_statements, ranges_as_arrow, which_bounds
from cdcsync.sql.render import render

if TYPE_CHECKING:
    import pyarrow as pa

SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO -c extra_float_digits=3"
"""Text forms Spark casts back exactly: UTC times, ISO dates, floats that round-trip."""


def _not_there() -> tuple[type[Exception], ...]:
    from psycopg import errors

    return (errors.UndefinedTable, errors.UndefinedColumn, errors.InvalidSchemaName)


def key_bounds(dsn: str, source: PostgresTableSource, key: tuple[str, ...]) -> list[list[str]]:
    """The first key of every ``chunk_size / parallelism`` rows, in key order (:mod:`cdcsync.sources.bounded`)."""
    import psycopg

    step = max(source.chunk_size // source.parallelism, 1)
    sql = render("postgres/bounded/key_bounds.sql.j2", schema=source.schema_, table=source.table, key=list(key))
    try:
        with psycopg.connect(dsn, connect_timeout=10, options=SESSION_OPTIONS) as conn:
            return [list(row) for row in conn.execute(sql, {"step": step}).fetchall()]
    except psycopg.Error as error:
        doing = f"{source.label}: planning its key ranges: {first_line(error)}"
        if isinstance(error, _not_there()):  # the pipeline names what the database lacks: exit 2
            raise UserError(doing, hint="check the source's schema, table and primary_key") from None
        raise ServiceError(doing, retriable=isinstance(error, psycopg.OperationalError)) from None


@dataclass(frozen=True)
class PostgresRangeTask:
    """Executor side: ``COPY`` each key range of the task's input rows out of Postgres, as Arrow (picklable)."""

    dsn: str
    statements: dict[str, str]
    """The COPY statement by which ends are bound (:func:`~cdcsync.sources.bounded.which_bounds`)."""
    names: tuple[str, ...]
    label: str

    @classmethod
    def of(
        cls, dsn: str, source: PostgresTableSource, columns: tuple[tuple[str, PgType], ...], key: tuple[str, ...]
    ) -> PostgresRangeTask:
        types = dict(columns)
        values = {
            "schema": source.schema_,
            "table": source.table,
            "columns": [(name, pg.sql) for name, pg in columns],
            "key": [(name, types[name].sql) for name in key],
        }
        statements = range_statements("postgres/bounded/read_range.sql.j2", **values)
        return cls(dsn, statements, tuple(name for name, _ in columns), source.label)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return ranges_as_arrow(batches, self.names, self.read)

    def read(self, lower: Bound, upper: Bound) -> io.BytesIO:
        import psycopg

        buffer = io.BytesIO()
        try:
            with (
                psycopg.connect(self.dsn, connect_timeout=10, options=SESSION_OPTIONS) as conn,
                conn.cursor().copy(self.statements[which_bounds(lower, upper)], bound_parameters(lower, upper)) as copy,
            ):
                for data in copy:
                    buffer.write(data)
        except psycopg.Error as error:  # typed for the driver: retried when Postgres was away
            raise task_failure(f"{self.label}: reading key range {lower}..{upper}", error) from None
        return buffer
