"""Dates and timestamps in the range ClickHouse holds.

Postgres dates run from 4714 BC to 5874897 AD and timestamps to 294276 AD, each with ``±infinity``; ClickHouse's
``Date32`` and ``DateTime64`` hold 0000-01-01 to 9999-12-31 (measured on the dev stack's server, 26.9; older
servers hold less, 1900-2299). Outside it, ClickHouse refuses a ``Date32`` but silently saturates or wraps a
``DateTime64``, which would land a wrong value. So before an insert:

* ``infinity`` / ``-infinity`` (the decoder's sentinels, :mod:`cdcsync.core.temporal`) become the last and first
  instant ClickHouse holds, which keeps their order against every other value (documented in docs/clickhouse.md);
* any other value outside the range stops the run with an error naming the sink, the column and the value: it
  is not retried, and nothing is lost (the batch is not ledgered; Kafka still holds it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cdcsync.core.reports import ReportedFailure, write_failed
from cdcsync.core.temporal import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    MICROS_PER_DAY,
    TIMESTAMP_NEGATIVE_INFINITY,
    TIMESTAMP_POSITIVE_INFINITY,
    date_text,
    timestamp_text,
)

if TYPE_CHECKING:
    import pyarrow as pa

MIN_DAYS = -719_528  # 0000-01-01 in ClickHouse (ISO year 0): 0001-01-01 BC in Postgres
MAX_DAYS = 2_932_896  # 9999-12-31
MIN_MICROS = MIN_DAYS * MICROS_PER_DAY
MAX_MICROS = (MAX_DAYS + 1) * MICROS_PER_DAY - 1  # 9999-12-31 23:59:59.999999


def fit_temporal_columns(table: pa.Table, columns: tuple[str, ...], sink_label: str) -> pa.Table:
    """``table`` with the infinities of its date and timestamp columns (also inside arrays) at ClickHouse's ends;
    raises (not retriable) on any other value ClickHouse cannot hold."""
    for name in columns:
        column = table.column(name)
        if not _holds_temporal(column.type):  # most columns: no copy, no scan
            continue
        fitted = _fit(column.combine_chunks(), f"{sink_label}: column '{name}'")
        if fitted is not None:
            table = table.set_column(table.schema.get_field_index(name), name, fitted)
    return table


def _holds_temporal(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    while pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        data_type = data_type.value_type
    return pa.types.is_date32(data_type) or pa.types.is_timestamp(data_type)


def _fit(array: pa.Array, where: str) -> pa.Array | None:
    """The fitted array, or None when ``array`` holds no date or timestamp (or needs no change)."""
    import pyarrow as pa

    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = _fit(array.values, where)
        if values is None:
            return None
        return type(array).from_arrays(array.offsets, values, type=array.type, mask=array.is_null())
    if pa.types.is_date32(array.type):
        return _fit_ints(
            array, pa.int32(), (DATE_NEGATIVE_INFINITY, DATE_POSITIVE_INFINITY), (MIN_DAYS, MAX_DAYS), where, date_text
        )
    if pa.types.is_timestamp(array.type) and array.type.unit == "us":
        return _fit_ints(
            array,
            pa.int64(),
            (TIMESTAMP_NEGATIVE_INFINITY, TIMESTAMP_POSITIVE_INFINITY),
            (MIN_MICROS, MAX_MICROS),
            where,
            lambda v: timestamp_text(v, with_time_zone=array.type.tz is not None),
        )
    return None


def _fit_ints(
    array: pa.Array,
    storage: pa.DataType,
    infinities: tuple[int, int],
    bounds: tuple[int, int],
    where: str,
    show: Callable[[int], str],
) -> pa.Array | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    ints = array.cast(storage)
    low, high = (pa.scalar(bound, storage) for bound in bounds)
    negative, positive = (pc.equal(ints, pa.scalar(value, storage)) for value in infinities)
    outside = pc.and_(pc.or_(pc.less(ints, low), pc.greater(ints, high)), pc.invert(pc.or_(negative, positive)))
    if pc.any(outside).as_py():
        value = ints.filter(outside)[0].as_py()
        raise ReportedFailure(
            write_failed(
                f"{where} holds {show(value)}, outside what ClickHouse's Date32/DateTime64 can store "
                "(0001-01-01 BC, ClickHouse's year 0000, to 9999-12-31); map or filter the value in a transform "
                "before this sink",
                retriable=False,
            )
        )
    if not (pc.any(negative).as_py() or pc.any(positive).as_py()):
        return None
    fitted = pc.if_else(negative, low, pc.if_else(positive, high, ints))
    return fitted.cast(array.type)
