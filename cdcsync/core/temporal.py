"""Postgres' whole calendar in plain integers: dates as days and timestamps as microseconds since 1970-01-01.

Postgres keeps dates from 4713 BC to 5874897 AD, timestamps from 4713 BC to 294276 AD, and ``infinity`` /
``-infinity`` for both; Python's ``datetime`` stops at years 1-9999 and pyarrow's text casts do too. So every
date and timestamp travels through cdcsync as an integer (Arrow ``date32`` / ``timestamp[us]``, Spark's DateType /
TimestampType), with the infinities as the extreme integers of the type (they sort after and before every real
value, as Postgres sorts them), and is rendered as Postgres input text here, with ``BC`` for years before 1.

The calendar is the proleptic Gregorian one, as in Postgres, Spark and ISO-8601 (year 0 is 1 BC).
"""

from __future__ import annotations

DATE_POSITIVE_INFINITY = 2**31 - 1
DATE_NEGATIVE_INFINITY = -(2**31)
TIMESTAMP_POSITIVE_INFINITY = 2**63 - 1
TIMESTAMP_NEGATIVE_INFINITY = -(2**63)

MICROS_PER_DAY = 86_400_000_000
PYTHON_MIN_DAYS = -719_162  # 0001-01-01
PYTHON_MAX_DAYS = 2_932_896  # 9999-12-31
"""Years 1-9999: what Python's ``date``/``datetime`` hold and pyarrow's text casts print."""
PYTHON_MIN_MICROS = PYTHON_MIN_DAYS * MICROS_PER_DAY
PYTHON_MAX_MICROS = (PYTHON_MAX_DAYS + 1) * MICROS_PER_DAY - 1
MIN_DATE_DAYS = -2_440_588  # 4714-11-24 BC, Postgres' first date (Julian day 0)
MAX_DATE_DAYS = 2_145_042_905  # 5874897-12-31
MIN_TIMESTAMP_MICROS = MIN_DATE_DAYS * MICROS_PER_DAY
MAX_TIMESTAMP_MICROS = 9_224_318_015_999_999_999  # 294276-12-31 23:59:59.999999, beyond int64
"""Postgres' last timestamp lies past what 64-bit microseconds since 1970 can hold (294247-01-10): values from
there on cannot travel in Debezium's MicroTimestamp either."""

_INFINITY_TEXT = {
    DATE_POSITIVE_INFINITY: "infinity",
    DATE_NEGATIVE_INFINITY: "-infinity",
    TIMESTAMP_POSITIVE_INFINITY: "infinity",
    TIMESTAMP_NEGATIVE_INFINITY: "-infinity",
}


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(year, month, day) of ``days`` since 1970-01-01; year 0 is 1 BC, -1 is 2 BC."""
    z = days + 719_468
    era = z // 146_097
    day_of_era = z - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + 3 if shifted_month < 10 else shifted_month - 9
    return year_of_era + era * 400 + (month <= 2), month, day


def days_from_civil(year: int, month: int, day: int) -> int:
    """The inverse of :func:`civil_from_days` (no range check: callers validate month and day)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def _date_parts(days: int) -> tuple[str, str]:
    year, month, day = civil_from_days(days)
    if year > 0:
        return f"{year:04d}-{month:02d}-{day:02d}", ""
    return f"{1 - year:04d}-{month:02d}-{day:02d}", " BC"


def date_text(days: int) -> str:
    """Postgres input text of a date held as days since 1970-01-01 (or an infinity)."""
    if days in _INFINITY_TEXT:
        return _INFINITY_TEXT[days]
    text, era = _date_parts(days)
    return text + era


def timestamp_text(micros: int, *, with_time_zone: bool) -> str:
    """Postgres input text of a timestamp held as microseconds since 1970-01-01 (UTC for ``timestamptz``)."""
    if micros in _INFINITY_TEXT:
        return _INFINITY_TEXT[micros]
    days, micros_of_day = divmod(micros, MICROS_PER_DAY)
    seconds, fraction = divmod(micros_of_day, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text, era = _date_parts(days)
    zone = "+00" if with_time_zone else ""
    return f"{text} {hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}{zone}{era}"
