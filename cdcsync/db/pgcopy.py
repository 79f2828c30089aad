"""Arrow to Postgres ``COPY ... (FORMAT csv)``: the bulk path every Postgres write takes from the executors.

pyarrow writes the CSV in C++; strings are always quoted and NULL is an unquoted empty field, which is exactly
how Postgres' CSV format tells an empty string from NULL. ``bytea`` travels in Postgres' hex input format.
Arrays (Arrow lists) travel as Postgres array literals (``{"1","2",NULL}``: every element quoted, so no element
text needs to be inspected for delimiters), built in Python: they are rare, and pyarrow's CSV writer has no
list support. Dates and timestamps outside years 1-9999 (which pyarrow cannot print) and the infinities
(:mod:`cdcsync.core.temporal`) are rendered in Python too, only for the arrays that hold such a value.
"""

from __future__ import annotations

import io
import math
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cdcsync.core.temporal import (
    PYTHON_MAX_DAYS,
    PYTHON_MAX_MICROS,
    PYTHON_MIN_DAYS,
    PYTHON_MIN_MICROS,
    date_text,
    timestamp_text,
)

if TYPE_CHECKING:
    import pyarrow as pa


def _element_text(value: Any) -> str:
    """One array element as Postgres' input function reads it (inside the quotes of an array literal)."""
    if value is True or value is False:
        return "t" if value else "f"
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    return str(value)  # int, str, date


def array_literal(values: list[Any]) -> str:
    """A Python list (one Arrow list value) as a Postgres array literal."""
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
        else:
            text = _element_text(value).replace("\\", "\\\\").replace('"', '\\"')
            parts.append('"' + text + '"')
    return "{" + ",".join(parts) + "}"


def copy_then_insert(
    dsn: str, statements: tuple[str, str, str], payload: bytes, params: dict[str, Any] | None = None
) -> int:
    """One transaction: create a temp table, COPY ``payload`` into it, then run the insert that moves its rows
    into place (``params`` for that insert); returns the insert's row count. Executors use it for writes that
    must be idempotent (``ON CONFLICT DO NOTHING``), which a plain COPY cannot be. Raises psycopg's errors."""
    import psycopg

    create, copy_sql, insert = statements
    with psycopg.connect(dsn) as conn, conn.transaction(), conn.cursor() as cur:
        cur.execute(create)
        with cur.copy(copy_sql) as copy:
            copy.write(payload)
        return cur.execute(insert, params).rowcount


def _is_temporal(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_date32(data_type) or pa.types.is_timestamp(data_type))


def temporal_as_text(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A date32/timestamp[us] array as Postgres input text when pyarrow cannot print one of its values; else as is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    is_date = pa.types.is_date32(array.type)
    integers = array.cast(pa.int32() if is_date else pa.int64())
    extremes = pc.min_max(integers)
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    safe_low, safe_high = (PYTHON_MIN_DAYS, PYTHON_MAX_DAYS) if is_date else (PYTHON_MIN_MICROS, PYTHON_MAX_MICROS)
    if low is None or (safe_low <= low and high <= safe_high):
        return array
    with_time_zone = not is_date and array.type.tz is not None
    texts = [
        None if value is None else date_text(value) if is_date else timestamp_text(value, with_time_zone=with_time_zone)
        for value in integers.to_pylist()
    ]
    return pa.array(texts, type=pa.string())


def _list_literals(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    import pyarrow as pa

    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    literals: list[str | None] = []
    for chunk in chunks:
        if _is_temporal(chunk.type.value_type):  # elements as text first: Python's dates stop at year 9999
            values = temporal_as_text(chunk.values).to_pylist()
            offsets = chunk.offsets.to_pylist()
            for i, present in enumerate(chunk.is_valid().to_pylist()):
                literals.append(array_literal(values[offsets[i] : offsets[i + 1]]) if present else None)
        else:
            literals.extend(None if v is None else array_literal(v) for v in chunk.to_pylist())
    return pa.array(literals, type=pa.string())


def _utc_text(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A zoned timestamp array as UTC text marked ``Z``.

    pyarrow prints a zoned timestamp through its time-zone database, value by value: about 15 times the cost of a
    naive one, and most of the CSV's cost for a table with two ``timestamptz`` columns. Arrow stores every
    timestamp as a UTC instant whatever its zone, so the naive reading of the same values is the UTC time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    naive = array.cast(pa.timestamp(array.type.unit)).cast(pa.string())
    return pc.binary_join_element_wise(naive, "Z", "")


def arrow_to_copy_csv(arrays: list[pa.Array | pa.ChunkedArray]) -> bytes:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    prepared = []
    for array in arrays:
        if _is_temporal(array.type):
            array = temporal_as_text(array)
            if pa.types.is_timestamp(array.type) and array.type.tz is not None:
                array = _utc_text(array)
        elif pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
            array = pa.array([None if v is None else "\\x" + v.hex() for v in array.to_pylist()], type=pa.string())
        elif pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            array = _list_literals(array)
        prepared.append(array)
    table = pa.Table.from_arrays(prepared, names=[f"c{i}" for i in range(len(prepared))])
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer, write_options=pacsv.WriteOptions(include_header=False, quoting_style="needed"))
    return buffer.getvalue()
