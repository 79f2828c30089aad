"""Changes as JSON documents, for sinks that hand them to people or other systems (print, webhook).

One object per change: the business columns, then the ``_cdc_*`` columns, in the stream's order. Values keep
their precision: numerics (and 128-bit versions) as strings, bytes as base64, dates and timestamps as the text
Postgres prints for them (``2024-05-01``, ``2024-05-01 10:00:00.000000+00`` in UTC), which also holds
``infinity``, ``BC`` and years past 9999 (see :mod:`cdcsync.core.temporal`).
"""

from __future__ import annotations

import base64
import datetime
import decimal
from typing import TYPE_CHECKING, Any

from cdcsync.core import temporal

if TYPE_CHECKING:
    import pyarrow as pa

OP_WORDS = {"c": "INSERT", "r": "READ", "u": "UPDATE", "d": "DELETE", "t": "TRUNCATE"}
"""How the print sink names each Debezium op (Streamling prints the row kind first)."""


def _default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write a {type(value).__name__} as JSON")


def rows(table: pa.Table) -> list[dict[str, Any]]:
    """The changes of ``table`` as JSON-ready dicts (see the module doc), in row order."""
    import pyarrow as pa

    columns: dict[str, list[Any]] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        if pa.types.is_decimal(kind):
            columns[name] = [None if v is None else str(v) for v in column.to_pylist()]
        elif pa.types.is_date32(kind):
            days = column.cast(pa.int32()).to_pylist()
            columns[name] = [None if d is None else temporal.date_text(d) for d in days]
        elif pa.types.is_timestamp(kind):
            zoned = kind.tz is not None
            micros = column.cast(pa.timestamp("us", tz=kind.tz)).cast(pa.int64()).to_pylist()
            columns[name] = [None if m is None else temporal.timestamp_text(m, with_time_zone=zoned) for m in micros]
        else:
            columns[name] = column.to_pylist()
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def dumps(document: Any) -> bytes:
    """``document`` as compact JSON (orjson: datetimes in RFC 3339)."""
    import orjson

    return orjson.dumps(document, default=_default)
