"""Converters of dates, times, timestamps and intervals.

Timestamps and times are kept to the microsecond (Postgres' precision), and a value with more fractional digits
than a ``time(p)`` / ``timestamp(p)`` column keeps is rejected rather than rounded. A ``timestamp without time
zone`` given as a string with an offset keeps its wall-clock time, as a Postgres cast does; a ``timestamptz``
string without an offset is taken as UTC. Dates and timestamps must lie in years 1-9999. Integer encodings are
scaled by the field's logical type (:data:`~cdcsync.sources.debezium.values.TIMESTAMP_UNITS`), or, in messages
without schemas, by the connector's ``time.precision.mode``.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from typing import Any

from cdcsync.config.types import PgType
from cdcsync.sources.debezium.values import (
    MAX_DAYS,
    MAX_US,
    MIN_DAYS,
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
_ONE_US = timedelta(microseconds=1)
_ISO_DATE_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?")
_ISO_TS_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:[.,]([0-9]+))?)?"
    r"\s*(Z|z|[+-][0-9]{2}(?::?[0-9]{2}(?::?[0-9]{2})?)?)?"
)
_TIME_RE = re.compile(r"([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?")


def date_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: Ctx) -> Any:
        kind = type(value)
        if kind is int:
            days = value
        elif kind is str:
            match = _ISO_DATE_RE.fullmatch(value)
            if not match:
                raise bad(value, "date", "expected days since 1970-01-01 or an ISO date")
            try:
                days = date(int(match[1]), int(match[2]), int(match[3])).toordinal() - 719163
            except ValueError:
                raise bad(value, "date") from None
        elif value is None:
            return None
        else:
            reparse_huge_integer(value)
            raise bad(value, "date", "expected days since 1970-01-01 or an ISO date")
        if not MIN_DAYS <= days <= MAX_DAYS:
            raise Reject(f"{show(value)} is out of range for date (years 1-9999)")
        return days

    return convert


def _parse_iso_timestamp(text: str, *, keep_wall_clock: bool) -> datetime:
    """An ISO-8601 timestamp string as a datetime that pyarrow stores correctly: aware ones are converted to
    UTC by pyarrow for ``timestamptz``; naive ones are taken as UTC. Raises ValueError."""
    if text[-1:] == "Z":  # UTC, as Debezium writes ZonedTimestamp: a naive datetime is UTC to pyarrow, and cheaper
        try:
            parsed = datetime.fromisoformat(text[:-1])
        except ValueError:
            parsed = _parse_iso_timestamp_slow(text)
    else:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            parsed = _parse_iso_timestamp_slow(text)
    if parsed.tzinfo is not None:
        if keep_wall_clock:
            return parsed.replace(tzinfo=None)
        if parsed.year == 1 or parsed.year == 9999:  # the offset may take it out of years 1-9999 in UTC
            micros = (parsed - _EPOCH_UTC) // _ONE_US
            if not MIN_US <= micros <= MAX_US:
                raise ValueError(text)
    return parsed


def _parse_iso_timestamp_slow(text: str) -> datetime:
    """ISO forms ``datetime.fromisoformat`` of older Pythons refuses: ``Z``, 1-9 fraction digits, ``+hhmm``."""
    match = _ISO_TS_RE.fullmatch(text.strip())
    if not match:
        raise ValueError(text)
    year, month, day, hour, minute = (int(match[i]) for i in range(1, 6))
    second = int(match[6] or 0)
    micros = int((match[7] or "").ljust(6, "0")[:6])
    tz = None
    offset = match[8]
    if offset:
        if offset in ("Z", "z"):
            tz = timezone.utc
        else:
            digits = offset[1:].replace(":", "")
            delta = timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0), seconds=int(digits[4:6] or 0))
            tz = timezone(-delta if offset[0] == "-" else delta)
    return datetime(year, month, day, hour, minute, second, micros, tzinfo=tz)


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
            try:  # years 1-9999 by construction
                parsed = _parse_iso_timestamp(value, keep_wall_clock=not with_tz)
            except (ValueError, OverflowError):
                raise bad(value, expected, "not an ISO-8601 timestamp") from None
            if step > 1 and parsed.microsecond % step:
                raise _too_fine(value, expected)
            return parsed
        if kind is int:
            if ctx[0] is not None:
                micros = scale_int(value, TIMESTAMP_UNITS.get(logical_type(column_schema(ctx, name))[0] or "", 1))
            else:
                micros = value * bare_unit
        elif value is None:
            return None
        else:
            reparse_huge_integer(value)
            raise bad(value, expected, "expected an epoch integer or an ISO-8601 string")
        if not MIN_US <= micros <= MAX_US:
            raise Reject(f"{show(value)} is out of range for {expected} (years 1-9999)")
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
