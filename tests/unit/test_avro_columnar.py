"""The batch path of Avro decoding (:mod:`cdcsync.sources.debezium.avro_columnar`) against the row decoder: for
any batch, both give the same output, row for row, dead letters included; and the batch path does take the
batches Debezium writes. Messages are written with fastavro, some then damaged byte by byte."""

from __future__ import annotations

import functools
import io
import math
import struct
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from cdcsync.config.types import parse_pg_type
from cdcsync.core.temporal import MAX_DATE_DAYS, MIN_DATE_DAYS, MIN_TIMESTAMP_MICROS
from cdcsync.devstack import workload
from cdcsync.sources.debezium import avro_registry
from cdcsync.sources.debezium.avro import AvroPlan
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess, strip_logical_types
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.debezium.temporal import DEBEZIUM_DATE_SENTINELS, PGJDBC_TIMESTAMP_SENTINELS
from tests.unit.test_avro_decode import KEY_SCHEMA, FakeRegistry, connect, connect_decimal, opt, signed
from tests.unit.test_debezium_columnar import COLUMNS as JSON_COLUMNS
from tests.unit.test_debezium_columnar import comparable, kafka_batch, same_output

pytestmark = pytest.mark.unit

COLUMNS = {
    **JSON_COLUMNS,
    "d": "double precision",
    "dt": "date",
    "ts": "timestamp",
    "tm": "timestamp(3)",
    "tl": "timestamp",
    "tn": "timestamptz",
}
ZONED = connect("string", "io.debezium.time.ZonedTimestamp")
ROW_FIELDS: list[tuple[str, Any]] = [
    ("id", opt("long")),
    ("i", opt("int")),
    ("s", opt({"type": "int", "connect.type": "int16"})),
    ("t", opt("string")),
    ("v", "string"),
    ("b", opt("boolean")),
    ("n", opt(connect_decimal(2))),
    ("z", opt(ZONED)),
    ("d", opt("double")),
    ("dt", opt(connect("int", "io.debezium.time.Date"))),
    ("ts", opt(connect("long", "io.debezium.time.MicroTimestamp"))),
    ("tm", opt(connect("long", "io.debezium.time.MicroTimestamp"))),
    ("tl", opt(connect("long", "org.apache.kafka.connect.data.Timestamp", logicalType="timestamp-millis"))),
    ("tn", opt(connect("long", "io.debezium.time.NanoTimestamp"))),
    # Not declared: read past, never kept.
    ("f", opt("float")),
    ("e", opt({"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]})),
    ("x", opt({"type": "fixed", "name": "Three", "size": 3})),
    (
        "r",
        opt(
            {
                "type": "record",
                "name": "Inner",
                "fields": [{"name": "a", "type": "long"}, {"name": "w", "type": "bytes"}],
            }
        ),
    ),
    ("u", ["null", "long", "string"]),
]
ACCESS = SchemaRegistryAccess(f"http://fake-registry-{uuid.uuid4().hex[:8]}:8081", retry_timeout_s=0.2)
REGISTRY = FakeRegistry()


def envelope(source_optional: bool) -> dict[str, Any]:
    row = {
        "type": "record",
        "name": "Value",
        "namespace": "shop.public.things",
        "fields": [{"name": n, "type": t} for n, t in ROW_FIELDS],
    }
    source = {
        "type": "record",
        "name": "Source",
        "namespace": "io.debezium.connector.postgresql",
        "fields": [
            {"name": "version", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {"name": "snapshot", "type": opt(connect("string", "io.debezium.data.Enum"))},
            {"name": "sequence", "type": opt("string")},
            {"name": "lsn", "type": opt("long")},
        ],
    }
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": "shop.public.things",
        "fields": [
            {"name": "before", "type": opt(row)},
            {"name": "after", "type": opt("Value")},
            {"name": "source", "type": opt(source) if source_optional else source},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": opt("long")},
        ],
    }


SCHEMAS = {1: KEY_SCHEMA, 2: envelope(False), 3: envelope(True)}
PARSED = {i: fastavro.parse_schema(strip_logical_types(s)) for i, s in SCHEMAS.items()}
for schema_id, schema in SCHEMAS.items():
    REGISTRY.add(schema, schema_id)


@pytest.fixture(autouse=True, scope="module")
def registry() -> Iterator[None]:
    avro_registry._CLIENTS[ACCESS] = REGISTRY
    try:
        yield
    finally:
        avro_registry._CLIENTS.pop(ACCESS, None)


def spec_of(columns: dict[str, str], *, detect: bool = False, key: tuple[str, ...] | None = ("id",)) -> DecodeSpec:
    """Declared columns; the primary key ``key``, or None: the message key's fields."""
    return DecodeSpec(
        "things",
        tuple((name, parse_pg_type(t)) for name, t in columns.items()),
        key,
        format="avro",
        schema_registry=ACCESS,
        detect_schema_changes=detect,
    )


@functools.lru_cache(maxsize=16)
def plans(spec: DecodeSpec) -> tuple[AvroPlan, AvroPlan]:
    return AvroPlan(spec), AvroPlan(spec, batch_path=False)


def both_paths(spec: DecodeSpec, batch: pa.RecordBatch) -> tuple[list[dict[str, Any]], bool]:
    """The row decoder's output, after checking that the batch path gives the same; and whether it took it."""
    fast, slow = plans(spec)
    took = fast._decode_columnar(batch) is not None
    return same_output(fast, slow, batch), took


def encode(schema_id: int, record: Any) -> bytes:
    out = io.BytesIO()
    out.write(b"\0" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, PARSED[schema_id], record)
    return out.getvalue()


def pick(level: int, good: st.SearchStrategy[Any], odd: list[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``good``; at level 1 now and then one of ``odd`` (which the batch path may leave to the row
    decoder)."""
    if not level or not odd:
        return good
    return st.integers(0, 10).flatmap(lambda n: st.sampled_from(odd) if n == 0 else good)


TEXTS = st.text(max_size=6)
ODD_DAYS = [MIN_DATE_DAYS, MIN_DATE_DAYS - 1, MAX_DATE_DAYS, MAX_DATE_DAYS + 1, *DEBEZIUM_DATE_SENTINELS]
ODD_MICROS = [2**63 - 1, -(2**63), MIN_TIMESTAMP_MICROS, MIN_TIMESTAMP_MICROS - 1, *PGJDBC_TIMESTAMP_SENTINELS]
TIMESTAMPS = st.datetimes().map(lambda d: d.isoformat(timespec="microseconds") + "Z")
ODD_TIMESTAMPS = ["2024-01-01T00:00:00.1234567Z", "0000-01-01T00:00:00Z", "2024-01-01T00:00:00+02:00", "x"]
ODD_TIMESTAMPS += ["2024-02-30T00:00:00Z", "infinity", "10000-01-01T00:00:00Z", "2024-01-01T24:00:00Z"]
DECIMALS = st.integers(-(10**12) + 1, 10**12 - 1).map(signed)
ODD_DECIMALS = [signed(10**12), signed(-(10**12)), signed(2**70), signed(-(2**63)), b"", b"\x00" * 9 + b"\x01"]
SEQUENCES = st.one_of(
    st.tuples(st.integers(1, 2**62 - 1), st.integers(1, 2**64 - 1)).map(lambda p: f'["{p[0]}","{p[1]}"]'),
    st.integers(1, 2**64 - 1).map(lambda lsn: f'[null,"{lsn}"]'),
)
ODD_SEQUENCES = ['["1","2","3"]', '["\u0661","2"]', "x", None, '["0","2"]', '["1","0"]', f'["{2**62}","2"]']
ODD_SEQUENCES += [f'["{2**64}","2"]', '[null,"0"]']


@st.composite
def rows(draw: st.DrawFn, level: int) -> dict[str, Any]:
    return {
        "id": draw(pick(level, st.integers(1, 40), [None, -(2**63), 2**63 - 1])),
        "i": draw(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1))),
        "s": draw(pick(level, st.integers(-(2**15), 2**15 - 1), [2**15, -(2**15) - 1, 2**31 - 1])),
        "t": draw(pick(level, st.one_of(st.none(), TEXTS), ["a\x00b", "é"])),
        "v": draw(TEXTS),
        "b": draw(st.sampled_from([True, False, None])),
        "n": draw(pick(level, st.one_of(st.none(), DECIMALS), ODD_DECIMALS)),
        "z": draw(pick(level, st.one_of(st.none(), TIMESTAMPS), ODD_TIMESTAMPS)),
        "d": draw(st.one_of(st.none(), st.floats(allow_nan=False))),
        "dt": draw(pick(level, st.one_of(st.none(), st.integers(-(10**6), 3 * 10**6)), ODD_DAYS)),
        "ts": draw(pick(level, st.one_of(st.none(), st.integers(-(2**62), 2**62)), ODD_MICROS)),
        "tm": draw(
            st.one_of(
                st.none(), st.integers(-(10**15), 10**15).map(lambda m: m * 1000), st.integers(-(2**63), 2**63 - 1)
            )
        ),
        "tl": draw(pick(level, st.one_of(st.none(), st.integers(-(2**50), 2**50)), ODD_MICROS)),
        "tn": draw(pick(level, st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), ODD_MICROS)),
        "f": draw(st.one_of(st.none(), st.floats(width=32))),
        "e": draw(st.sampled_from([None, "RED", "GREEN"])),
        "x": draw(st.sampled_from([None, b"abc"])),
        "r": draw(st.sampled_from([None, {"a": -5, "w": b"\xff\x00"}])),
        "u": draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), TEXTS)),
    }


def damage(raw: bytes, how: int, at: int, byte: int) -> bytes:
    at = 5 + at % max(1, len(raw) - 5)
    if how == 0:
        return raw[:at]
    if how == 1:
        return raw + bytes([byte])
    if how == 2:
        return raw[:at] + bytes([byte]) + raw[at + 1 :]
    if how == 3:
        return raw[:at] + bytes([byte]) + raw[at:]
    return bytes([byte]) + raw[1:]


@st.composite
def messages(draw: st.DrawFn, level: int) -> tuple[bytes | None, bytes | None]:
    key_id = draw(st.integers(1, 40))
    key = draw(st.sampled_from([encode(1, {"id": key_id}), None, b"\0\0\0\0\x09\x02"]))
    if draw(st.integers(0, 9)) == 0:
        return key, None  # a tombstone
    schema_id = draw(st.sampled_from([2, 2, 2, 3])) if level else 2
    op = draw(pick(level, st.sampled_from(["c", "u", "r", "d"]), ["t", "x", ""]))
    source = {
        "version": "3.0",
        "ts_ms": draw(st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**42))),
        "snapshot": draw(st.sampled_from(["true", "false", "incremental", "last", None])),
        "sequence": draw(pick(level, SEQUENCES, ODD_SEQUENCES)),
        "lsn": draw(pick(level, st.one_of(st.none(), st.integers(1, 2**63 - 1)), [0, -1])),
    }
    record = {
        "before": draw(st.one_of(st.none(), rows(level))),
        "after": draw(pick(level, rows(level), [None])),
        "source": source if schema_id == 2 or draw(st.integers(0, 5)) else None,
        "op": op,
        "ts_ms": draw(st.sampled_from([1_700_000_000_000, -1, None, 2**62])),
    }
    raw = encode(schema_id, record)
    if level and draw(st.integers(0, 8)) == 0:
        raw = damage(raw, draw(st.integers(0, 4)), draw(st.integers(0, 10**6)), draw(st.integers(0, 255)))
    return key, raw


BATCHES = st.sampled_from([0, 1, 1]).flatmap(lambda level: st.lists(messages(level), min_size=1, max_size=12))


@pytest.mark.parametrize("key", [("id",), None], ids=["declared key", "key from the message key"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=BATCHES)
def test_the_batch_path_decodes_any_batch_as_the_row_decoder_does(
    key: tuple[str, ...] | None, batch: list[tuple[bytes | None, bytes | None]]
) -> None:
    both_paths(spec_of(COLUMNS, key=key), kafka_batch(batch))


@pytest.mark.soak
@pytest.mark.parametrize("key", [("id",), None], ids=["declared key", "key from the message key"])
@settings(max_examples=1_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=BATCHES)
def test_the_batch_path_decodes_any_batch_as_the_row_decoder_does_soak(
    key: tuple[str, ...] | None, batch: list[tuple[bytes | None, bytes | None]]
) -> None:
    both_paths(spec_of(COLUMNS, key=key), kafka_batch(batch))


def test_debezium_avro_batches_take_the_batch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workload's changes as AvroConverter writes them: decoded by the batch path, tombstones included."""
    REGISTRY.add(workload.ORDERS_AVRO_KEY_SCHEMA, 11)
    REGISTRY.add(workload.ORDERS_AVRO_VALUE_SCHEMA, 12)
    generated = workload.generate(2_000, 300, seed=7)
    batch = workload.to_kafka_batch(workload.to_avro(generated.events, 11, 12))
    for detect, key in ((False, ("id",)), (True, ("id",)), (False, None)):
        rows, took = both_paths(spec_of(dict(workload.ORDERS_COLUMNS), detect=detect, key=key), batch)
        assert took
        assert len(rows) == len(generated.events)
        assert not any(row["_dlq_reason"] for row in rows)
        assert {row["_cdc_op"] for row in rows} == {"c", "u", "d"}
        assert sum(row["_cdc_version"] is None for row in rows) == sum(e.value is None for e in generated.events)
    # Nothing went to the row decoder, not even the tombstones.
    for key in (("id",), None):
        fast, _ = plans(spec_of(dict(workload.ORDERS_COLUMNS), key=key))
        monkeypatch.setattr(fast, "decode_rows", None)
        assert fast.decode_batch(batch).num_rows == len(generated.events)


def test_writer_schemas_and_columns_the_batch_path_leaves_to_the_row_decoder() -> None:
    good = {name: None for name, _ in ROW_FIELDS} | {"id": 1, "v": "x"}
    source = {"version": "3", "ts_ms": 1, "snapshot": None, "sequence": '["1","2"]', "lsn": 2}
    raw = encode(2, {"before": None, "after": good, "source": source, "op": "c", "ts_ms": None})
    batch = kafka_batch([(None, raw)])
    # A declared column whose Avro type this path does not convert (a float into numeric); no declared key and
    # a message key field that is not a declared column (every message is a dead letter).
    keyed = kafka_batch([(encode(1, {"id": 4}), raw)])
    for spec, messages in (
        (spec_of({**COLUMNS, "f": "numeric(10,2)"}), batch),
        (spec_of({"v": "text"}, key=None), keyed),
    ):
        _, took = both_paths(spec, messages)
        assert not took
    # A writer schema with an array; a string that is not UTF-8 (in a field nobody declared).
    with_array = envelope(False)
    with_array["fields"].append({"name": "tags", "type": {"type": "array", "items": "string"}, "default": []})
    REGISTRY.add(with_array, 21)
    array_raw = b"\0\0\0\0\x15" + fastavro_body(
        with_array, {"before": None, "after": good, "source": source, "op": "c", "tags": ["a"]}
    )
    not_utf8 = encode(2, {"before": None, "after": good, "source": dict(source, version="Q"), "op": "c"})
    not_utf8 = not_utf8.replace(b"\x02Q", b"\x02\xff", 1)
    for messages in ([(None, array_raw)], [(None, raw), (None, not_utf8)]):
        rows, took = both_paths(spec_of(COLUMNS), kafka_batch(messages))
        assert not took
    assert rows[1]["_dlq_reason"]


def fastavro_body(schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(strip_logical_types(schema)), record)
    return out.getvalue()


def test_messages_of_another_writer_schema_in_the_batch_are_decoded_alone() -> None:
    source = {"version": "3", "ts_ms": 1, "snapshot": None, "sequence": '["1","2"]', "lsn": 2}
    good = {name: None for name, _ in ROW_FIELDS} | {"v": "x"}
    messages = []
    for i in range(1, 30):
        record = {"before": None, "after": dict(good, id=i), "source": source, "op": "c", "ts_ms": None}
        messages.append((None, encode(3 if i % 7 == 0 else 2, record)))
    rows, took = both_paths(spec_of(COLUMNS), kafka_batch(messages))
    assert took and [row["id"] for row in rows] == list(range(1, 30))


def test_an_unknown_writer_schema_id_is_left_to_the_row_decoder() -> None:
    """Every message of an id the registry does not know is a dead letter, on both paths."""
    raw = b"\0\0\0\x03\xe7" + b"\x00" * 20
    rows, took = both_paths(spec_of(COLUMNS), kafka_batch([(None, raw)]))
    assert not took and "999" in rows[0]["_dlq_reason"]


def test_timestamps_beyond_python_still_agree() -> None:
    good = {name: None for name, _ in ROW_FIELDS} | {"id": 3, "v": "x", "z": "9999-12-31T23:59:59.999999Z"}
    source = {"version": "3", "ts_ms": 2**62, "snapshot": "true", "sequence": None, "lsn": 77}
    raw = encode(2, {"before": None, "after": good, "source": source, "op": "r", "ts_ms": None})
    rows, took = both_paths(spec_of(COLUMNS), kafka_batch([(None, raw)]))
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert took and rows[0]["z"] == (datetime(9999, 12, 31, 23, 59, 59, 999999, timezone.utc) - epoch) // timedelta(
        microseconds=1
    )


# ---- hostile encodings, field by field (tests/unit/test_decoder_differential.py does the same for JSON) ---------


def varint(value: int) -> bytes:
    """Avro's zigzag varint, minimal."""
    unsigned = (value << 1) ^ (value >> 63) if -(2**63) <= value < 2**63 else value
    out = bytearray()
    while True:
        byte = unsigned & 0x7F
        unsigned >>= 7
        if not unsigned:
            return bytes([*out, byte])
        out.append(byte | 0x80)


def overlong(value: int, size: int) -> bytes:
    """``value``'s varint padded with continuation bytes to ``size`` bytes (Avro readers accept it up to 10)."""
    minimal = bytearray(varint(value))
    while len(minimal) < size:
        minimal[-1] |= 0x80
        minimal.append(0)
    return bytes(minimal)


SENTINEL_TEXT = "\x01sentinel\x02"
SENTINEL_LONG = 0x3EADBEEF
SENTINEL_DOUBLE = 1.2345678901234567e-300
HOSTILE_STRINGS = [
    varint(len(b)) + b
    for b in (b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"a\x00b", "é".encode(), b"\xf4\x90\x80\x80", b"")
] + [overlong(1, 2) + b"a", varint(-1), varint(40) + b"ab", overlong(2, 11) + b"ab", b"\x80" * 10 + b"\x02"]
HOSTILE_LONGS = [overlong(5, 3), overlong(-1, 10), overlong(0, 11), b"\xff" * 9 + b"\x02", b"\xff" * 9 + b"\x01"]
HOSTILE_LONGS += [varint(v) for v in (0, -1, 2**63 - 1, -(2**63), 2**31, -(2**31) - 1, 2**15, 86_400_000_000)]
HOSTILE_DOUBLES = [
    struct.pack("<Q", bits)
    for bits in (0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x8000000000000000, 0x7FF0000000000000)
] + [struct.pack("<d", d) for d in (-math.inf, 5e-324, 1.7976931348623157e308)]
STRING_FIELDS = [
    ("after", "t"),
    ("after", "v"),
    ("after", "z"),
    ("source", "sequence"),
    ("source", "version"),
    ("", "op"),
]
STRING_FIELDS += [("source", "snapshot"), ("before", "t")]
LONG_FIELDS = [("after", "id"), ("after", "i"), ("after", "s"), ("after", "dt"), ("after", "ts"), ("after", "tn")]
LONG_FIELDS += [("source", "lsn"), ("source", "ts_ms"), ("", "ts_ms"), ("before", "id")]


def strict(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows compared to the bit, but for which NaN: a float as its bytes (so -0.0 is not 0.0)."""
    return [
        {
            name: ("nan" if math.isnan(v) else struct.pack("<d", v)) if isinstance(v, float) else v
            for name, v in row.items()
        }
        for row in rows
    ]


@st.composite
def hostile_message(draw: st.DrawFn) -> tuple[bytes | None, bytes | None]:
    """A message AvroConverter could not have written: one field of a good one encoded otherwise."""
    key, raw = draw(messages(0))
    if raw is None:
        return key, raw
    kind = draw(st.sampled_from(["string", "long", "double"]))
    record = fastavro.schemaless_reader(io.BytesIO(raw[5:]), PARSED[2], None)
    fields = {"string": STRING_FIELDS, "long": LONG_FIELDS, "double": [("after", "d"), ("before", "d")]}[kind]
    struct_name, field = draw(st.sampled_from(fields))
    where = record if not struct_name else record[struct_name]
    if where is None:
        where = record["after"] = {name: None for name, _ in ROW_FIELDS} | {"v": "x"}
        record["op"] = "c"
    sentinel: Any = {"string": SENTINEL_TEXT, "long": SENTINEL_LONG, "double": SENTINEL_DOUBLE}[kind]
    where[field] = sentinel
    raw = encode(2, record)
    encoded = {
        "string": varint(len(SENTINEL_TEXT)) + SENTINEL_TEXT.encode(),
        "long": varint(SENTINEL_LONG),
        "double": struct.pack("<d", SENTINEL_DOUBLE),
    }[kind]
    assume(raw.count(encoded) == 1)
    hostile = {"string": HOSTILE_STRINGS, "long": HOSTILE_LONGS, "double": HOSTILE_DOUBLES}[kind]
    return key, raw.replace(encoded, draw(st.sampled_from(hostile)))


@st.composite
def hostile_batches(draw: st.DrawFn, size: int) -> list[tuple[bytes | None, bytes | None]]:
    out = draw(st.lists(messages(0), min_size=1, max_size=size))
    for _ in range(draw(st.integers(1, 2))):
        out.insert(draw(st.integers(0, len(out))), draw(hostile_message()))
    return out


def assert_same_strictly(key: tuple[str, ...] | None, messages: list[tuple[bytes | None, bytes | None]]) -> bool:
    """Both paths give the same batch, floats to the bit; True if the batch path took the batch."""
    fast, slow = plans(spec_of(COLUMNS, key=key))
    batch = kafka_batch(messages)
    assert strict(comparable(fast.decode_batch(batch))) == strict(comparable(slow.decode_batch(batch)))
    return fast._decode_columnar(batch) is not None


KEYS = {"declared key": ("id",), "key from the message key": None}


@pytest.mark.parametrize(
    ("key", "examples", "size"),
    [(name, 15, 4) for name in KEYS] + [pytest.param(name, 1_500, 12, marks=pytest.mark.soak) for name in KEYS],
)
def test_a_field_encoded_otherwise_is_decided_as_the_row_decoder_decides(key: str, examples: int, size: int) -> None:
    """Strings that are not UTF-8 or run past the message, varints padded to 10 bytes or beyond 64 bits,
    NaNs, -0.0 and infinities: the batch path reads what the row decoder reads, or leaves it to it (15 batches
    per key in ``make test``, 1,500 in ``make soak``)."""

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(batch=hostile_batches(size))
    def check(batch: list[tuple[bytes | None, bytes | None]]) -> None:
        event(f"the batch path took the batch: {assert_same_strictly(KEYS[key], batch)}")

    check()
