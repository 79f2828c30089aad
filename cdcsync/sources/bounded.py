"""Reading a Postgres table once, in chunks of key ranges (the ``type: postgres`` bounded source).

The plan: the driver asks Postgres for the first key of every ``chunk_size / parallelism`` rows in key order (one
scan of the key, ``templates/postgres/bounded/key_bounds.sql.j2``); consecutive keys bound the ranges, and
``parallelism`` consecutive ranges make a chunk. The plan is computed once and kept with the source's progress
(:mod:`cdcsync.runtime.bounded`), so a restart reads the same chunks whatever the table did meanwhile.

A chunk is read on the executors, one Spark task per range, each with its own ``COPY (SELECT ...) TO STDOUT``
as CSV, parsed by Arrow (:class:`ReadRangesTask`). Executors rather than driver threads: the rows then never
pass through the driver, the ranges of a chunk run on as many cores as the cluster gives, and the read is lazy,
so a chunk every sink already holds is skipped without reading it. The text forms are cast by Spark to the
columns' types, the same Spark types the Debezium decoder gives (:mod:`cdcsync.config.types`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcsync.config.bounded import PostgresTableSource
from cdcsync.config.types import PgType
from cdcsync.core.errors import ServiceError
from cdcsync.db.executor_errors import task_failure
from cdcsync.sql.render import render

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

Bound = list[str] | None
"""A key as the text forms of its columns; None for an open end."""
_SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO -c extra_float_digits=3"
"""Text forms Spark casts back exactly: UTC times, ISO dates, floats that round-trip."""


def key_bounds(dsn: str, source: PostgresTableSource, key: tuple[str, ...]) -> list[list[str]]:
    """The first key of every ``chunk_size / parallelism`` rows, in key order (module doc)."""
    import psycopg

    step = max(source.chunk_size // source.parallelism, 1)
    sql = render("postgres/bounded/key_bounds.sql.j2", schema=source.schema_, table=source.table, key=list(key))
    try:
        with psycopg.connect(dsn, connect_timeout=10, options=_SESSION_OPTIONS) as conn:
            return [list(row) for row in conn.execute(sql, {"step": step}).fetchall()]
    except psycopg.Error as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        retriable = isinstance(error, psycopg.OperationalError)
        raise ServiceError(f"{source.label}: planning its key ranges: {first_line}", retriable=retriable) from None


def chunk_count(bounds: list[list[str]], parallelism: int) -> int:
    """Chunks of a plan: ``parallelism`` ranges each; an empty table is one chunk (of one open range)."""
    return max(-(-len(bounds) // parallelism), 1)


def chunk_ranges(bounds: list[list[str]], parallelism: int, chunk: int) -> list[tuple[Bound, Bound]]:
    """The (lower, upper) key ranges of chunk ``chunk``: the first range is open below, the last open above, so
    keys inserted after the plan below the first bound or above the last are read too."""
    if not bounds:
        return [(None, None)]
    first = chunk * parallelism
    ranges: list[tuple[Bound, Bound]] = []
    for index in range(first, min(first + parallelism, len(bounds))):
        lower = bounds[index] if index > 0 else None
        upper = bounds[index + 1] if index + 1 < len(bounds) else None
        ranges.append((lower, upper))
    return ranges


@dataclass(frozen=True)
class ReadRangesTask:
    """Executor side: ``COPY`` each key range of the task's input rows out of Postgres, as Arrow (picklable)."""

    dsn: str
    statements: dict[str, str]
    """The COPY statement by which ends are bound (``lu``, ``l``, ``u``, ``""``)."""
    names: tuple[str, ...]
    label: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psycopg

        for batch in batches:
            for lower_json, upper_json in zip(
                batch.column("lower").to_pylist(), batch.column("upper").to_pylist(), strict=True
            ):
                lower, upper = json.loads(lower_json), json.loads(upper_json)
                params = {f"lo{i}": value for i, value in enumerate(lower or [])}
                params.update({f"hi{i}": value for i, value in enumerate(upper or [])})
                which = ("l" if lower is not None else "") + ("u" if upper is not None else "")
                buffer = io.BytesIO()
                try:
                    with (
                        psycopg.connect(self.dsn, connect_timeout=10, options=_SESSION_OPTIONS) as conn,
                        conn.cursor().copy(self.statements[which], params) as copy,
                    ):
                        for data in copy:
                            buffer.write(data)
                except psycopg.Error as error:  # typed for the driver: retried when Postgres was away
                    raise task_failure(f"{self.label}: reading key range {lower}..{upper}", error) from None
                yield from self._parse(buffer).to_batches()

    def _parse(self, buffer: io.BytesIO) -> pa.Table:
        import pyarrow as pa
        from pyarrow import csv

        if not buffer.getbuffer().nbytes:
            return pa.table({name: pa.array([], pa.string()) for name in self.names})
        buffer.seek(0)
        return csv.read_csv(
            buffer,
            read_options=csv.ReadOptions(column_names=list(self.names)),
            parse_options=csv.ParseOptions(newlines_in_values=True),
            convert_options=csv.ConvertOptions(
                column_types={name: pa.string() for name in self.names},
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
                null_values=[""],
            ),
        )


def read_ranges(
    spark: SparkSession,
    dsn: str,
    source: PostgresTableSource,
    columns: tuple[tuple[str, PgType], ...],
    key: tuple[str, ...],
    ranges: list[tuple[Bound, Bound]],
) -> DataFrame:
    """A DataFrame of the rows in ``ranges`` (one partition each), typed as ``columns`` declares; lazy."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    types = dict(columns)
    column_types = [(name, pg.sql) for name, pg in columns]
    key_types = [(name, types[name].sql) for name in key]
    statements = {
        ("l" if lower else "") + ("u" if upper else ""): render(
            "postgres/bounded/read_range.sql.j2",
            schema=source.schema_,
            table=source.table,
            columns=column_types,
            key=key_types,
            lower=lower,
            upper=upper,
        )
        for lower in (True, False)
        for upper in (True, False)
    }
    names = tuple(name for name, _ in columns)
    task = ReadRangesTask(dsn, statements, names, source.label)
    rows = [(json.dumps(lower), json.dumps(upper)) for lower, upper in ranges]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(rows)), "lower string, upper string")
    text = frame.mapInArrow(task, StructType([StructField(name, StringType()) for name in names]))
    return text.select(
        *(
            (F.unhex(F.col(name)) if pg.name == "bytea" else F.col(name).cast(pg.spark_type)).alias(name)
            for name, pg in columns
        )
    )
