"""The COPY path (cdcsync.db.pgcopy) into a real Postgres: edge values of dates and timestamps read back exactly."""

from __future__ import annotations

import psycopg
import pyarrow as pa
import pytest

from cdcsync.core.temporal import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    MAX_DATE_DAYS,
    MIN_DATE_DAYS,
    TIMESTAMP_NEGATIVE_INFINITY,
    TIMESTAMP_POSITIVE_INFINITY,
    days_from_civil,
)
from cdcsync.db.pgcopy import arrow_to_copy_csv

pytestmark = pytest.mark.integration

DAY_US = 86_400_000_000
LAST_INT64_DAY = days_from_civil(294247, 1, 9)


def test_dates_and_timestamps_of_the_whole_postgres_range_land_exactly(postgres_dsn: str) -> None:
    days = [MIN_DATE_DAYS, MAX_DATE_DAYS, DATE_POSITIVE_INFINITY, DATE_NEGATIVE_INFINITY, 0, None]
    micros = [
        MIN_DATE_DAYS * DAY_US,
        LAST_INT64_DAY * DAY_US + DAY_US - 1,
        TIMESTAMP_POSITIVE_INFINITY,
        TIMESTAMP_NEGATIVE_INFINITY,
        -1,
        None,
    ]
    expected = [
        ("4714-11-24 BC", "4714-11-24 00:00:00 BC", "4714-11-24 00:00:00+00 BC", '{"4714-11-24 BC",NULL}'),
        ("5874897-12-31", "294247-01-09 23:59:59.999999", "294247-01-09 23:59:59.999999+00", "{5874897-12-31,NULL}"),
        ("infinity", "infinity", "infinity", "{infinity,NULL}"),
        ("-infinity", "-infinity", "-infinity", "{-infinity,NULL}"),
        ("1970-01-01", "1969-12-31 23:59:59.999999", "1969-12-31 23:59:59.999999+00", "{1970-01-01,NULL}"),
        (None, None, None, None),
    ]
    arrays = [
        pa.array(list(range(len(days))), pa.int64()),
        pa.array(days, pa.date32()),
        pa.array(micros, pa.timestamp("us")),
        pa.array(micros, pa.timestamp("us", tz="UTC")),
        pa.array([None if d is None else [d, None] for d in days], pa.list_(pa.date32())),
    ]
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("CREATE TABLE edges (id bigint, d date, ts timestamp, tstz timestamptz, ds date[])")
        with conn.cursor().copy("COPY edges FROM STDIN (FORMAT csv)") as copy:
            copy.write(arrow_to_copy_csv(arrays))
        rows = conn.execute("SELECT d::text, ts::text, tstz::text, ds::text FROM edges ORDER BY id").fetchall()
    assert rows == expected
