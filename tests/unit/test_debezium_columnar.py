"""The batch path of JSON decoding (:mod:`cdcsync.sources.debezium.columnar`) against the row decoder: for any
batch, both give the same output, row for row, dead letters included; and the batch path does take the batches
Debezium writes."""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcsync.config.types import parse_pg_type
from cdcsync.devstack import workload
from cdcsync.sources.debezium.json import JsonPlan, wrapper_prefix
from cdcsync.sources.debezium.plan import RowPlan
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.debezium.wrappers import CUT_COLUMNS, MAX_WRAPPERS, restored_batch, with_wrappers
from cdcsync.sources.kafka import DecodeTask, KnownWrappers

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


@functools.lru_cache(maxsize=16)
def plans(spec: DecodeSpec) -> tuple[JsonPlan, JsonPlan]:
    return JsonPlan(spec), JsonPlan(spec, batch_path=False)


def both_paths(spec: DecodeSpec, batch: pa.RecordBatch) -> tuple[list[dict[str, Any]], bool]:
    """The row decoder's output, after checking that the batch path gives the same; and whether it took it."""
    fast, slow = plans(spec)
    took = fast._columnar is not None and fast._decode_columnar(batch) is not None
    return same_output(fast, slow, batch), took


def same_output(fast: RowPlan, slow: RowPlan, batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The rows ``slow`` decodes ``batch`` into, after checking that ``fast`` gives the same batch."""
    expected = slow.decode_batch(batch)
    got = fast.decode_batch(batch)
    assert got.schema == expected.schema
    assert comparable(got) == comparable(expected)
    return comparable(expected)


def comparable(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The rows, dates and timestamps as integers (a row may hold one outside Python's years)."""
    columns = [
        column.cast(pa.int64())
        if pa.types.is_timestamp(column.type)
        else column.cast(pa.int32())
        if pa.types.is_date32(column.type)
        else column
        for column in batch.columns
    ]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names).to_pylist()


def obj(items: Sequence[tuple[str, str]]) -> str:
    """A JSON object from (key, JSON text) pairs: numbers keep their exact text."""
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in items) + "}"


def b64(unscaled: int) -> str:
    size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return json.dumps(base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode())


def pick(
    level: int, good: st.SearchStrategy[str], alone: Sequence[str], batch: Sequence[str]
) -> st.SearchStrategy[str]:
    """Mostly ``good`` values; at level 1 now and then one the batch path leaves to the row decoder ``alone``,
    at level 2 also one that sends the whole batch there."""
    odd = list(alone) + (list(batch) if level == 2 else [])
    if not level or not odd:
        return good
    return st.integers(0, 12).flatmap(lambda n: st.sampled_from(odd) if n == 0 else good)


def ints(bits: int) -> st.SearchStrategy[str]:
    return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1).map(str)


BAD_INTS = ["32768", "-32769", "2147483648", "9223372036854775808", "1.0", "1e3", "true", '"5"', "-0", "1.5"]
TEXTS = st.one_of(
    st.text(max_size=8).map(lambda t: json.dumps(t, ensure_ascii=False)), st.text(max_size=4).map(json.dumps)
)
BAD_TEXTS = ["5", "true", '{"x":1}', '"\\ud800"']
NUMBERS = st.one_of(
    st.decimals(min_value=-(10**10), max_value=10**10, places=2, allow_nan=False).map(str),
    st.decimals(min_value=-(10**10), max_value=10**10, places=0, allow_nan=False).map(str),
    st.decimals(min_value=-(10**5), max_value=10**5, places=1, allow_nan=False).map(lambda d: json.dumps(str(d))),
    st.sampled_from(["1e2", "1E-2", "-0.00", "0", '"+.5"', '"1."', "123456789012.34"]),
)
BAD_NUMBERS = ["1.234", "1.230", "1e-400", "10000000000.00", '"NaN"', '" 1"', '"1e5"', "true", '"-"', '"Infinity"']
CONNECT_DECIMALS = st.integers(-(10**12) + 1, 10**12 - 1).map(b64)
ODD_CONNECT_DECIMALS = [b64(10**12), b64(-(10**12)), b64(2**70), '"@@"', '"AQ"', '""']
TIMESTAMPS = st.datetimes().map(lambda d: json.dumps(d.isoformat(timespec="microseconds") + "Z"))
ODD_TIMESTAMPS = ['"2024-01-01T00:00:00.1234567Z"', '"0000-01-01T00:00:00Z"', '"2024-01-01T00:00:00+02:00"', '"x"']
ODD_TIMESTAMPS += ['"2024-01-01 00:00:00Z"', '"infinity"', '"10000-01-01T00:00:00Z"', '"2024-01-01T24:00:00Z"']
BAD_TIMESTAMPS = ['"2024-02-30T00:00:00Z"', '"2023-02-29T10:00:00.5Z"', "1704067200000000"]
SEQUENCES = st.one_of(
    st.tuples(st.integers(1, 2**62 - 1), st.integers(1, 2**64 - 1)).map(lambda p: json.dumps(f'["{p[0]}","{p[1]}"]')),
    st.integers(1, 2**64 - 1).map(lambda lsn: json.dumps(f'[null,"{lsn}"]')),
)
ODD_SEQUENCES = ['"[\\"1\\",\\"2\\",\\"3\\"]"', '"[\\"\\u0661\\",\\"2\\"]"', '"x"', "null", '"[\\"\\",\\"2\\"]"']
ODD_SEQUENCES += ['"[\\"0\\",\\"2\\"]"', '"[\\"1\\",\\"0\\"]"', f'"[\\"{2**62}\\",\\"2\\"]"', '"[null,\\"0\\"]"']
BAD_SEQUENCES = ["7", f'"[\\"{2**64}\\",\\"2\\"]"']


@st.composite
def rows(draw: st.DrawFn, wrapped: bool, level: int) -> str:
    values = {
        "id": pick(level, st.integers(1, 50).map(str), ["null"], BAD_INTS),
        "i": pick(level, ints(32), [], BAD_INTS),
        "s": pick(level, ints(16), [], BAD_INTS),
        "t": pick(level, TEXTS, ['"a\\u0000b"'], BAD_TEXTS),
        "v": pick(level, TEXTS, [], BAD_TEXTS),
        "b": pick(level, st.sampled_from(["true", "false", "null"]), [], ["1", '"true"']),
        "n": pick(level, CONNECT_DECIMALS, ODD_CONNECT_DECIMALS, ["12"])
        if wrapped
        else pick(level, NUMBERS, [], BAD_NUMBERS),
        "z": pick(level, TIMESTAMPS, ODD_TIMESTAMPS, BAD_TIMESTAMPS),
    }
    names = draw(st.lists(st.sampled_from(list(values)[1:]), unique=True))
    if draw(st.integers(0, 6)):
        names = ["id", *names]
    return obj([(name, draw(values[name])) for name in names] + ([("extra", "[1,{}]")] if draw(st.booleans()) else []))


@st.composite
def messages(draw: st.DrawFn, wrapped: bool, level: int) -> tuple[bytes | None, bytes | None]:
    key = draw(st.one_of(st.integers(1, 50).map(lambda i: f'{{"id":{i}}}'.encode()), st.just(b"x"), st.none()))
    if draw(st.integers(0, 9)) == 0:
        return key, None  # a tombstone
    op = draw(pick(level, st.sampled_from(['"c"', '"u"', '"r"', '"d"']), [], ['"t"', '"x"', "null", "1"]))
    row = rows(wrapped, level)
    source: list[tuple[str, str]] = [("connector", '"postgresql"'), ("schema", '"public"')]
    if draw(st.integers(0, 5)):
        source.append(("sequence", draw(pick(level, SEQUENCES, ODD_SEQUENCES, BAD_SEQUENCES))))
    if draw(st.booleans()):
        source.append(("lsn", draw(pick(level, st.integers(1, 2**64 - 1).map(str), ["0"], ['"5"', "-1"]))))
    if draw(st.booleans()):
        snapshots = st.sampled_from(['"true"', '"false"', '"incremental"', '"last"', "null"])
        source.append(("snapshot", draw(pick(level, snapshots, [], ["true"]))))
    if draw(st.integers(0, 4)):
        millis = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**42)).map(str)
        source.append(("ts_ms", draw(pick(level, millis, [], ["1.5"]))))
    payload: list[tuple[str, str]] = [
        ("before", draw(st.one_of(st.just("null"), row))),
        ("after", draw(pick(level, row, ["null"], ['"x"']))),
        ("source", draw(pick(level, st.just(obj(source)), ["null"], [obj(source[:1])]))),
        ("op", op),
    ]
    if draw(st.booleans()):
        payload.append(("ts_ms", draw(st.sampled_from(["1700000000000", "-1", "null", "99999999999999999"]))))
    text = obj(payload)
    if wrapped:
        scale = draw(pick(level, st.just("2"), [], ["3"]))
        schema = {
            "type": "struct",
            "fields": [
                {"type": "struct", "fields": [dict(NUMERIC_FIELD, parameters={"scale": scale})], "field": f}
                for f in ("before", "after")
            ],
        }
        text = '{"schema":' + json.dumps(schema, separators=(",", ":")) + ',"payload":' + text + "}"
    if level == 2 and draw(st.integers(0, 30)) == 0:
        text = draw(st.sampled_from([text[:-1], text + " ", text + text, "", "{}", text.replace('"op"', '"op" ')]))
    return key, text.encode()


BATCHES = st.tuples(st.booleans(), st.sampled_from([0, 1, 1, 2])).flatmap(
    lambda shape: st.lists(messages(*shape), min_size=1, max_size=10)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(BATCHES)
def test_the_batch_path_decodes_any_batch_as_the_row_decoder_does(
    batch: list[tuple[bytes | None, bytes | None]],
) -> None:
    """40 batches per run (test_decoder_differential.py holds the same claim over hostile messages); ``make soak``
    runs 1,000."""
    both_paths(spec_of(COLUMNS), kafka_batch(batch))


@pytest.mark.soak
@settings(max_examples=1_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(BATCHES)
def test_the_batch_path_decodes_any_batch_as_the_row_decoder_does_soak(
    batch: list[tuple[bytes | None, bytes | None]],
) -> None:
    both_paths(spec_of(COLUMNS), kafka_batch(batch))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    for spec in (
        spec_of({**columns, "customer_id": "double precision"}),
        DecodeSpec("things", spec_of(columns).columns),
    ):
        _, took = both_paths(spec, batch)
        assert not took
    # A truncate in the batch.
    truncate = json.dumps({"op": "t", "source": {"schema": "public", "sequence": '["1","2"]'}}).encode()
    _, took = both_paths(spec_of(columns), kafka_batch([(e.key, e.value) for e in events] + [(None, truncate)]))
    assert not took


def test_deletes_of_key_changes_keep_their_key_move_rows_in_order() -> None:
    """A delete with Debezium's new-key header goes to the row decoder, which adds its key-move row after it."""
    events = workload.generate(300, 40, seed=11).events
    batch = workload.to_kafka_batch(events)
    new_keys = [
        f'{{"id":{1000 + i}}}'.encode() if e.op == "d" and i % 2 else (b"not a key" if e.op == "d" else None)
        for i, e in enumerate(events)
    ]
    batch = pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array(new_keys, pa.binary())], [*batch.schema.names, "new_key"]
    )
    rows, took = both_paths(spec_of(dict(workload.ORDERS_COLUMNS)), batch)
    assert took
    moves = [i for i, row in enumerate(rows) if row["_cdc_op"] not in ("c", "u", "d")]
    assert moves and all(rows[i - 1]["_cdc_op"] == "d" and rows[i]["id"] >= 1000 for i in moves)


# ---- schema wrappers cut off on the JVM (cdcsync.sources.debezium.wrappers) -----------------------------------

OTHER_WRAPPER = b'{"schema":{"type":"struct","fields":[]},"payload":'


def jvm_cut(batch: pa.RecordBatch, wrappers: tuple[bytes, ...]) -> pa.RecordBatch:
    """What :func:`cdcsync.sources.kafka.decoder_input` sends Python, by its rule: a message (or key) that starts
    with a wrapper and ends with ``}`` as its payload, the wrapper's index beside it."""
    for column, wrapper_column in CUT_COLUMNS:
        values, which = [], []
        for value in batch.column(batch.schema.names.index(column)).to_pylist():
            hit = next(
                (
                    i
                    for i, w in enumerate(wrappers)
                    if value is not None and value.startswith(w) and value.endswith(b"}")
                ),
                None,
            )
            which.append(hit)
            values.append(value if hit is None else value[len(wrappers[hit]) : -1])
        at = batch.schema.names.index(column)
        batch = batch.set_column(at, column, pa.array(values, pa.binary()))
        batch = batch.append_column(wrapper_column, pa.array(which, pa.int32()))
    return batch


KEY_WRAPPER = b'{"schema":{"type":"struct","fields":[{"type":"int64","optional":false,"field":"id"}]},"payload":'


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(BATCHES, st.data())
def test_messages_cut_on_the_jvm_decode_as_the_whole_messages_do(
    batch_messages: list[tuple[bytes | None, bytes | None]], data: st.DataObject
) -> None:
    """Whatever the batch (wrapped or not, one schema or several, malformed messages) and whichever wrappers are
    known, the cut batch decodes as the whole one on both paths, dead letters' original bytes included."""
    wrap = data.draw(st.lists(st.booleans(), min_size=len(batch_messages), max_size=len(batch_messages)))
    batch_messages = [
        (KEY_WRAPPER + key + b"}" if key is not None and wrapped else key, value)
        for (key, value), wrapped in zip(batch_messages, wrap, strict=True)
    ]
    batch = kafka_batch(batch_messages)
    learned = {wrapper_prefix(value) for pair in batch_messages for value in pair if value is not None}
    known = [*sorted(w for w in learned if w is not None), OTHER_WRAPPER]
    wrappers = tuple(data.draw(st.permutations(known)))[: data.draw(st.integers(1, MAX_WRAPPERS))]
    cut = with_wrappers(jvm_cut(batch, wrappers), wrappers)
    assert restored_batch(cut).equals(batch)
    fast, slow = plans(spec_of(COLUMNS))
    expected = comparable(slow.decode_batch(batch))
    assert comparable(fast.decode_batch(cut)) == expected
    assert comparable(slow.decode_batch(cut)) == expected


def test_a_batch_cut_with_one_wrapper_takes_the_batch_path_and_reports_no_wrapper() -> None:
    generated = workload.generate(2_000, 300, seed=7, wrapped=True)
    batch = workload.to_kafka_batch(generated.events)
    first = next(event for event in generated.events if event.value is not None)
    assert first.value is not None and first.key is not None
    wrapper, key_wrapper = wrapper_prefix(first.value), wrapper_prefix(first.key)
    assert wrapper is not None and key_wrapper is not None and len(wrapper) > 2_000
    wrappers = (key_wrapper, wrapper)
    cut = jvm_cut(batch, wrappers)
    assert cut.column("value").nbytes < batch.column("value").nbytes / 4
    assert cut.column("key").nbytes < batch.column("key").nbytes / 10
    met = Met()
    spec = spec_of(dict(workload.ORDERS_COLUMNS), detect=True)
    task = DecodeTask(spec, None, wrappers=wrappers, wrappers_met=met)
    fast, slow = plans(spec)
    assert fast._decode_columnar(with_wrappers(cut, wrappers)) is not None
    decoded = pa.Table.from_batches(list(task(iter([cut]))))
    expected = pa.Table.from_batches([slow.decode_batch(batch)]).select(decoded.schema.names)
    assert decoded.equals(expected)
    assert met.seen == set()  # every wrapped message and key was cut: nothing new to learn
    met_whole = Met()
    list(DecodeTask(spec, None, wrappers_met=met_whole)(iter([batch])))
    assert met_whole.seen == {wrapper, key_wrapper}


def test_tasks_report_the_wrapper_of_a_whole_wrapped_message_and_the_driver_keeps_the_newest() -> None:
    old = workload.generate(20, 10, seed=1, wrapped=True).events
    old_wrapper = wrapper_prefix(next(e.value for e in old if e.value is not None))
    assert old_wrapper is not None
    changed = [
        (e.key, e.value.replace(b'"name":"shop.public.orders.Value"', b'"name":"shop.public.orders.Value2"'))
        for e in old
        if e.value is not None
    ]
    new_wrapper = wrapper_prefix(changed[0][1])
    assert new_wrapper is not None and new_wrapper != old_wrapper
    batch = kafka_batch([(e.key, e.value) for e in old] + changed)
    key_wrapper = wrapper_prefix(changed[0][0] or b"")
    assert key_wrapper is not None
    wrappers = (old_wrapper, key_wrapper)
    met = Met()
    task = DecodeTask(spec_of(dict(workload.ORDERS_COLUMNS)), None, wrappers=wrappers, wrappers_met=met)
    rows = pa.Table.from_batches(list(task(iter([jvm_cut(batch, wrappers)]))))
    assert rows.num_rows == batch.num_rows
    assert met.seen == {new_wrapper}

    known = KnownWrappers((old_wrapper,))
    known.learn(met.seen | {old_wrapper})
    assert known.wrappers == (new_wrapper, old_wrapper)
    known.learn([bytes([i]) for i in range(MAX_WRAPPERS)])
    assert len(known.wrappers) == MAX_WRAPPERS and new_wrapper not in known.wrappers


class Met:
    """Stands in for the Spark accumulator the tasks add the wrappers they met to."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()

    def add(self, found: set[bytes]) -> None:
        self.seen |= found
