"""Converters of numbers: Postgres integers, floats and ``numeric``, never rounded silently.

Decimal columns yield the unscaled integer at the column's scale (built into ``decimal128`` per batch). A JSON
number in a ``numeric`` column is read exactly from the message text: the fast parser hands it over as a double,
and the digits are recovered from the raw bytes (or the message is parsed again with ``Decimal`` floats).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from cdcsync.config.types import PgType
from cdcsync.sources.debezium.values import (
    DEBEZIUM_DECIMAL,
    INT_RANGES,
    Converter,
    Ctx,
    Reject,
    Reparse,
    b64,
    bad,
    column_schema,
    dumps_compact,
    logical_type,
    reparse_huge_integer,
    show,
)

_FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
"""The smallest magnitude that rounds to infinity as a float32: FLT_MAX plus half a unit in the last place. A
``real`` travels as its shortest decimal (``3.4028235E38`` for FLT_MAX), which as a double lies just above FLT_MAX
yet rounds back to it, so the range check is against this, not FLT_MAX."""
# Postgres' spellings, and Debezium's in decimal.handling.mode=string (NAN, POSITIVE_INFINITY, NEGATIVE_INFINITY).
_FLOAT_WORDS = {
    "NaN": math.nan,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
    "NAN": math.nan,
    "POSITIVE_INFINITY": math.inf,
    "NEGATIVE_INFINITY": -math.inf,
}
_NUMERIC_WORDS = {
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "NAN": "NaN",
    "POSITIVE_INFINITY": "Infinity",
    "NEGATIVE_INFINITY": "-Infinity",
}
_DECIMAL_PARTS_RE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?")


def int_converter(pg: PgType) -> Converter:
    bound = INT_RANGES[pg.name]
    low, high = -bound, bound - 1
    expected = pg.sql

    def convert(value: Any, ctx: Ctx) -> Any:
        if type(value) is int:
            if low <= value <= high:
                return value
            raise Reject(f"{show(value)} is out of range for {expected}")
        if value is None:
            return None
        reparse_huge_integer(value)
        raise bad(value, expected, "not an integer")

    return convert


def float_converter(pg: PgType) -> Converter:
    single = pg.name == "real"
    expected = pg.sql

    def convert(value: Any, ctx: Ctx) -> Any:
        kind = type(value)
        if kind is float:
            result = value
        elif kind is int or kind is Decimal:
            try:
                result = float(value)
            except OverflowError:
                raise Reject(f"{show(value)} is out of range for {expected}") from None
            if math.isinf(result):
                raise Reject(f"{show(value)} is out of range for {expected}")
        elif kind is str:
            if value not in _FLOAT_WORDS:
                raise bad(value, expected, "expected a number, 'NaN', 'Infinity' or '-Infinity'")
            return _FLOAT_WORDS[value]
        elif value is None:
            return None
        else:
            raise bad(value, expected, "not a number")
        if single and math.isfinite(result) and abs(result) >= _FLOAT32_OVERFLOW:
            raise Reject(f"{show(value)} is out of range for {expected}")
        return result

    return convert


_POSTGRES_MAX_INTEGER_DIGITS = 131_072
_POSTGRES_MAX_FRACTION_DIGITS = 16_383
_MAX_SHIFT = 1_100  # beyond any Postgres numeric precision (1000): rejected without computing 10**shift


def _text_parts(text: str) -> tuple[int, int]:
    match = _DECIMAL_PARTS_RE.fullmatch(text)
    if match is None or not (match.group(2) or match.group(3)):
        raise ValueError(text)
    whole, fraction, exponent = match.group(2, 3, 4)
    coefficient = int((whole or "") + (fraction or "") or "0")
    return (-coefficient if match.group(1) == "-" else coefficient), (int(exponent) if exponent else 0) - len(
        fraction or ""
    )


def _decimal_parts(
    value: Any, ctx: Ctx, name: str, json_name: bytes, number_pattern: re.Pattern[bytes], expected: str
) -> tuple[int, int] | str:
    """A Debezium numeric value as (coefficient, exponent), or 'NaN' / 'Infinity' / '-Infinity'."""
    kind = type(value)
    if kind is int:
        return value, 0
    if kind is float:  # a JSON number, which the fast parser read as a double: take its digits from the bytes
        parts = _exact_number(ctx[2], json_name, number_pattern, value)
        if parts is None:
            raise Reparse()
        return parts
    try:
        if kind is str:
            logical, params = logical_type(column_schema(ctx, name))
            if logical == DEBEZIUM_DECIMAL:
                try:
                    return int.from_bytes(b64(value), "big", signed=True), -int(params.get("scale", 0))
                except ValueError:
                    raise bad(value, expected, "not base64 Connect Decimal bytes with a scale") from None
            if value in _NUMERIC_WORDS:
                return _NUMERIC_WORDS[value]
            return _text_parts(value)
        if kind is Decimal:
            if not value.is_finite():
                return "NaN" if value.is_nan() else ("-Infinity" if value.is_signed() else "Infinity")
            sign, digits, exponent = value.as_tuple()
            coefficient = int("".join(map(str, digits)) or "0")
            return (-coefficient if sign else coefficient), int(exponent)
        if kind is dict:  # io.debezium.data.VariableScaleDecimal {scale, value}
            scale, digits = value.get("scale"), value.get("value")
            if type(scale) is int and type(digits) is str:
                return int.from_bytes(b64(digits), "big", signed=True), -scale
            raise bad(value, expected, "not a VariableScaleDecimal {scale, value}")
    except ValueError:  # includes binascii.Error and Python's limit on digits in int(str)
        raise bad(value, expected, "not a decimal number") from None
    raise bad(value, expected, "not a number")


def _unscaled_text(unscaled: int, scale: int) -> str:
    if scale <= 0:
        return str(unscaled * 10**-scale)
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    return ("-" if unscaled < 0 else "") + digits[:-scale] + "." + digits[-scale:]


def numeric_converter(name: str, pg: PgType) -> Converter:
    """Decimal columns yield the unscaled integer at the column's scale (built into decimal128 per batch);
    numeric columns without a Spark decimal counterpart yield the exact decimal text."""
    expected = pg.sql
    spark_decimal = pg.spark_type.startswith("decimal")
    json_name = dumps_compact(name).encode() + b":"
    number_pattern = _number_pattern(json_name)

    if not pg.args:  # unconstrained numeric

        def convert_free(value: Any, ctx: Ctx) -> Any:
            if value is None:
                return None
            parts = _decimal_parts(value, ctx, name, json_name, number_pattern, expected)
            if isinstance(parts, str):
                return parts
            coefficient, exponent = parts
            if coefficient == 0:  # keeps its scale, as Postgres does (0.000)
                return _unscaled_text(0, -exponent) if exponent < 0 else "0"
            digits = len(str(abs(coefficient)))
            if digits + exponent > _POSTGRES_MAX_INTEGER_DIGITS or -exponent > _POSTGRES_MAX_FRACTION_DIGITS:
                raise Reject(f"{show(value)} is out of range for numeric")
            return _unscaled_text(coefficient, -exponent) if exponent < 0 else str(coefficient * 10**exponent)

        return convert_free

    precision = pg.args[0]
    scale = pg.args[1] if len(pg.args) > 1 else 0
    limit = 10**precision
    powers = [10**k for k in range(precision + 1)]

    def convert(value: Any, ctx: Ctx) -> Any:
        if value is None:
            return None
        parts = _decimal_parts(value, ctx, name, json_name, number_pattern, expected)
        if isinstance(parts, str):
            if parts == "NaN" and not spark_decimal:
                return "NaN"
            if parts == "NaN":  # Postgres keeps NaN in numeric(p,s); Spark's decimal(p,s) cannot
                raise Reject(
                    f"{show(value)} cannot be carried as {expected} (Spark's decimal has no NaN); declare the "
                    "column as numeric without precision under columns: to carry NaN"
                )
            raise Reject(f"{show(value)} does not fit {expected} (not a finite number)")
        coefficient, exponent = parts
        shift = exponent + scale
        if shift >= 0:
            if coefficient == 0:
                return 0 if spark_decimal else _unscaled_text(0, scale)
            if shift > precision:
                raise Reject(f"{show(value)} does not fit {expected} (more than {precision - scale} integer digits)")
            unscaled = coefficient * powers[shift]
        else:
            if -shift > _MAX_SHIFT:
                remainder = coefficient
                unscaled = 0
            else:
                unscaled, remainder = divmod(coefficient, 10**-shift)
            if remainder:
                raise Reject(f"{show(value)} does not fit {expected} (more than {scale} digits after the point)")
        if not -limit < unscaled < limit:
            raise Reject(f"{show(value)} does not fit {expected} (more than {precision - scale} integer digits)")
        return unscaled if spark_decimal else _unscaled_text(unscaled, scale)

    return convert


_JSON_NUMBER = rb"[ \t\n\r]*(-?([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?)"
_JSON_NUMBER_AT = re.compile(_JSON_NUMBER)


def _number_pattern(json_name: bytes) -> re.Pattern[bytes]:
    """Finds the number tokens of every ``"name":<number>`` in a raw JSON message."""
    return re.compile(re.escape(json_name) + _JSON_NUMBER)


def _exact_number(raw: bytes, json_name: bytes, pattern: re.Pattern[bytes], parsed: float) -> tuple[int, int] | None:
    """(coefficient, exponent) of the JSON number that the fast parser read as the double ``parsed``, from its
    text in ``raw``; None when that is not certain.

    A ``"name":`` key cannot occur inside a JSON string (its quotes would be escaped), so when the raw message
    holds it once, the number after it is this value. Otherwise (``before`` and ``after`` both hold the field,
    or another column's JSON has such a key) every ``"name":<number>`` is considered: the tokens that round to
    ``parsed`` must all be the same text."""
    at = raw.find(json_name)
    if at >= 0 and raw.find(json_name, at + len(json_name)) < 0:
        match = _JSON_NUMBER_AT.match(raw, at + len(json_name))
        if match is not None:
            return _number_parts(match)
        return None
    found: re.Match[bytes] | None = None
    for match in pattern.finditer(raw):
        token = match.group(1)
        if found is not None and token == found.group(1):
            continue
        try:
            if float(token) != parsed:
                continue
        except (ValueError, OverflowError):
            return None
        if found is not None:
            return None
        found = match
    return None if found is None else _number_parts(found)


def _number_parts(match: re.Match[bytes]) -> tuple[int, int] | None:
    """(coefficient, exponent) from a ``_JSON_NUMBER_AT`` / ``_number_pattern`` match."""
    whole, fraction, exponent = match.group(2, 3, 4)
    try:
        coefficient = int(whole + fraction) if fraction else int(whole)
        shift = int(exponent) if exponent else 0
    except ValueError:  # more digits than Python converts
        return None
    if fraction:
        shift -= len(fraction)
    return (-coefficient if match.group(1)[:1] == b"-" else coefficient), shift
