"""The batch path of JSON decoding (:mod:`cdcsync.sources.debezium.columnar`) against the row decoder: for any
batch, both give the same output, row for row, dead letters included; and the batch path does take the batches
Debezium writes."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcsync.config.types import parse_pg_type
from cdcsync.devstack import workload
from cdcsync.sources.debezium.json import JsonPlan
from cdcsync.sources.debezium.spec import DecodeSpec

pytestmark = pytest.mark.unit

COLUMNS = {
    "id": "bigint",
    "i": "integer",
    "s": "smallint",
    "t": "text",
    "v": "varchar",
    "b": "boolean",
    "n": "numeric(12,2)",
    "z": "timestamptz",
}
NUMERIC_FIELD = {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "field": "n"}


def spec_of(columns: dict[str, str], *, detect: bool = False) -> DecodeSpec:
    return DecodeSpec(
        "things",
        tuple((name, parse_pg_type(t)) for name, t in columns.items()),
        ("id",),
        detect_schema_changes=detect,
    )


def kafka_batch(messages: Sequence[tuple[bytes | None, bytes | None]]) -> pa.RecordBatch:
    n = len(messages)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([k for k, _ in messages], pa.binary()),
            pa.array([v for _, v in messages], pa.binary()),
            pa.array(["t"] * n, pa.string()),
            pa.array([i % 3 for i in range(n)], pa.int32()),
            pa.array(range(500, 500 + n), pa.int64()),
            pa.array([1_700_000_000_000_000 + i for i in range(n)], pa.timestamp("us", tz="UTC")),
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp"],
    )


def both_paths(spec: DecodeSpec, batch: pa.RecordBatch) -> tuple[list[dict[str, Any]], bool]:
    """The row decoder's output, after checking that the batch path gives the same; and whether it took it."""
    fast = JsonPlan(spec)
    slow = JsonPlan(spec, batch_path=False)
    expected = slow.decode_batch(batch)
    took = fast._columnar is not None and fast._decode_columnar(batch) is not None
    got = fast.decode_batch(batch)
    assert got.schema == expected.schema
    assert comparable(got) == comparable(expected)
    return comparable(expected), took


def comparable(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The rows, timestamps as integers (a row may hold one outside Python's years)."""
    columns = [
        column.cast(pa.int64()) if pa.types.is_timestamp(column.type) else column for column in batch.columns
    ]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names).to_pylist()


def obj(items: Sequence[tuple[str, str]]) -> str:
    """A JSON object from (key, JSON text) pairs: numbers keep their exact text."""
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in items) + "}"


def b64(unscaled: int) -> str:
    size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return json.dumps(base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode())


INTS = st.one_of(
    st.sampled_from(
        ["0", "-0", "32767", "32768", "-32769", "2147483648", "9223372036854775807", "9223372036854775808"]
        + ["1.0", "1e3", "true", "null", '"5"', "1.5", "-9223372036854775809"]
    ),
    st.integers(-(2**64), 2**64).map(str),
)
TEXTS = st.one_of(
    st.text(max_size=8).map(lambda t: json.dumps(t, ensure_ascii=False)),
    st.text(max_size=4).map(json.dumps),
    st.sampled_from(['"a\\u0000b"', "5", "true", "null", '{"x":1}', '"\\ud800"', '"\\"q\\" \\\\ \\n"', '""']),
)
BOOLS = st.sampled_from(["true", "false", "null", "1", '"true"'])
NUMBERS = st.one_of(
    st.sampled_from(
        ["1.5", "1.234", "1.230", "123456789012.34", "9999999999.99", "10000000000.00", "1e2", "1E-2", "-0.00"]
        + ["1e-400", '"1.5"', '"NaN"', '" 1"', '"+.5"', '"1."', '"1e5"', "null", "true", '"-"', '"Infinity"']
    ),
    st.decimals(min_value=-(10**11), max_value=10**11, places=2, allow_nan=False).map(str),
    st.decimals(min_value=-(10**11), max_value=10**11, places=3, allow_nan=False).map(str),
)
CONNECT_DECIMALS = st.one_of(
    st.integers(-(10**13), 10**13).map(b64),
    st.integers(-(2**70), 2**70).map(b64),
    st.sampled_from(['"@@"', '"AA=="', '""', "null", "12", '"AQ"']),
)
TIMESTAMPS = st.one_of(
    st.sampled_from(
        ['"2024-01-01T00:00:00Z"', '"2024-01-01T00:00:00.123456Z"', '"2024-01-01T00:00:00.1234567Z"']
        + ['"2024-02-30T00:00:00Z"', '"0000-01-01T00:00:00Z"', '"0001-01-01T00:00:00Z"', '"2024-01-01T24:00:00Z"']
        + ['"9999-12-31T23:59:59.999999Z"', '"10000-01-01T00:00:00Z"', '"2024-01-01T00:00:00+02:00"', '"x"']
        + ['"2024-01-01 00:00:00Z"', '"infinity"', "1704067200000000", "null", '"2023-02-29T10:00:00.5Z"']
    ),
    st.datetimes().map(lambda d: json.dumps(d.isoformat(timespec="microseconds") + "Z")),
)
SEQUENCES = st.one_of(
    st.tuples(st.integers(0, 2**64), st.integers(0, 2**64)).map(lambda p: json.dumps(json.dumps([str(p[0]), str(p[1])]))),
    st.tuples(st.integers(1, 2**40), st.integers(1, 2**40)).map(lambda p: json.dumps(f'["{p[0]}","{p[1]}"]')),
    st.integers(0, 2**64).map(lambda lsn: json.dumps(f'[null,"{lsn}"]')),
    st.sampled_from(['"[\\"1\\",\\"2\\",\\"3\\"]"', '"[\\"\\u0661\\",\\"2\\"]"', "7", '"x"', "null", '"[\\"\\",\\"2\\"]"']),
)


@st.composite
def rows(draw: st.DrawFn, wrapped: bool) -> str:
    values = {
        "id": st.one_of(st.integers(1, 50).map(str), INTS),
        "i": INTS,
        "s": INTS,
        "t": TEXTS,
        "v": TEXTS,
        "b": BOOLS,
        "n": CONNECT_DECIMALS if wrapped else NUMBERS,
        "z": TIMESTAMPS,
    }
    names = draw(st.lists(st.sampled_from(list(values)), unique=True))
    names = (["id"] if draw(st.booleans()) and "id" not in names else []) + names
    return obj([(name, draw(values[name])) for name in names] + ([("extra", "[1,{}]")] if draw(st.booleans()) else []))


@st.composite
def messages(draw: st.DrawFn, wrapped: bool) -> tuple[bytes | None, bytes | None]:
    key = draw(st.one_of(st.integers(1, 50).map(lambda i: f'{{"id":{i}}}'.encode()), st.just(b"x"), st.none()))
    if draw(st.integers(0, 9)) == 0:
        return key, None  # a tombstone
    common = st.sampled_from(['"c"', '"u"', '"r"', '"d"'])
    op = draw(st.one_of(common, common, common, st.sampled_from(['"t"', '"x"', "null", "1"])))
    row = rows(wrapped)
    source: list[tuple[str, str]] = [("connector", '"postgresql"'), ("schema", '"public"')]
    if draw(st.integers(0, 20)) == 0:
        source = [("connector", '"postgresql"')]
    if draw(st.integers(0, 5)):
        source.append(("sequence", draw(SEQUENCES)))
    if draw(st.booleans()):
        source.append(("lsn", draw(st.one_of(st.integers(-1, 2**64).map(str), st.just('"5"')))))
    if draw(st.booleans()):
        source.append(("snapshot", draw(st.sampled_from(['"true"', '"false"', '"incremental"', '"last"', "null"]))))
    if draw(st.integers(0, 4)):
        source.append(("ts_ms", draw(st.one_of(st.integers(-(2**63), 2**63 - 1).map(str), st.just("1.5")))))
    payload: list[tuple[str, str]] = [
        ("before", draw(st.one_of(st.just("null"), row))),
        ("after", draw(st.one_of(row, row, st.just("null"), st.just('"x"')))),
        ("source", draw(st.one_of(st.just(obj(source)), st.just(obj(source)), st.just("null")))),
        ("op", op),
    ]
    if draw(st.booleans()):
        payload.append(("ts_ms", draw(st.sampled_from(["1700000000000", "-1", "null", "99999999999999999"]))))
    text = obj(payload)
    if wrapped:
        scale = draw(st.sampled_from(["2", "2", "3"]))
        schema = {
            "type": "struct",
            "fields": [
                {"type": "struct", "fields": [dict(NUMERIC_FIELD, parameters={"scale": scale})], "field": f}
                for f in ("before", "after")
            ],
        }
        text = '{"schema":' + json.dumps(schema, separators=(",", ":")) + ',"payload":' + text + "}"
    if draw(st.integers(0, 30)) == 0:
        text = draw(st.sampled_from([text[:-1], text + " ", text + text, "", "{}", text.replace('"op"', '"op" ')]))
    return key, text.encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.booleans().flatmap(lambda wrapped: st.lists(messages(wrapped), min_size=1, max_size=12)))
def test_the_batch_path_decodes_any_batch_as_the_row_decoder_does(batch: list[tuple[bytes | None, bytes | None]]) -> None:
    both_paths(spec_of(COLUMNS), kafka_batch(batch))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 30), st.sampled_from(list(COLUMNS)[1:]), st.integers(0, 50)), max_size=6))
def test_one_odd_value_among_good_messages_is_decoded_alone(odd: list[tuple[int, str, int]]) -> None:
    """The batch path keeps the batch and hands only the odd messages to the row decoder."""
    events = workload.generate(40, 10, seed=len(odd)).events
    columns = dict(workload.ORDERS_COLUMNS)
    batch_messages = [(e.key, e.value) for e in events]
    oddities = ['"a\\u0000b"', '"2024-01-01T00:00:00+01:00"', "null", '"[\\"9\\",\\"0\\"]"', '"x\\ny"']
    for at, _, which in odd:
        key, value = batch_messages[at]
        if value is None:
            continue
        payload = json.loads(value)
        if payload["op"] == "d":
            continue
        kind = oddities[which % len(oddities)]
        if kind == "null":
            payload["after"]["id"] = None  # the key from the message key
        elif "[" in kind:
            payload["source"]["sequence"] = json.loads(kind)
        elif "T" in kind:
            payload["after"]["updated_at"] = json.loads(kind)
        else:
            payload["after"]["status"] = json.loads(kind)
        batch_messages[at] = (key, json.dumps(payload).encode())
    _, took = both_paths(spec_of(columns), kafka_batch(batch_messages))
    assert took


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("detect", [False, True])
def test_debezium_batches_take_the_batch_path(wrapped: bool, detect: bool) -> None:
    generated = workload.generate(2_000, 300, seed=7, wrapped=wrapped)
    batch = workload.to_kafka_batch(generated.events)
    rows, took = both_paths(spec_of(dict(workload.ORDERS_COLUMNS), detect=detect), batch)
    assert took
    assert len(rows) == len(generated.events)
    assert not any(row["_dlq_reason"] for row in rows)
    assert {row["_cdc_op"] for row in rows} == {"c", "u", "d"}


def test_specs_and_shapes_the_batch_path_leaves_to_the_row_decoder() -> None:
    events = workload.generate(50, 10, seed=3).events
    batch = workload.to_kafka_batch(events)
    columns = dict(workload.ORDERS_COLUMNS)
    # A column type it has no reader for, and no declared key: the row decoder's, with the same result.
    for spec in (spec_of({**columns, "customer_id": "double precision"}), DecodeSpec("things", spec_of(columns).columns)):
        _, took = both_paths(spec, batch)
        assert not took
    # A truncate in the batch.
    truncate = json.dumps({"op": "t", "source": {"schema": "public", "sequence": '["1","2"]'}}).encode()
    _, took = both_paths(spec_of(columns), kafka_batch([(e.key, e.value) for e in events] + [(None, truncate)]))
    assert not took
