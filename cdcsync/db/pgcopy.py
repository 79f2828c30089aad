"""Arrow to Postgres ``COPY ... (FORMAT csv)``: the bulk path every Postgres write takes from the executors.

pyarrow writes the CSV in C++; strings are always quoted and NULL is an unquoted empty field, which is exactly
how Postgres' CSV format tells an empty string from NULL. ``bytea`` travels in Postgres' hex input format.
Arrays (Arrow lists) travel as Postgres array literals (``{"1","2",NULL}``: every element quoted, so no element
text needs to be inspected for delimiters), built in Python: they are rare, and pyarrow's CSV writer has no
list support.
"""

from __future__ import annotations

import io
import math
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

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


def arrow_to_copy_csv(arrays: list[pa.Array | pa.ChunkedArray]) -> bytes:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    prepared = []
    for array in arrays:
        if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
            array = pa.array([None if v is None else "\\x" + v.hex() for v in array.to_pylist()], type=pa.string())
        elif pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            array = pa.array([None if v is None else array_literal(v) for v in array.to_pylist()], type=pa.string())
        prepared.append(array)
    table = pa.Table.from_arrays(prepared, names=[f"c{i}" for i in range(len(prepared))])
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer, write_options=pacsv.WriteOptions(include_header=False, quoting_style="needed"))
    return buffer.getvalue()
