"""Arrow to Postgres ``COPY ... (FORMAT csv)``: the bulk path every Postgres write takes from the executors.

pyarrow writes the CSV in C++; strings are always quoted and NULL is an unquoted empty field, which is exactly
how Postgres' CSV format tells an empty string from NULL. ``bytea`` travels in Postgres' hex input format.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


def arrow_to_copy_csv(arrays: list[pa.Array | pa.ChunkedArray]) -> bytes:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    prepared = []
    for array in arrays:
        if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
            array = pa.array([None if v is None else "\\x" + v.hex() for v in array.to_pylist()], type=pa.string())
        prepared.append(array)
    table = pa.Table.from_arrays(prepared, names=[f"c{i}" for i in range(len(prepared))])
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer, write_options=pacsv.WriteOptions(include_header=False, quoting_style="needed"))
    return buffer.getvalue()
