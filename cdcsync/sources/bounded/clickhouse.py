"""The ``type: clickhouse`` bounded source (Streamling's): its plan and its pages, each page's key ranges read with a
``SELECT`` over clickhouse-connect as CSV (:mod:`cdcsync.sources.bounded`)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.config.bounded import ClickHouseTableSource
from cdcsync.config.clickhouse_types import base_type
from cdcsync.config.types import PgType
from cdcsync.core.errors import UserError
from cdcsync.core.reports import ReportedFailure, write_failed
from cdcsync.db.clickhouse import connect, first_line, is_retriable, wrap_clickhouse_error
from cdcsync.sources.bounded import Bound, bound_parameters, range_statements, ranges_as_arrow, which_bounds
from cdcsync.sql.render import render

if TYPE_CHECKING:
    import pyarrow as pa

_NOT_THERE = frozenset({47, 60, 81})
"""UNKNOWN_IDENTIFIER, UNKNOWN_TABLE, UNKNOWN_DATABASE."""
CSV_SETTINGS: dict[str, Any] = {"format_csv_null_representation": ""}
"""NULL as an unquoted empty field, as Postgres writes it (strings are always quoted)."""


def key_bounds(url: str, source: ClickHouseTableSource, key: tuple[str, ...]) -> list[list[str]]:
    """The first key of every ``page_size / parallelism`` rows, in key order (:mod:`cdcsync.sources.bounded`)."""
    step = max(source.page_size // source.parallelism, 1)
    values = {"database": source.database, "table": source.table, "key": list(key), "final": source.final}
    try:
        client = connect(url)
        try:
            rows = client.query(render("clickhouse/bounded/key_bounds.sql.j2", **values), parameters={"step": step})
            return [[str(value) for value in row] for row in rows.result_rows]
        finally:
            client.close()
    except Exception as error:
        doing = f"{source.label}: planning its key ranges"
        if getattr(error, "code", None) in _NOT_THERE:  # the pipeline names what the server lacks: exit 2
            raise UserError(
                f"{doing}: {first_line(error)}", hint="check the source's database, table and key"
            ) from None
        raise wrap_clickhouse_error(error, doing) from None


@dataclass(frozen=True)
class ClickHouseRangeTask:
    """Executor side: read each key range of the task's input rows out of ClickHouse, as Arrow (picklable)."""

    url: str
    statements: dict[str, str]
    """The SELECT by which ends are bound (:func:`~cdcsync.sources.bounded.which_bounds`)."""
    names: tuple[str, ...]
    label: str

    @classmethod
    def of(
        cls, url: str, source: ClickHouseTableSource, columns: tuple[tuple[str, PgType], ...], key: tuple[str, ...]
    ) -> ClickHouseRangeTask:
        types = dict(columns)
        values = {
            "database": source.database,
            "table": source.table,
            "final": source.final,
            "columns": [(name, pg.sql) for name, pg in columns],
            "key": [(name, base_type(types[name])) for name in key],
        }
        statements = range_statements("clickhouse/bounded/read_range.sql.j2", **values)
        return cls(url, statements, tuple(name for name, _ in columns), source.label)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return ranges_as_arrow(batches, self.names, self.read)

    def read(self, lower: Bound, upper: Bound) -> io.BytesIO:
        statement = self.statements[which_bounds(lower, upper)]
        try:
            client = connect(self.url)
            try:
                body = client.raw_query(statement, bound_parameters(lower, upper), settings=CSV_SETTINGS, fmt="CSV")
            finally:
                client.close()
        except Exception as error:  # typed for the driver: retried when ClickHouse was away
            doing = f"{self.label}: reading key range {lower}..{upper}: {first_line(error)}"
            raise ReportedFailure(write_failed(doing, retriable=is_retriable(error))) from None
        return io.BytesIO(body)
