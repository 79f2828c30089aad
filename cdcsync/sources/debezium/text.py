"""Converters of text-like and binary values: booleans, text and ``varchar(n)``/``char(n)``, json and jsonb,
uuid, bytea, and Debezium's ``Bits`` for ``bit(n)`` / ``bit varying(n)``.

Text is checked, never cut silently: a ``varchar(n)`` too long, or a NUL character (Postgres cannot store it),
rejects the value; ``character`` without a length is ``character(1)``, as in Postgres. JSON objects keep the
exact text of their numbers (``12.50`` stays ``12.50``).
"""

from __future__ import annotations

import binascii
import json
import math
import uuid
from decimal import Decimal
from typing import Any

from cdcsync.config.toast import UNAVAILABLE_JSON, UNAVAILABLE_PLACEHOLDER
from cdcsync.config.types import PgType, hstore_text
from cdcsync.sources.debezium.values import (
    DEBEZIUM_BITS,
    Converter,
    Ctx,
    Reject,
    Reparse,
    b64,
    bad,
    column_schema,
    dumps_compact,
    dumps_exact,
    has_double,
    logical_type,
    show,
)


def bool_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: Ctx) -> Any:
        if value is True or value is False or value is None:
            return value
        raise bad(value, "boolean", "expected true or false")

    return convert


def _json_text(value: Any) -> str:
    """Compact JSON text of a parsed value (Decimals from the exact re-parse written as they came)."""
    try:
        return dumps_compact(value)
    except Exception:
        return dumps_exact(value)


def text_converter(pg: PgType) -> Converter:
    expected = pg.sql
    is_json = pg.name in ("json", "jsonb")
    max_length = pg.args[0] if pg.args and pg.name in ("character varying", "character") else None
    if pg.name == "character" and not pg.args:
        max_length = 1  # Postgres: character without a length is character(1)

    def convert(value: Any, ctx: Ctx) -> Any:
        kind = type(value)
        if kind is str:
            text = value
        elif value is None:
            return None
        elif kind is dict or kind is list:
            if has_double(value):  # keep the numbers' exact text (12.50 stays 12.50): parse exactly
                raise Reparse()
            try:
                text = _json_text(value)
            except ValueError:
                raise bad(value, expected, "not representable as JSON") from None
        elif kind is bool:
            text = "true" if value else "false"
        elif kind is int or kind is Decimal:
            text = str(value)
        elif kind is float:
            if is_json and not math.isfinite(value):
                raise bad(value, expected, "NaN and Infinity are not JSON")
            text = repr(value) if math.isfinite(value) else show(value)
        else:
            raise bad(value, expected)
        if "\x00" in text:
            raise bad(value, expected, "Postgres text cannot contain NUL characters")
        if is_json and text == UNAVAILABLE_PLACEHOLDER:
            return UNAVAILABLE_JSON  # an unchanged TOASTed json column: valid JSON, so that it reaches the merge
        if max_length is not None and len(text) > max_length:
            if text[max_length:].strip(" "):
                raise Reject(f"{show(value)} is longer than {expected} allows")
            text = text[:max_length]  # Postgres also cuts excess trailing spaces silently
        return text

    return convert


def hstore_converter(pg: PgType) -> Converter:
    """``hstore`` in Debezium's ``map`` mode (a JSON object, an Avro map) or ``json`` mode (that object as JSON
    text), to the Postgres text form ``"k"=>"v"``: keys are strings, values strings or NULL."""

    def convert(value: Any, ctx: Ctx) -> Any:
        if value is None:
            return None
        pairs = value
        if type(value) is str:
            try:
                pairs = json.loads(value)
            except ValueError:
                raise bad(value, "hstore", "expected a JSON object of strings") from None
        if type(pairs) is not dict or not all(type(v) is str or v is None for v in pairs.values()):
            raise bad(value, "hstore", "expected an object of strings")
        text = hstore_text(pairs)
        if "\x00" in text:
            raise bad(value, "hstore", "Postgres text cannot contain NUL characters")
        return text

    return convert


def uuid_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: Ctx) -> Any:
        if type(value) is str:
            try:
                return str(uuid.UUID(value))
            except ValueError:
                raise bad(value, "uuid") from None
        if value is None:
            return None
        raise bad(value, "uuid", "expected a string")

    return convert


def bytea_converter(pg: PgType) -> Converter:
    def convert(value: Any, ctx: Ctx) -> Any:
        if type(value) is str:
            try:
                return b64(value)
            except (ValueError, binascii.Error):
                raise bad(value, "bytea", "expected base64 as JsonConverter writes bytes") from None
        if value is None or type(value) is bytes:  # bytes: Avro, already binary
            return value
        raise bad(value, "bytea", "expected a base64 string")

    return convert


def bits_converter(name: str, pg: PgType) -> Converter:
    """``bit(n)`` / ``bit varying(n)`` from io.debezium.data.Bits: base64 bytes, little-endian, the last bit of
    the string in the lowest bit of the first byte, trailing zero bytes dropped. ``bit(n)`` gets its leading zeros
    back from n; a ``bit varying`` value cannot (Debezium drops them), so it comes back without them. A one-bit
    column arrives as a boolean. Written as the Postgres bit-string literal (``0101``)."""
    expected = pg.sql
    width = None
    if pg.name == "bit":
        width = pg.args[0] if pg.args else 1  # Postgres: bit without a length is bit(1)
    limit = width if width is not None else (pg.args[0] if pg.args else None)

    def convert(value: Any, ctx: Ctx) -> Any:
        if value is True or value is False:
            bits = "1" if value else "0"
        elif type(value) is str:
            logical = logical_type(column_schema(ctx, name))[0] if ctx[0] is not None else DEBEZIUM_BITS
            if logical == DEBEZIUM_BITS:
                try:
                    number = int.from_bytes(b64(value), "little")
                except ValueError:
                    raise bad(value, expected, "not base64 Bits bytes") from None
                bits = format(number, "b") if width is None else format(number, "b").rjust(width, "0")
            elif value and not value.strip("01"):
                bits = value
            else:
                raise bad(value, expected, "expected Bits bytes or a string of 0s and 1s")
        elif value is None:
            return None
        else:
            raise bad(value, expected, "expected Bits bytes (base64) or a boolean")
        if limit is not None and len(bits) > limit:
            raise Reject(f"{show(value)} has {len(bits)} bits, more than {expected} holds")
        if width is not None and len(bits) < width:
            bits = bits.rjust(width, "0")
        return bits

    return convert
