"""Postgres' calendar in integers (cdcsync.core.temporal) and its text in the COPY path (cdcsync.db.pgcopy)."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcsync.core.temporal import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    MAX_DATE_DAYS,
    MIN_DATE_DAYS,
    TIMESTAMP_NEGATIVE_INFINITY,
    TIMESTAMP_POSITIVE_INFINITY,
    civil_from_days,
    date_text,
    days_from_civil,
    timestamp_text,
)
from cdcsync.db.pgcopy import arrow_to_copy_csv

pytestmark = pytest.mark.unit


@given(st.integers(MIN_DATE_DAYS, MAX_DATE_DAYS))
def test_days_and_civil_dates_round_trip(days: int) -> None:
    assert days_from_civil(*civil_from_days(days)) == days


@given(st.dates())
def test_civil_dates_agree_with_python_within_its_years(day: date) -> None:
    days = day.toordinal() - date(1970, 1, 1).toordinal()
    assert civil_from_days(days) == (day.year, day.month, day.day)
    assert date_text(days) == day.isoformat()


@pytest.mark.parametrize(
    ("days", "text"),
    [
        (MIN_DATE_DAYS, "4714-11-24 BC"),  # Postgres' first date
        (MAX_DATE_DAYS, "5874897-12-31"),  # and its last
        (days_from_civil(0, 12, 31), "0001-12-31 BC"),  # year 0 is 1 BC
        (days_from_civil(-4712, 1, 1), "4713-01-01 BC"),
        (DATE_POSITIVE_INFINITY, "infinity"),
        (DATE_NEGATIVE_INFINITY, "-infinity"),
    ],
)
def test_date_text_outside_pythons_years(days: int, text: str) -> None:
    assert date_text(days) == text


def test_timestamp_text() -> None:
    day = days_from_civil(-4712, 1, 1) * 86_400_000_000
    assert timestamp_text(day + 1, with_time_zone=True) == "4713-01-01 00:00:00.000001+00 BC"
    assert timestamp_text(-1, with_time_zone=False) == "1969-12-31 23:59:59.999999"
    last = days_from_civil(294247, 1, 10) * 86_400_000_000 + 4 * 3_600_000_000
    assert timestamp_text(last, with_time_zone=False) == "294247-01-10 04:00:00.000000"
    assert timestamp_text(TIMESTAMP_POSITIVE_INFINITY, with_time_zone=True) == "infinity"
    assert timestamp_text(TIMESTAMP_NEGATIVE_INFINITY, with_time_zone=False) == "-infinity"


def test_copy_text_of_dates_and_timestamps_beyond_pyarrows_range() -> None:
    dates = pa.array([0, None, DATE_POSITIVE_INFINITY, days_from_civil(-4712, 1, 1)], pa.date32())
    stamps = pa.array([1, TIMESTAMP_NEGATIVE_INFINITY, None, 0], pa.timestamp("us", tz="UTC"))
    lists = pa.array([[0, None, DATE_NEGATIVE_INFINITY], None, [], [MAX_DATE_DAYS]], pa.list_(pa.date32()))
    lines = arrow_to_copy_csv([dates, stamps, lists]).decode().splitlines()
    assert lines == [
        '"1970-01-01","1970-01-01 00:00:00.000001+00","{""1970-01-01"",NULL,""-infinity""}"',
        ',"-infinity",',
        '"infinity",,"{}"',
        '"4713-01-01 BC","1970-01-01 00:00:00.000000+00","{""5874897-12-31""}"',
    ]


def test_copy_text_of_ordinary_dates_keeps_pyarrows_fast_path() -> None:
    dates = pa.array([date(2024, 2, 29), None])
    stamps = pa.array([datetime(2024, 2, 29, 1, 2, 3, 4, tzinfo=timezone.utc), None], pa.timestamp("us", tz="UTC"))
    lists = pa.array([[date(1, 1, 1), date(9999, 12, 31)], None], pa.list_(pa.date32()))
    lines = arrow_to_copy_csv([dates, stamps, lists]).decode().splitlines()
    assert lines == ['2024-02-29,"2024-02-29 01:02:03.000004Z","{""0001-01-01"",""9999-12-31""}"', ",,"]


def test_copy_text_of_zoned_timestamps_is_their_utc_instant_whatever_the_zone() -> None:
    instant = datetime(2024, 2, 29, 1, 2, 3, 4, tzinfo=timezone.utc)
    for zone in ("UTC", "+02:00", "America/New_York"):
        stamps = pa.array([instant, None], pa.timestamp("us", tz=zone))
        assert arrow_to_copy_csv([stamps]).decode().splitlines() == ['"2024-02-29 01:02:03.000004Z"', ""]
    millis = pa.array([instant.replace(microsecond=5000)], pa.timestamp("ms", tz="UTC"))
    assert arrow_to_copy_csv([millis]).decode() == '"2024-02-29 01:02:03.005Z"\n'
    assert date(1970, 1, 1) + timedelta(days=days_from_civil(2024, 2, 29)) == date(2024, 2, 29)
