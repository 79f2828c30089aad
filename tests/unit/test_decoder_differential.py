"""The JSON batch path against the row decoder, on hostile input: whatever a batch holds, its output (rows, their
order, dead letters and failure reports) is what the row decoder gives decoding its messages one by one.

:mod:`cdcsync.sources.debezium.columnar` may only decline (a batch, or a message to the row decoder alone); it
never decides a message differently. ``test_debezium_columnar.py`` holds that over good, odd and bad *values*;
this file writes the messages themselves from parts, so that the JSON around the values is hostile too: keys
spelled with ``\\u`` escapes (``"sch\\u0065ma"``), duplicate keys (``op``, ``after``, a column, ``payload``),
extra and missing fields, pretty printing, numbers as strings and ``1e3`` / ``-0`` / huge ints / floats in
integer columns, ``NaN`` and ``Infinity``, ``\\u`` escapes and surrogate pairs (and lone surrogates) in strings,
bytes that are not UTF-8, deep nesting in a field nobody reads, ``before``/``after`` null or absent, tombstones,
truncates, ops ``r c u d t m``, source blocks with and without ``sequence`` / ``lsn``; in both JsonConverter shapes
(the schema-wrapped one also cut on the JVM), with the types the batch path reads and with types it leaves alone.
"""

from __future__ import annotations

import base64
import decimal
import functools
import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cdcsync.config.types import parse_pg_type
from cdcsync.sources.debezium.json import JsonPlan, _has_unicode_escape, wrapper_prefix
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.debezium.wrappers import with_wrappers
from tests.unit.test_debezium_columnar import comparable, jvm_cut, kafka_batch

pytestmark = pytest.mark.unit

BATCH_TYPES = {
    "id": "bigint",
    "i": "integer",
    "s": "smallint",
    "n": "numeric(12,2)",
    "w": "numeric(30,4)",
    "t": "text",
    "v": "varchar",
    "b": "boolean",
    "z": "timestamptz",
}
"""Every type the batch path reads."""
ALL_TYPES = {**BATCH_TYPES, "d": "date", "tm": "time", "j": "jsonb", "y": "bytea", "a": "integer[]"}
"""With types it leaves to the row decoder (the spec is then the row decoder's, which the test holds too)."""
CONNECT = {
    "bigint": {"type": "int64"},
    "integer": {"type": "int32"},
    "smallint": {"type": "int16"},
    "text": {"type": "string"},
    "varchar": {"type": "string"},
    "boolean": {"type": "boolean"},
    "timestamptz": {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1},
    "date": {"type": "int32", "name": "io.debezium.time.Date", "version": 1},
    "time": {"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1},
    "jsonb": {"type": "string", "name": "io.debezium.data.Json", "version": 1},
    "bytea": {"type": "bytes"},
    "integer[]": {"type": "array", "items": {"type": "int32", "optional": True}},
}
SCALES = {"n": 2, "w": 4}


def spec_of(columns: dict[str, str], detect: bool) -> DecodeSpec:
    return DecodeSpec(
        "things", tuple((name, parse_pg_type(t)) for name, t in columns.items()), ("id",), detect_schema_changes=detect
    )


SPECS = {
    "batch types": spec_of(BATCH_TYPES, False),
    "batch types, schema changes detected": spec_of(BATCH_TYPES, True),
    "all types": spec_of(ALL_TYPES, False),
}


@functools.lru_cache(maxsize=8)
def plans(spec: DecodeSpec) -> tuple[JsonPlan, JsonPlan]:
    return JsonPlan(spec), JsonPlan(spec, batch_path=False)


# ---- JSON text from parts ------------------------------------------------------------------------------------


class Obj(list):  # type: ignore[type-arg]
    """A JSON object as written: (key as raw JSON text, value) pairs, in order, duplicates kept. A value is an
    :class:`Obj` or the raw bytes of any other JSON value (numbers keep their exact text)."""


def key(name: str) -> bytes:
    return json.dumps(name, ensure_ascii=False).encode()


def write(value: Obj | bytes, style: str = "compact", depth: int = 0) -> bytes:
    """``compact`` as JsonConverter writes, ``spaced`` (``json.dumps``' separators) or ``pretty`` (indented)."""
    if isinstance(value, bytes):
        return value
    if not value:
        return b"{}"
    if style == "pretty":
        pad = b"\n" + b"  " * (depth + 1)
        items = [pad + k + b": " + write(v, style, depth + 1) for k, v in value]
        return b"{" + b",".join(items) + b"\n" + b"  " * depth + b"}"
    colon, comma = (b":", b",") if style == "compact" else (b": ", b", ")
    return b"{" + comma.join(k + colon + write(v, style, depth) for k, v in value) + b"}"


def jackson(text: str) -> bytes:
    """A JSON string as Jackson (JsonConverter) writes it: control characters escaped, the rest as UTF-8."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char in "\b\t\n\f\r":
            out.append(json.dumps(char)[1:-1])
        elif ord(char) < 0x20:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return ('"' + "".join(out) + '"').encode("utf-8", "surrogatepass")


def escaped(text: str, which: int) -> bytes:
    """A JSON string with its ``which``-th character (modulo) as a ``\\u`` escape (a surrogate pair above the
    BMP), in lower or upper case hex."""
    if not text:
        return b'""'
    at = which % len(text)
    code = ord(text[at])
    units = [code] if code < 0x10000 else [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)]
    form = "\\u{:04x}" if which % 2 else "\\u{:04X}"
    middle = "".join(form.format(u) for u in units)
    return jackson(text[:at])[:-1] + middle.encode() + jackson(text[at + 1 :])[1:]


def written(text: str) -> st.SearchStrategy[bytes]:
    """``text`` as a JSON string, written in one of the ways a JSON writer may: Jackson's, ASCII only (escapes and
    surrogate pairs), or with one character escaped."""
    return st.one_of(
        st.just(jackson(text)),
        st.just(jackson(text)),
        st.just(json.dumps(text).encode()),
        st.integers(0, 50).map(lambda which: escaped(text, which)),
    )


def b64_decimal(unscaled: int) -> bytes:
    size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return b'"' + base64.b64encode(unscaled.to_bytes(size, "big", signed=True)) + b'"'


TEXT_CHARS = st.characters(codec="utf-8", exclude_characters="\x00")  # any code point but surrogates and NUL
ODD_INTS = [
    b"1e3", b"-0", b"1.0", b"-0.0", b"1E2", b"0.5", b'"5"', b"true", b"NaN", b"Infinity", b"-Infinity",
    b"9223372036854775807", b"-9223372036854775808", b"9223372036854775808", b"18446744073709551616",
    b"123456789012345678901234567890", b"32768", b"-32769", b"2147483648", b"[1]", b"{}", b'"\\u0031"',
]  # fmt: skip
ODD_DECIMALS = [
    b"1.230", b"1.234", b"-0", b"-0.00", b"1e2", b"1E+2", b"100e-2", b"1e-400", b"1e400", b"NaN", b"Infinity",
    b'"NaN"', b'"Infinity"', b'" 1"', b'"1e5"', b'"+.5"', b'".5"', b'"5."', b'"-"', b'""', b'"\\u0661"', b'"0x10"',
    b'"1_0"', b'"007.50"', b"true", b"10000000000.00", b"99999999999999999999999999.9999", b"1.00000000000000000001",
    b"123456789012345678901234567890", b'"AQ=="', b'"@@"', b'"1.5\\u0030"',
]  # fmt: skip
ODD_CONNECT_DECIMALS = [b'"@@"', b'"AQ"', b'""', b'"AQ=="', b'" AQ=="', b"12", b"1.5", b'"\\u0041Q=="']
ODD_TEXTS = [
    b'"\\ud800"', b'"\\udc00\\ud800"', b'"a\\ud83d"', b'"\\u0000"', b'"a\\u0000b"', b'"\xff"', b'"\xed\xa0\x80"',
    b'"\xc0\xaf"', b'"\xf4\x90\x80\x80"', b'"\x01"', b'"\t"', b'"\\q"', b"5", b"true", b"{}", b"[]", b"NaN",
    b'"\\ud83d\\ude00"', b'"\\u2028\\/\\b"', b'"\\"schema\\""', b'"x\\"schema"', b'"payload"',
]  # fmt: skip
ODD_BOOLS = [b"1", b"0", b'"true"', b"True", b"nul", b"[]"]
ODD_TIMESTAMPS = [
    b'"2024-01-01T00:00:00.1234567Z"', b'"0000-01-01T00:00:00Z"', b'"2024-01-01T00:00:00+02:00"', b'"x"',
    b'"2024-01-01 00:00:00Z"', b'"infinity"', b'"-infinity"', b'"10000-01-01T00:00:00Z"', b'"2024-01-01T24:00:00Z"',
    b'"2024-02-30T00:00:00Z"', b'"2023-02-29T10:00:00.5Z"', b"1704067200000000", b'"2024-01-01T00:00:60Z"',
    b'"2024-01-01T00:00:00\\u005a"', b'"2024-01-01T00:00:00z"', b'"\\u0032024-01-01T00:00:00Z"',
]  # fmt: skip


@functools.cache
def good_value(pg: str, column: str, wrapped: bool) -> st.SearchStrategy[bytes]:
    """A column's value as Debezium writes it (null now and then)."""
    return st.one_of(st.just(b"null"), _good_value(pg, column, wrapped), _good_value(pg, column, wrapped))


def _good_value(pg: str, column: str, wrapped: bool) -> st.SearchStrategy[bytes]:
    if column == "id":
        return st.integers(1, 40).map(lambda i: str(i).encode())
    if pg in ("bigint", "integer", "smallint"):
        bits = {"bigint": 64, "integer": 32, "smallint": 16}[pg]
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1).map(lambda i: str(i).encode())
    if pg.startswith("numeric"):
        scale = SCALES[column]
        limit = 10 ** (12 if column == "n" else 30) - 1
        if wrapped:
            return st.integers(-limit, limit).map(b64_decimal)
        return st.one_of(
            st.integers(-limit, limit).map(
                lambda u: f"{'-' if u < 0 else ''}{abs(u) // 10**scale}.{abs(u) % 10**scale:0{scale}d}".encode()
            ),
            st.integers(-(10**6), 10**6).map(lambda i: str(i).encode()),
            st.integers(-(10**6), 10**6).map(lambda i: f'"{i / 4}"'.encode()),
        )
    if pg in ("text", "varchar", "jsonb"):
        return st.text(TEXT_CHARS, max_size=8).flatmap(written)
    if pg == "boolean":
        return st.sampled_from([b"true", b"false"])
    if pg == "timestamptz":
        spec = st.sampled_from(["seconds", "milliseconds", "microseconds"])
        return st.tuples(st.datetimes(), spec).map(lambda p: f'"{p[0].isoformat(timespec=p[1])}Z"'.encode())
    if pg in ("date", "time"):
        return st.integers(-(10**6), 10**6).map(lambda i: str(i).encode())
    if pg == "bytea":
        return st.binary(max_size=6).map(lambda b: b'"' + base64.b64encode(b) + b'"')
    assert pg == "integer[]"
    items = st.lists(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)), max_size=3)
    return items.map(lambda values: json.dumps(values).encode())


@functools.cache
def odd_value(pg: str, column: str, wrapped: bool) -> st.SearchStrategy[bytes]:
    """A column's value as a crafted message might hold it."""
    if pg in ("bigint", "integer", "smallint"):
        return st.sampled_from(ODD_INTS)
    if pg.startswith("numeric"):
        limit = 10 ** (12 if column == "n" else 30)
        extremes = [b64_decimal(limit), b64_decimal(-limit), b64_decimal(2**130)]
        return st.sampled_from(ODD_CONNECT_DECIMALS + extremes if wrapped else ODD_DECIMALS)
    odd = {
        "boolean": ODD_BOOLS,
        "timestamptz": ODD_TIMESTAMPS,
        "date": [b'"x"', b"1.5", b"2147483648"],
        "time": [b'"x"', b"1.5", b"-1"],
        "bytea": [b'"@@"', b"1", b'"\xff"'],
        "integer[]": [b"[[1]]", b'["x"]', b"[2147483648]", b"1", b"[1,]"],
    }.get(pg, ODD_TEXTS)
    return st.sampled_from(odd)


def deep(depth: int, inner: bytes = b"1") -> bytes:
    return b'{"a":' * depth + inner + b"}" * depth


EXTRA_VALUES = [
    b"NaN", b"-Infinity", b"123456789012345678901234567890", b"1e400", b'"\xff"', b'"\\ud800"', b"[1,{}]",
    b'"\\u0073chema"', b"[" * 600 + b"]" * 600, deep(1100), b"[" * 1030 + b"]" * 1030, b"nul", b"01",
    b"[" * 300 + b"]" * 300, b'"' + b"[" * 700 + b'"', b"null", b'{"schema":1,"payload":2}',
]  # fmt: skip
EXTRA_NAMES = [b'"x"', b'"payloads"', b'"schema_name"', b'""', b'"\\u0000"', b'"\\u0078"', b'"\xff"']


@st.composite
def row(draw: st.DrawFn, columns: dict[str, str], wrapped: bool, odd: str | None = None) -> Obj:
    """A row of a change: every column (but now and then one missing), ``odd`` with a crafted value."""
    out = Obj()
    missing = draw(st.integers(0, 4 * len(columns)))
    for at, (name, pg) in enumerate(columns.items()):
        if at != missing:
            value = draw(odd_value(pg, name, wrapped) if name == odd else good_value(pg, name, wrapped))
            out.append((key(name), value))
    return out


SEQUENCES = st.one_of(
    st.tuples(st.integers(1, 2**62 - 1), st.integers(1, 2**64 - 1)).map(lambda p: f'["{p[0]}","{p[1]}"]'),
    st.integers(1, 2**64 - 1).map(lambda lsn: f'[null,"{lsn}"]'),
).map(lambda sequence: json.dumps(sequence).encode())
MILLIS = st.one_of(st.integers(0, 2**42), st.integers(-(2**63), 2**63 - 1)).map(lambda i: str(i).encode())
SNAPSHOTS = st.sampled_from([b'"true"', b'"false"', b'"last"', b'"incremental"'])
LSNS = st.integers(1, 2**64 - 1).map(lambda i: str(i).encode())
ODD_SOURCE_VALUES = {
    b'"ts_ms"': [b"1.5", b'"1"', b"18446744073709551616", b"-9223372036854775808", b"null"],
    b'"snapshot"': [b"true", b'"increment\\u0061l"', b'"INCREMENTAL"', b"1"],
    b'"sequence"': [
        b"null", b"7", b'"x"', b'"[\\"1\\",\\"2\\",\\"3\\"]"', b'"[\\"0\\",\\"2\\"]"', b'"[\\"\\u0661\\",\\"2\\"]"',
        b'"[null,null]"', b'"[\\"1\\", \\"2\\"]"', f'"[\\"{2**64}\\",\\"2\\"]"'.encode(), b'["1","2"]',
        f'"[\\"{2**62}\\",\\"2\\"]"'.encode(), b'"[\\"1\\",\\"0\\"]"', b'"[null,\\"0\\"]"', b'"[\\"01\\",\\"2\\"]"',
    ],
    b'"lsn"': [b"0", b"-1", b'"5"', b"5.0", b"18446744073709551616", b"18446744073709551615", b"null"],
    b'"schema"': [b"null", b"1", b"{}", b'"sch\\u0065ma"'],
}  # fmt: skip


@st.composite
def source(draw: st.DrawFn, odd: bool) -> Obj:
    """A source block of Debezium's Postgres connector, with or without ``sequence`` / ``lsn`` / ``snapshot``;
    when ``odd``, one of its fields crafted."""
    out = Obj([(b'"version"', b'"3.0.0.Final"'), (b'"connector"', b'"postgresql"'), (b'"name"', b'"shop"')])
    out.append((b'"ts_ms"', draw(MILLIS)))
    if draw(st.booleans()):
        out.append((b'"snapshot"', draw(SNAPSHOTS)))
    out.append((b'"db"', b'"shop"'))
    if draw(st.integers(0, 4)):
        out.append((b'"sequence"', draw(SEQUENCES)))
    out += [(b'"schema"', b'"public"'), (b'"table"', b'"things"'), (b'"txId"', b"771")]
    if draw(st.booleans()):
        out.append((b'"lsn"', draw(LSNS)))
    if odd:
        name = draw(st.sampled_from(list(ODD_SOURCE_VALUES)))
        value = draw(st.sampled_from(ODD_SOURCE_VALUES[name]))
        found = [i for i, (k, _) in enumerate(out) if k == name]
        if found:
            out[found[0]] = (name, value)
        else:
            out.insert(draw(st.integers(0, len(out))), (name, value))
    return out


OPS = [b'"c"', b'"u"', b'"r"', b'"d"']
ODD_OPS = [b'"t"', b'"m"', b'"x"', b'""', b"null", b"1", b'"\\u0063"', b'"C"', b'"d "']
FEATURES = ["value", "extra", "source", "op", "rows", "mangle", "style", "bytes", "wrapper", "key", "ts_ms"]
FEATURES += ["value", "value", "extra", "extra", "mangle", "mangle", "mangle"]
"""What a crafted message has that Debezium's do not: one of these each (those where Arrow's reader and the row
decoder's parsers may part more often)."""


@st.composite
def payload(draw: st.DrawFn, columns: dict[str, str], wrapped: bool, odd: str | None) -> Obj:
    op = draw(st.sampled_from(ODD_OPS if odd == "op" else OPS))
    odd_column = draw(st.sampled_from(list(columns))) if odd == "value" else None
    change = row(columns, wrapped, odd_column)
    if op in (b'"t"', b'"m"'):  # a truncate, a logical decoding message: no rows
        before = after = draw(st.sampled_from([None, b"null"]))
    elif op == b'"d"':
        before, after = draw(change), draw(st.sampled_from([None, b"null"]))
    else:
        before, after = draw(st.sampled_from([None, b"null", b"null", draw(change)])), draw(change)
    if odd == "rows":
        swaps = [(before, None), (before, b"null"), (None, after), (b'"x"', after), (before, b'"x"'), (b"{}", b"{}")]
        before, after = draw(st.sampled_from([*swaps, (after, before), (before, b"[]"), (after, after)]))
    out = Obj()
    for name, part in ((b'"before"', before), (b'"after"', after)):
        if part is not None:
            out.append((name, part))
    block = draw(source(odd == "source"))
    if odd == "source" and draw(st.integers(0, 3)) == 0:
        out.append((b'"source"', draw(st.sampled_from([b"null", b'"x"', b"[]", Obj(block[:3])]))))
    elif odd != "source" or draw(st.integers(0, 5)):
        out.append((b'"source"', block))
    if draw(st.integers(0, 3)) == 0:
        out.append((b'"transaction"', draw(st.sampled_from([b"null", b'{"id":"771:1","total_order":1}']))))
    if op == b'"m"':
        out.append((b'"message"', b'{"prefix":"p","content":"aGk="}'))
    if odd != "op" or draw(st.integers(0, 8)):
        out.append((b'"op"', op))
    odd_millis = [b"-1", b"null", b"99999999999999999", b"1.5", b'"1"', b"-9223372036854775809", b"1e12"]
    if odd == "ts_ms" or draw(st.booleans()):
        out.append((b'"ts_ms"', draw(st.sampled_from(odd_millis if odd == "ts_ms" else [b"1700000000000"]))))
    if odd == "extra":
        where = draw(st.sampled_from([out] + [v for _, v in out if isinstance(v, Obj)]))
        extra = (draw(st.sampled_from(EXTRA_NAMES)), draw(st.sampled_from(EXTRA_VALUES)))
        where.insert(draw(st.integers(0, len(where))), extra)
    if odd == "mangle":
        mangle(draw, out)
    return out


def mangle(draw: st.DrawFn, payload: Obj) -> None:
    """One of the ways a crafted payload's keys differ from Debezium's."""
    objects = [payload] + [v for _, v in payload if isinstance(v, Obj) and v]
    how = draw(st.integers(0, 5))
    if how == 0:  # a key spelled with an escape: at the top, in the source block or in a row
        where = draw(st.sampled_from(objects))
        if where:
            at = draw(st.integers(0, len(where) - 1))
            where[at] = (escaped(json.loads(where[at][0]), draw(st.integers(0, 20))), where[at][1])
    elif how == 1:  # a duplicate key, at the top, in the source block or in a row, with another value
        where = draw(st.sampled_from(objects))
        if where:
            name, _ = where[draw(st.integers(0, len(where) - 1))]
            name = draw(st.sampled_from([name, escaped(json.loads(name), draw(st.integers(0, 9)))]))
            twin = draw(st.sampled_from([b"null", b'"d"', b'"c"', b"1", b'{"id":2}', b'"x"', b'"public"']))
            where.insert(draw(st.integers(0, len(where))), (name, twin))
    elif how == 2:  # a top-level "schema" or "payload" key, plainly or with an escape
        names = [b'"schema"', b'"payload"', b'"sch\\u0065ma"', b'"p\\u0061yload"', b'"\\u0073chema"', b'"SCHEMA"']
        value = draw(st.sampled_from([b"null", b"{}", b'{"type":"struct"}', write(Obj(payload))]))
        payload.insert(draw(st.integers(0, len(payload))), (draw(st.sampled_from(names)), value))
    elif how == 3:  # the source block's "schema" key escaped, and a literal one elsewhere or not
        for _, part in payload:
            if isinstance(part, Obj):
                for i, (name, value) in enumerate(part):
                    if name == b'"schema"':
                        part[i] = (b'"sch\\u0065ma"', value)
        if draw(st.booleans()):
            where = draw(st.sampled_from(objects))
            where.insert(draw(st.integers(0, len(where))), (b'"schema"', draw(st.sampled_from([b"null", b'"s"']))))
    elif how == 4:  # a field missing
        if payload:
            del payload[draw(st.integers(0, len(payload) - 1))]
    else:  # "op" twice, the row where the other op would take it
        payload.insert(draw(st.integers(0, len(payload))), (b'"op"', draw(st.sampled_from(OPS))))


def connect_schema(columns: dict[str, str], scale_n: int = 2) -> bytes:
    fields = []
    for name, pg in columns.items():
        if name in SCALES:
            scale = scale_n if name == "n" else SCALES[name]
            field: dict[str, Any] = {
                "type": "bytes",
                "name": "org.apache.kafka.connect.data.Decimal",
                "version": 1,
                "parameters": {"scale": str(scale)},
            }
        else:
            field = dict(CONNECT[pg])
        fields.append({**field, "optional": name != "id", "field": name})
    row_schema = {"type": "struct", "fields": fields, "optional": True, "name": "shop.public.things.Value"}
    schema = {
        "type": "struct",
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {"type": "struct", "fields": [], "optional": False, "name": "Source", "field": "source"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
        "optional": False,
        "name": "shop.public.things.Envelope",
    }
    return json.dumps(schema, separators=(",", ":")).encode()


KEY_SCHEMA = b'{"type":"struct","fields":[{"type":"int64","optional":false,"field":"id"}],"optional":false}'


@st.composite
def message(
    draw: st.DrawFn, columns: dict[str, str], wrapped: bool, odd: str | None
) -> tuple[bytes | None, bytes | None]:
    """(key, value) of one Kafka message, as Debezium writes it but for the crafted feature ``odd``."""
    key_id = draw(st.integers(1, 40))
    keys = [f'{{"id":{key_id}}}'.encode(), b'{"schema":' + KEY_SCHEMA + f',"payload":{{"id":{key_id}}}}}'.encode()]
    odd_keys = [None, b"x", b'{"id":null}', b"{}", b'{"id":"7"}', b'{"id":1e3}', b'{"\\u0069d":3}', b'{"id":1,"id":2}']
    message_key = draw(st.sampled_from(keys[1:] if wrapped else keys[:1]))
    if odd == "key":
        message_key = draw(st.sampled_from(odd_keys))
    body = draw(payload(columns, wrapped, odd))
    if odd == "key" and draw(st.booleans()):  # a row without its key: the message key gives it
        for _, part in body:
            if isinstance(part, Obj):
                part[:] = [(k, v) for k, v in part if k != b'"id"']
    style = draw(st.sampled_from(["spaced", "pretty"])) if odd == "style" else "compact"
    if wrapped:
        scale_n = draw(st.sampled_from([2, 3, 2])) if odd == "wrapper" else 2
        envelope = Obj([(b'"schema"', connect_schema(columns, scale_n)), (b'"payload"', body)])
        if odd == "wrapper" and draw(st.booleans()):
            twin = draw(st.sampled_from([b"null", b"{}", write(body), b'{"op":"d"}']))
            extra = draw(st.sampled_from([(b'"payload"', twin), (b'"schema"', b"{}"), (b'"x"', b"{}")]))
            envelope.insert(draw(st.integers(1, 2)), extra)
        text = write(envelope, style if odd == "style" and draw(st.booleans()) else "compact")
        if odd == "style":  # only the payload re-indented
            text = text[: text.index(b'"payload":') + 10] + write(body, style) + b"}"
    else:
        text = write(body, style)
    if odd == "bytes":
        at = draw(st.integers(0, len(text)))
        damaged = [
            text[:at],
            text + b" ",
            b" " + text,
            b"\xef\xbb\xbf" + text,
            text + text,
            text[:at] + b"\xff" + text[at:],
        ]
        damaged += [b"", b"{}", b"null", b"[]", b'"x"', text.replace(b",", b",\n", 1), text.replace(b":", b" : ")]
        text = draw(st.sampled_from(damaged))
    return message_key, text


@st.composite
def batches(draw: st.DrawFn, spec: str, size: int = 6) -> list[tuple[bytes | None, bytes | None]]:
    """Debezium's messages, a tombstone now and then, and up to two crafted ones (one feature each), all plain
    or all wrapped, or mixed."""
    columns = ALL_TYPES if spec == "all types" else BATCH_TYPES
    shape = draw(st.sampled_from(["plain", "wrapped", "plain", "wrapped", "mixed"]))

    def one(odd: str | None) -> st.SearchStrategy[tuple[bytes | None, bytes | None]]:
        wrapped = st.just(shape == "wrapped") if shape != "mixed" else st.booleans()
        return wrapped.flatmap(lambda w: message(columns, w, odd))

    out = draw(st.lists(one(None), min_size=1, max_size=size))
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2]))):
        out.insert(draw(st.integers(0, len(out))), draw(st.sampled_from(FEATURES).flatmap(one)))
    for _ in range(draw(st.sampled_from([0, 0, 1]))):
        key = draw(st.sampled_from([b'{"id":5}', b"x", None]))
        out.insert(draw(st.integers(0, len(out))), (key, None))  # a tombstone
    return out


# ---- the claim -------------------------------------------------------------------------------------------------


def one_by_one(plan: JsonPlan, batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The row decoder's output for each message alone, in order."""
    rows: list[dict[str, Any]] = []
    for i in range(batch.num_rows):
        rows += comparable(plan.decode_batch(batch.slice(i, 1)))
    return rows


def assert_same(spec: DecodeSpec, messages: list[tuple[bytes | None, bytes | None]]) -> bool:
    """The batch path's output is the row decoder's, message by message; True if it took the batch (the schema
    wrappers cut on the JVM too, with the wrappers the messages teach)."""
    fast, slow = plans(spec)
    batch = kafka_batch(messages)
    expected = one_by_one(slow, batch)
    got = fast.decode_batch(batch)
    assert got.schema == slow.schema
    assert comparable(got) == expected
    learned = {wrapper_prefix(v) for pair in messages for v in pair if v is not None} - {None}
    if learned:
        wrappers = tuple(sorted(w for w in learned if w is not None))[:6]
        cut = with_wrappers(jvm_cut(batch, wrappers), wrappers)
        assert comparable(fast.decode_batch(cut)) == expected
    return fast._columnar is not None and fast._decode_columnar(batch) is not None


@pytest.mark.parametrize(
    ("spec", "examples", "size"),
    [("batch types", 40, 6), ("batch types, schema changes detected", 15, 6), ("all types", 8, 6)]
    + [pytest.param(spec, 2_000, 40, marks=pytest.mark.soak) for spec in SPECS],
)
def test_the_batch_path_agrees_with_the_row_decoder_on_hostile_batches(spec: str, examples: int, size: int) -> None:
    """A few dozen batches per run (seconds); ``make soak`` runs 2,000 per spec. The batch path leaves a spec with
    ``all types`` to the row decoder whole: the claim holds trivially, and checks the one-by-one reference."""

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        took = assert_same(SPECS[spec], data.draw(batches(spec, size)))
        event(f"the batch path took the batch: {took}")

    check()


# ---- the disagreements found, one by one -----------------------------------------------------------------------

SOURCE = b'{"version":"3.0.0.Final","connector":"postgresql","name":"shop","ts_ms":1700000000000,"db":"shop",'
SOURCE += b'"sequence":"[\\"100\\",\\"200\\"]","schema":"public","table":"things","txId":771,"lsn":200}'


def change(row: bytes, *, top: bytes = b"", source: bytes = SOURCE, wrapped: bool = False) -> bytes:
    payload = (
        b'{"before":null,"after":' + row + b',"source":' + source + b',"op":"c"' + top + b',"ts_ms":1700000000001}'
    )
    return b'{"schema":' + connect_schema(BATCH_TYPES) + b',"payload":' + payload + b"}" if wrapped else payload


GOOD_ROW = b'{"id":7,"i":-5,"s":3,"n":"12.50","w":1.5,"t":"caf\xc3\xa9","v":"x","b":true,"z":"2024-05-01T10:00:00.5Z"}'
WRAPPED_ROW = b'{"id":7,"n":"BOI=","w":"AA==","t":"x"}'
CRAFTED = {
    # Arrow reads keys with their escapes resolved, as the row decoder does; but only a literal "schema" or
    # "payload" at the top was looked for, and the row decoder reads either as a wrapper.
    "a top-level key spelled sch\\u0065ma": (change(GOOD_ROW, top=b',"sch\\u0065ma":null'), True),
    "a top-level key spelled p\\u0061yload": (change(GOOD_ROW, top=b',"p\\u0061yload":{"op":"d"}'), True),
    "a literal top-level schema, the source's spelled sch\\u0065ma": (
        change(GOOD_ROW, top=b',"schema":null', source=SOURCE.replace(b'"schema"', b'"sch\\u0065ma"')),
        True,
    ),
    # Arrow's JSON reader checks no UTF-8, in values or in the fields it skips.
    "a text that is not UTF-8": (change(GOOD_ROW.replace(b'"x"', b'"\xff"')), False),
    "a UTF-8 surrogate in a skipped field": (change(GOOD_ROW, top=b',"x":"\xed\xa0\x80"'), False),
    "a key that is not UTF-8": (change(GOOD_ROW, top=b',"\xc0\xaf":1'), False),
    # Arrow reads any depth; orjson stops at 1,024 levels and the standard library at the recursion limit.
    "1,100 levels in a skipped field": (change(GOOD_ROW, top=b',"x":' + deep(1100)), True),
    "600 levels in a skipped field (both read it)": (change(GOOD_ROW, top=b',"x":' + b"[" * 600 + b"]" * 600), True),
    # Debezium writes these; the batch path must keep taking them.
    "pretty printed": (json.dumps(json.loads(change(GOOD_ROW)), indent=2).encode(), True),
    "escaped control characters and a surrogate pair": (
        change(GOOD_ROW.replace(b'"x"', b'"\\u0001\\u001F\\ud83d\\ude00\\/"')),
        True,
    ),
    "-0 in an integer column": (change(GOOD_ROW.replace(b'"i":-5', b'"i":-0')), True),
}


@pytest.mark.parametrize("crafted", list(CRAFTED))
def test_a_crafted_message_among_debezium_ones_is_decided_as_the_row_decoder_decides(crafted: str) -> None:
    """Each way the batch path once parted from the row decoder; ``took``: the batch path keeps the batch (and
    leaves the crafted message alone to the row decoder) rather than declining it whole."""
    value, took = CRAFTED[crafted]
    good = change(GOOD_ROW)
    messages = [(b'{"id":7}', good), (b'{"id":7}', value), (b'{"id":7}', good)]
    assert assert_same(SPECS["batch types"], messages) is took


def test_escaped_control_characters_stay_with_the_batch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Debezium writes a control character as ``\\u0001``: that spells no key, so such a payload is not left to
    the row decoder (nor is one with ``\\u00e9`` or a surrogate pair), while ``\\u0065`` is."""
    escapes = [b'"\\u0001\\u001F"', b'"caf\\u00e9"', b'"\\ud83d\\ude00\\/"']
    messages = [(b'{"id":7}', change(GOOD_ROW.replace(b'"x"', escape))) for escape in escapes]
    fast, slow = plans(SPECS["batch types"])
    expected = comparable(slow.decode_batch(kafka_batch(messages)))
    monkeypatch.setattr(fast, "decode_rows", None)  # nothing may reach the row decoder
    assert comparable(fast.decode_batch(kafka_batch(messages))) == expected
    monkeypatch.undo()
    spelled = [(b'{"id":7}', change(GOOD_ROW, top=b',"\\u0078":1'))]
    assert assert_same(SPECS["batch types"], messages + spelled)


def test_connect_decimals_wider_than_28_digits_are_exact() -> None:
    """``Decimal`` arithmetic rounds to 28 digits: the batch path once read a 30-digit ``numeric(30,4)`` that
    way (silently, or failing the task). Now the unscaled integer is written into ``decimal128`` as it is."""
    unscaled = [10**29 + 1, -(10**30) + 1, 2**63, 123456789012345678901234567891]
    rows = [WRAPPED_ROW.replace(b'"AA=="', b64_decimal(u)) for u in unscaled]
    messages = [(b'{"id":7}', change(r, wrapped=True)) for r in rows]
    assert assert_same(SPECS["batch types"], messages)
    fast, _ = plans(SPECS["batch types"])
    got = fast.decode_batch(kafka_batch(messages)).column("w").to_pylist()
    with decimal.localcontext(decimal.Context(prec=60)):
        assert [int(value.scaleb(4)) for value in got] == unscaled


@given(st.binary(max_size=12).map(lambda b: b.replace(b"a", b"\\").replace(b"b", b"u")))
def test_the_escape_scan_finds_what_a_substring_search_finds(text: bytes) -> None:
    assert _has_unicode_escape(text) is (b"\\u" in text)
