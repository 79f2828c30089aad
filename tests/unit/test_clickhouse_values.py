"""Dates and timestamps fitted to what ClickHouse holds before an insert (cdcsync.sinks.clickhouse_values)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cdcsync.core.reports import ReportedFailure
from cdcsync.core.temporal import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    TIMESTAMP_NEGATIVE_INFINITY,
    TIMESTAMP_POSITIVE_INFINITY,
)
from cdcsync.sinks.clickhouse_values import MAX_DAYS, MAX_MICROS, MIN_DAYS, MIN_MICROS, fit_temporal_columns

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")


def test_infinities_land_at_clickhouses_ends_and_other_values_are_kept() -> None:
    table = pa.table(
        {
            "d": pa.array([DATE_POSITIVE_INFINITY, DATE_NEGATIVE_INFINITY, MIN_DAYS, MAX_DAYS, None], pa.date32()),
            "ts": pa.array([TIMESTAMP_NEGATIVE_INFINITY, 0, MAX_MICROS, TIMESTAMP_POSITIVE_INFINITY, None], TS),
            "days": pa.array(
                [[DATE_POSITIVE_INFINITY, None, 5], None, [], [DATE_NEGATIVE_INFINITY], [1]], pa.list_(pa.date32())
            ),
            "n": [1, 2, 3, 4, 5],
        }
    )
    fitted = fit_temporal_columns(table, ("d", "ts", "days", "n"), "sink 'ch'")
    assert fitted.column("d").cast(pa.int32()).to_pylist() == [MAX_DAYS, MIN_DAYS, MIN_DAYS, MAX_DAYS, None]
    assert fitted.column("ts").cast(pa.int64()).to_pylist() == [MIN_MICROS, 0, MAX_MICROS, MAX_MICROS, None]
    days = fitted.column("days").combine_chunks()
    assert days.values.cast(pa.int32()).to_pylist() == [MAX_DAYS, None, 5, MIN_DAYS, 1]
    assert days.offsets.to_pylist() == table.column("days").combine_chunks().offsets.to_pylist()
    assert days.is_null().to_pylist() == [False, True, False, False, False]
    assert fitted.schema == table.schema
    plain = pa.table({"d": pa.array([0, 1], pa.date32())})
    assert fit_temporal_columns(plain, ("d",), "sink 'ch'") is plain  # nothing to change: the same table


@pytest.mark.parametrize(
    ("column", "shown"),
    [
        (pa.array([0, MAX_DAYS + 1], pa.date32()), "10000-01-01"),
        (pa.array([MIN_MICROS - 1], TS), "0002-12-31 23:59:59.999999+00 BC"),
        (pa.array([[0], [MIN_DAYS - 1]], pa.list_(pa.date32())), "0002-12-31 BC"),
    ],
)
def test_a_value_clickhouse_cannot_hold_stops_with_the_sink_column_and_value(column: pa.Array, shown: str) -> None:
    with pytest.raises(ReportedFailure) as failure:
        fit_temporal_columns(pa.table({"when": column}), ("when",), "sink 'ch'")
    assert failure.value.report.fields["retriable"] is False
    message = failure.value.report.fields["message"]
    assert "sink 'ch': column 'when'" in message and shown in message and "transform" in message
