"""Reading a table once, in chunks of key ranges: the bounded sources (``type: postgres``, ``type: clickhouse``).

The plan: the driver asks the database for the first key of every ``chunk_size / parallelism`` rows in key order
(one scan of the key: ``templates/<database>/bounded/key_bounds.sql.j2``); consecutive keys bound the ranges, and
``parallelism`` consecutive ranges make a chunk (a ClickHouse source's page). The plan is computed once and kept
with the source's progress (:mod:`cdcsync.runtime.bounded`), so a restart reads the same chunks whatever the table
did meanwhile.

A chunk is read on the executors, one Spark task per range, as CSV parsed by Arrow (:mod:`.postgres`: ``COPY``;
:mod:`.clickhouse`: a ``SELECT`` over clickhouse-connect). Executors rather than driver threads: the rows then never
pass through the driver, the ranges of a chunk run on as many cores as the cluster gives, and the read is lazy,
so a chunk every sink already holds is skipped without reading it. Spark casts the text forms to the columns'
types, the same Spark types the Debezium decoder gives (:mod:`cdcsync.config.types`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from cdcsync.config.types import PgType

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

Bound = list[str] | None
"""A key as the text forms of its columns; None for an open end."""
RangeReader = Callable[[Bound, Bound], io.BytesIO]
"""Reads one key range as CSV (executor side)."""


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


def which_bounds(lower: Bound, upper: Bound) -> str:
    """The statement variant for a range: ``lu``, ``l``, ``u`` or ``""`` by which ends are bound."""
    return ("l" if lower is not None else "") + ("u" if upper is not None else "")


def range_statements(template: str, **values: object) -> dict[str, str]:
    """``template`` rendered for each variant of a range (:func:`which_bounds`): both ends bound, one, none."""
    from cdcsync.sql.render import render

    return {
        which_bounds([""] if lower else None, [""] if upper else None): render(
            template, lower=lower, upper=upper, **values
        )
        for lower in (True, False)
        for upper in (True, False)
    }


def bound_parameters(lower: Bound, upper: Bound) -> dict[str, str]:
    """``lo0``.. and ``hi0``..: the bounds' key values, as the range templates name them."""
    params = {f"lo{i}": value for i, value in enumerate(lower or [])}
    params.update({f"hi{i}": value for i, value in enumerate(upper or [])})
    return params


def ranges_as_arrow(
    batches: Iterator[pa.RecordBatch], names: tuple[str, ...], read: RangeReader
) -> Iterator[pa.RecordBatch]:
    """Executor side of a range read: each input row a range (JSON bounds), read as CSV, parsed to strings."""
    for batch in batches:
        lowers, uppers = batch.column("lower").to_pylist(), batch.column("upper").to_pylist()
        for lower_json, upper_json in zip(lowers, uppers, strict=True):
            yield from parse_csv(read(json.loads(lower_json), json.loads(upper_json)), names).to_batches()


def parse_csv(buffer: io.BytesIO, names: tuple[str, ...]) -> pa.Table:
    """CSV as both databases write it: NULL unquoted and empty, an empty string quoted; every column a string."""
    import pyarrow as pa
    from pyarrow import csv

    if not buffer.getbuffer().nbytes:
        return pa.table({name: pa.array([], pa.string()) for name in names})
    buffer.seek(0)
    return csv.read_csv(
        buffer,
        read_options=csv.ReadOptions(column_names=list(names)),
        parse_options=csv.ParseOptions(newlines_in_values=True),
        convert_options=csv.ConvertOptions(
            column_types={name: pa.string() for name in names},
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            null_values=[""],
        ),
    )


def read_ranges(
    spark: SparkSession,
    task: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    columns: tuple[tuple[str, PgType], ...],
    ranges: list[tuple[Bound, Bound]],
) -> DataFrame:
    """A DataFrame of the rows ``task`` reads for ``ranges`` (one partition each), typed as ``columns``; lazy."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    rows = [(json.dumps(lower), json.dumps(upper)) for lower, upper in ranges]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(rows)), "lower string, upper string")
    text = frame.mapInArrow(task, StructType([StructField(name, StringType()) for name, _ in columns]))
    return text.select(*(typed(F.col(name), pg).alias(name) for name, pg in columns))


def typed(text: Column, pg: PgType) -> Column:
    """A column's text form as its Spark type: cast (the forms are the ones Spark's casts read), bytea from hex,
    an array (a JSON list of its elements' text forms) element by element the same way (a bytea element as
    Postgres writes it, ``\\x`` then hex)."""
    from pyspark.sql import functions as F

    if pg.name == "bytea":
        return F.unhex(text)
    if pg.element is None:
        return text.cast(pg.spark_type)
    elements = F.from_json(text, "array<string>")
    if pg.element.name == "bytea":
        return F.transform(elements, lambda element: F.unhex(F.substring(element, 3, 2**31 - 1)))
    return elements.cast(pg.spark_type)
