"""Converters of dates, times, timestamps and intervals.

Timestamps and times are kept to the microsecond (Postgres' precision), and a value with more fractional digits
than a ``time(p)`` / ``timestamp(p)`` column keeps is rejected rather than rounded. A ``timestamp without time
zone`` given as a string with an offset keeps its wall-clock time, as a Postgres cast does; a ``timestamptz``
string without an offset is taken as UTC. Integer encodings are scaled by the field's logical type
(:data:`~cdcsync.sources.debezium.values.TIMESTAMP_UNITS`), or, in messages without schemas, by the connector's
``time.precision.mode``.

Dates and timestamps cover Postgres' whole calendar (4714-11-24 BC on; years past 9999) and ``±infinity``, as
integers (:mod:`cdcsync.core.temporal`). Debezium writes the infinities as sentinels: for dates the epoch days of
``-5877611-06-21`` (infinity) and ``-5877611-06-22`` (-infinity), for timestamps pgjdbc's
``DATE_POSITIVE_INFINITY`` / ``DATE_NEGATIVE_INFINITY`` in the field's unit, for ``timestamptz`` the strings
``infinity`` / ``-infinity``. Timestamps after 294247-01-10 (64-bit microseconds since 1970) cannot be carried:
Debezium's MicroTimestamp overflows there, and so do Arrow's and Spark's timestamps.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from cdcsync.config.types import PgType
from cdcsync.core.temporal import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    MAX_DATE_DAYS,
    MIN_DATE_DAYS,
    MIN_TIMESTAMP_MICROS,
    TIMESTAMP_NEGATIVE_INFINITY,
    TIMESTAMP_POSITIVE_INFINITY,
    civil_from_days,
    days_from_civil,
)
from cdcsync.sources.debezium.values import (
    MAX_US,
    MIN_US,
    TIME_UNITS,
    TIMESTAMP_UNITS,
    US_PER_DAY,
    Converter,
    Ctx,
    Reject,
    bad,
    column_schema,
    logical_type,
    reparse_huge_integer,
    scale_int,
    show,
)

_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH = datetime(1970, 1, 1)
_ONE_US = timedelta(microseconds=1)
_ISO_DATE_RE = re.compile(r"([+-]?[0-9]{4,})-([0-9]{2})-([0-9]{2})(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?")
_ISO_TS_RE = re.compile(
    r"([+-]?[0-9]{4,})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:[.,]([0-9]+))?)?"
    r"\s*(Z|z|[+-][0-9]{2}(?::?[0-9]{2}(?::?[0-9]{2})?)?)?"
)
_DEBEZIUM_DATE_INFINITIES = {
    days_from_civil(-5877611, 6, 21): DATE_POSITIVE_INFINITY,
    days_from_civil(-5877611, 6, 22): DATE_NEGATIVE_INFINITY,
}
PGJDBC_TIMESTAMP_INFINITIES = {
    9_223_372_036_825_200_000: TIMESTAMP_POSITIVE_INFINITY,  # pgjdbc's PGStatement.DATE_POSITIVE_INFINITY
    -9_223_372_036_832_400_000: TIMESTAMP_NEGATIVE_INFINITY,
}
"""Debezium's timestamp ``±infinity``: the same number whatever the field's unit (milliseconds, microseconds,
nanoseconds), so it is recognised before any scaling."""
DEBEZIUM_DATE_SENTINELS = frozenset(_DEBEZIUM_DATE_INFINITIES)
"""Epoch days Debezium writes for the date infinities (the converter maps them; batch paths leave them to it)."""
PGJDBC_TIMESTAMP_SENTINELS = frozenset(PGJDBC_TIMESTAMP_INFINITIES)
"""Epoch microseconds pgjdbc gives for the timestamp infinities (likewise)."""
_INFINITY_WORDS = {"infinity": 1, "+infinity": 1, "-infinity": -1}
_OUT_OF_DATES = "out of range for date (Postgres' dates run from 4714-11-24 BC to 5874897-12-31)"


def _civil_days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date; ValueError for a month or day that does not exist."""
    days = days_from_civil(year, month, day)
    if not 1 <= month <= 12 or civil_from_days(days) != (year, month, day):
        raise ValueError(f"{year}-{month}-{day}")
    return days


_TIME_RE = re.compile(r"([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?")


def date_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: Ctx) -> Any:
        kind = type(value)
        if kind is int:
            if value in _DEBEZIUM_DATE_INFINITIES:
                return _DEBEZIUM_DATE_INFINITIES[value]
            days = value
        elif kind is str:
            if value in _INFINITY_WORDS:
                return DATE_POSITIVE_INFINITY if _INFINITY_WORDS[value] > 0 else DATE_NEGATIVE_INFINITY
            match = _ISO_DATE_RE.fullmatch(value)
            if not match:
                raise bad(value, "date", "expected days since 1970-01-01 or an ISO date")
            try:
                days = _civil_days(int(match[1]), int(match[2]), int(match[3]))
            except ValueError:
                raise bad(value, "date") from None
        elif value is None:
            return None
        else:
            reparse_huge_integer(value)
            raise bad(value, "date", "expected days since 1970-01-01 or an ISO date")
        if not MIN_DATE_DAYS <= days <= MAX_DATE_DAYS:
            raise Reject(f"{show(value)} is {_OUT_OF_DATES}")
        return days

    return convert


def _parse_iso_timestamp(text: str, *, keep_wall_clock: bool) -> datetime | int:
    """An ISO-8601 timestamp string as a datetime that pyarrow stores correctly (aware ones are converted to UTC
    by pyarrow for ``timestamptz``; naive ones are taken as UTC), or as microseconds since 1970 (UTC) when it lies
    outside Python's years 1-9999 or is an infinity. Raises ValueError."""
    if text in _INFINITY_WORDS:
        return TIMESTAMP_POSITIVE_INFINITY if _INFINITY_WORDS[text] > 0 else TIMESTAMP_NEGATIVE_INFINITY
    if text[-1:] == "Z":  # UTC, as Debezium writes ZonedTimestamp: a naive datetime is UTC to pyarrow, and cheaper
        try:
            parsed = datetime.fromisoformat(text[:-1])
        except ValueError:
            return _parse_iso_timestamp_slow(text, keep_wall_clock=keep_wall_clock)
    else:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            return _parse_iso_timestamp_slow(text, keep_wall_clock=keep_wall_clock)
    if parsed.tzinfo is not None:
        if keep_wall_clock:
            return parsed.replace(tzinfo=None)
        if parsed.year == 1 or parsed.year == 9999:  # the offset may take it out of years 1-9999 in UTC
            micros = (parsed - _EPOCH_UTC) // _ONE_US
            if not MIN_US <= micros <= MAX_US:
                return micros
    return parsed


def _parse_iso_timestamp_slow(text: str, *, keep_wall_clock: bool) -> datetime | int:
    """ISO forms ``datetime.fromisoformat`` refuses: years before 1 or after 9999 (``-4712-01-01T…``,
    ``+294276-…``, as Debezium writes them), and, on older Pythons, ``Z``, 1-9 fraction digits, ``+hhmm``."""
    match = _ISO_TS_RE.fullmatch(text.strip())
    if not match:
        raise ValueError(text)
    year, month, day, hour, minute = (int(match[i]) for i in range(1, 6))
    second = int(match[6] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(text)
    fraction = int((match[7] or "").ljust(6, "0")[:6])
    micros = _civil_days(year, month, day) * US_PER_DAY + ((hour * 60 + minute) * 60 + second) * 1_000_000 + fraction
    offset = match[8]
    if offset and offset not in ("Z", "z") and not keep_wall_clock:
        digits = offset[1:].replace(":", "")
        seconds = int(digits[:2]) * 3600 + int(digits[2:4] or 0) * 60 + int(digits[4:6] or 0)
        micros -= (-seconds if offset[0] == "-" else seconds) * 1_000_000
    if 1 <= year <= 9999 and MIN_US <= micros <= MAX_US:  # within Python's years: the fast form pyarrow takes
        return _EPOCH + timedelta(microseconds=micros)
    return micros


def _time_text(micros: int) -> str:
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{hour:02d}:{minute:02d}:{second:02d}"
    return f"{text}.{fraction:06d}" if fraction else text


def _bare_unit(pg: PgType, time_mode: str | None) -> int:
    """Microseconds per unit of an integer time or timestamp in a message without schemas, as the connector's
    ``time.precision.mode`` writes it for a column of this precision (None: microseconds, e.g. for Avro, whose
    values arrive already scaled)."""
    if time_mode is None:
        return 1
    if time_mode == "connect":
        return 1000
    if pg.name == "time without time zone" and time_mode == "adaptive_time_microseconds":
        return 1
    return 1000 if pg.fraction_digits <= 3 else 1


def _precision_check(pg: PgType) -> int:
    """1, or the step (in microseconds) a value of a ``time(p)``/``timestamp(p)`` column must be a multiple of:
    Postgres would round finer digits on COPY, and nothing is rounded silently."""
    return 10 ** (6 - pg.fraction_digits)


def _too_fine(value: Any, expected: str) -> Reject:
    return Reject(f"{show(value)} has more fractional-second digits than {expected} keeps")


def timestamp_converter(name: str, pg: PgType, time_mode: str | None = None) -> Converter:
    with_tz = pg.name == "timestamp with time zone"
    expected = pg.sql
    bare_unit = 1 if with_tz else _bare_unit(pg, time_mode)
    step = _precision_check(pg)

    def convert(value: Any, ctx: Ctx) -> Any:
        kind = type(value)
        if kind is str:
            try:
                parsed = _parse_iso_timestamp(value, keep_wall_clock=not with_tz)
            except (ValueError, OverflowError):
                raise bad(value, expected, "not an ISO-8601 timestamp") from None
            if isinstance(parsed, int):
                if parsed in (TIMESTAMP_POSITIVE_INFINITY, TIMESTAMP_NEGATIVE_INFINITY):
                    return parsed
                micros = parsed
            else:
                if step > 1 and parsed.microsecond % step:
                    raise _too_fine(value, expected)
                return parsed
        elif kind is int:
            if value in PGJDBC_TIMESTAMP_INFINITIES:
                return PGJDBC_TIMESTAMP_INFINITIES[value]
            if ctx[0] is not None:
                micros = scale_int(value, TIMESTAMP_UNITS.get(logical_type(column_schema(ctx, name))[0] or "", 1))
            else:
                micros = value * bare_unit
        elif value is None:
            return None
        else:
            reparse_huge_integer(value)
            raise bad(value, expected, "expected an epoch integer or an ISO-8601 string")
        if not MIN_TIMESTAMP_MICROS <= micros < TIMESTAMP_POSITIVE_INFINITY:
            raise Reject(
                f"{show(value)} is out of range for {expected} (from 4714-11-24 BC to 294247-01-10: 64-bit "
                "microseconds since 1970, as Debezium's MicroTimestamp, Arrow and Spark keep them)"
            )
        if step > 1 and micros % step:
            raise _too_fine(value, expected)
        return micros

    return convert


def time_converter(name: str, pg: PgType, time_mode: str | None = None) -> Converter:
    expected = pg.sql
    bare_unit = _bare_unit(pg, time_mode)
    step = _precision_check(pg)

    def convert(value: Any, ctx: Ctx) -> Any:
        kind = type(value)
        if kind is int:
            if ctx[0] is not None:
                micros = scale_int(value, TIME_UNITS.get(logical_type(column_schema(ctx, name))[0] or "", 1))
            else:
                micros = value * bare_unit
            if not 0 <= micros <= US_PER_DAY:
                raise Reject(f"{show(value)} is out of range for {expected}")
        elif kind is str:
            match = _TIME_RE.fullmatch(value)
            micros = -1
            if match:
                hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
                total = ((hour * 60 + minute) * 60 + second) * 1_000_000 + int((match[4] or "").ljust(6, "0")[:6])
                if minute < 60 and second < 60 and total <= US_PER_DAY:
                    micros = total
            if micros < 0:
                raise bad(value, expected, "expected HH:MM[:SS[.ffffff]] or microseconds since midnight")
        elif value is None:
            return None
        else:
            reparse_huge_integer(value)
            raise bad(value, expected, "expected microseconds since midnight or HH:MM:SS")
        if step > 1 and micros % step:
            raise _too_fine(value, expected)
        return _time_text(micros)

    return convert


def interval_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: Ctx) -> Any:
        if type(value) is str:  # io.debezium.time.Interval: ISO-8601 duration, which Postgres reads as is
            if "\x00" in value:
                raise bad(value, "interval")
            return value
        if type(value) is int:  # io.debezium.time.MicroDuration
            return f"{value} microseconds"
        if value is None:
            return None
        raise bad(value, "interval", "expected microseconds or an ISO-8601 duration")

    return convert


_TIMETZ_RE = re.compile(
    r"([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?\s*(Z|z|[+-][0-9]{2}(?::?[0-9]{2}(?::?[0-9]{2})?)?)"
)


def timetz_converter(pg: PgType) -> Converter:
    """``time with time zone`` from io.debezium.time.ZonedTime (``HH:MM:SS[.f]Z``, Debezium converts it to UTC)
    or any ``HH:MM[:SS[.f]]±hh[:mm]``. Written back with its offset, fraction truncated to microseconds."""
    expected = pg.sql
    step = _precision_check(pg)

    def convert(value: Any, ctx: Ctx) -> Any:
        if type(value) is str:
            match = _TIMETZ_RE.fullmatch(value.strip())
            if match:
                hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
                micros = int((match[4] or "").ljust(6, "0")[:6])
                total = ((hour * 60 + minute) * 60 + second) * 1_000_000 + micros
                offset = match[5]
                offset_hours = 0 if offset in ("Z", "z") else int(offset[1:3])
                if minute < 60 and second < 60 and total <= US_PER_DAY and offset_hours <= 15:
                    if step > 1 and total % step:
                        raise _too_fine(value, expected)
                    zone = "+00" if offset in ("Z", "z") else offset
                    return _time_text(total) + zone
            raise bad(value, expected, "expected HH:MM:SS[.ffffff] with a UTC offset, as ZonedTime writes it")
        if value is None:
            return None
        raise bad(value, expected, "expected a ZonedTime string")

    return convert
