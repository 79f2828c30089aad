"""Edge and special values that Postgres holds and Debezium carries, through the JSON decoder (issue 12).

Dates and timestamps are read back as the integers the decoder produces (days / microseconds since 1970), since
Python's dates end at year 9999; the COPY path that turns them into Postgres text is tested in test_temporal.py.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest

from cdcsync.core.temporal import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    TIMESTAMP_NEGATIVE_INFINITY,
    TIMESTAMP_POSITIVE_INFINITY,
    days_from_civil,
)
from cdcsync.sources.debezium.dispatch import decode_batches
from tests.unit.test_debezium_decode import change, dumps, field, kafka_batch, key, make_spec, wrapped

pytestmark = pytest.mark.unit

DAY_US = 86_400_000_000
MICRO_TIMESTAMP = field("x", "int64", "io.debezium.time.MicroTimestamp")
MILLI_TIMESTAMP = field("x", "int64", "io.debezium.time.Timestamp")
ZONED = field("x", "string", "io.debezium.time.ZonedTimestamp")
DEBEZIUM_DATE = field("x", "int32", "io.debezium.time.Date")


def decoded(pg: str, value: Any, schema: dict | None = None) -> Any:
    """The decoded value of column x, as the integer Arrow holds for dates and timestamps."""
    spec = make_spec({"id": "bigint", "x": pg})
    payload = change("c", after={"id": 1, "x": value})
    raw = wrapped(payload, [field("id", "int64"), schema]) if schema else dumps(payload)
    (batch,) = list(decode_batches(iter([kafka_batch([(key(1), raw)])]), spec))
    assert batch.column(batch.schema.get_field_index("_dlq_reason")).to_pylist() == [None]
    column = batch.column(batch.schema.get_field_index("x"))
    if pa.types.is_date32(column.type):
        column = column.cast(pa.int32())
    elif pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return column.to_pylist()[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3.4028235E38", 3.4028234663852886e38),  # FLT_MAX as Debezium prints a float: just above it as a double
        ("-3.4028235E38", -3.4028234663852886e38),
        ("1.4E-45", 1.401298464324817e-45),
    ],
)
def test_real_extremes_land(text: str, expected: float) -> None:
    raw = b'{"before":null,"after":{"id":1,"x":' + text.encode() + b'},"op":"c","source":{"lsn":1,"ts_ms":1}}'
    spec = make_spec({"id": "bigint", "x": "real"})
    (batch,) = list(decode_batches(iter([kafka_batch([(key(1), raw)])]), spec))
    assert batch.column(batch.schema.get_field_index("_dlq_reason")).to_pylist() == [None]
    assert batch.column(batch.schema.get_field_index("x")).to_pylist() == [pytest.approx(expected, rel=1e-7)]


@pytest.mark.parametrize(
    ("pg", "word", "expected"),
    [
        ("numeric", "NAN", "NaN"),  # decimal.handling.mode=string spells the special values this way
        ("numeric", "POSITIVE_INFINITY", "Infinity"),
        ("numeric", "NEGATIVE_INFINITY", "-Infinity"),
        ("numeric(50,2)", "NAN", "NaN"),
    ],
)
def test_debeziums_string_mode_special_numerics(pg: str, word: str, expected: str) -> None:
    assert decoded(pg, word) == expected


def test_debeziums_string_mode_special_doubles() -> None:
    assert math.isnan(decoded("double precision", "NAN"))
    assert decoded("double precision", "POSITIVE_INFINITY") == math.inf


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-2_147_472_692, DATE_POSITIVE_INFINITY),  # Debezium's 'infinity': the epoch day of -5877611-06-21
        (-2_147_472_691, DATE_NEGATIVE_INFINITY),  # and '-infinity': -5877611-06-22
        (-2_440_588, -2_440_588),  # 4714-11-24 BC, Postgres' first date
        (2_145_042_905, 2_145_042_905),  # 5874897-12-31, its last
        ("infinity", DATE_POSITIVE_INFINITY),
        ("-4712-01-01", days_from_civil(-4712, 1, 1)),  # 4713 BC
        ("+10000-01-01", days_from_civil(10000, 1, 1)),
    ],
)
def test_dates_of_the_whole_postgres_range(value: Any, expected: int) -> None:
    assert decoded("date", value, DEBEZIUM_DATE if isinstance(value, int) else None) == expected


@pytest.mark.parametrize(
    ("pg", "value", "schema", "expected"),
    [
        ("timestamp", 9_223_372_036_825_200_000, MICRO_TIMESTAMP, TIMESTAMP_POSITIVE_INFINITY),
        ("timestamp", -9_223_372_036_832_400_000, MICRO_TIMESTAMP, TIMESTAMP_NEGATIVE_INFINITY),
        ("timestamp", 9_223_372_036_825_200_000, MILLI_TIMESTAMP, TIMESTAMP_POSITIVE_INFINITY),  # before scaling
        ("timestamp", -210_863_520_000_000_000, MICRO_TIMESTAMP, -210_863_520_000_000_000),  # 4713-01-01 BC
        ("timestamp", 9_000_000_000_000_000_000, MICRO_TIMESTAMP, 9_000_000_000_000_000_000),  # year 287,000
        ("timestamptz", "infinity", ZONED, TIMESTAMP_POSITIVE_INFINITY),
        ("timestamptz", "-infinity", ZONED, TIMESTAMP_NEGATIVE_INFINITY),
        ("timestamptz", "-4712-01-01T00:00:00.000000Z", ZONED, days_from_civil(-4712, 1, 1) * DAY_US),
        ("timestamptz", "+12345-06-07T08:09:10.5+01:00", ZONED, days_from_civil(12345, 6, 7) * DAY_US + 25_750_500_000),
        ("timestamp", "+12345-06-07T08:09:10+01:00", None, days_from_civil(12345, 6, 7) * DAY_US + 29_350_000_000),
    ],
)
def test_timestamps_of_the_whole_range_and_infinities(pg: str, value: Any, schema: dict | None, expected: int) -> None:
    assert decoded(pg, value, schema) == expected
