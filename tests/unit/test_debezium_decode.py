"""Debezium JsonConverter decoding: Kafka-shaped Arrow batches in, typed change rows and dead letters out."""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Sequence
from datetime import date, datetime, timezone
from decimal import Decimal
from functools import partial
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcsync.config.pipeline import KafkaSource
from cdcsync.config.types import parse_pg_type
from cdcsync.core.errors import DecodeError
from cdcsync.devstack import workload
from cdcsync.sources.debezium.dispatch import decode_batches, output_spark_schema
from cdcsync.sources.debezium.json import JsonPlan
from cdcsync.sources.debezium.plan import compile_payload_decoder
from cdcsync.sources.debezium.spec import DecodeSpec, output_arrow_schema

pytestmark = pytest.mark.unit

TOPIC = "shop.public.things"
KAFKA_TS_MS = 1_700_000_000_000
UTC = timezone.utc


# ---- helpers -----------------------------------------------------------------------------------------------------


def make_spec(columns: dict[str, str], primary_key: tuple[str, ...] | None = ("id",)) -> DecodeSpec:
    return DecodeSpec("things", tuple((name, parse_pg_type(t)) for name, t in columns.items()), primary_key)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def kafka_batch(
    messages: Sequence[tuple[bytes | None, bytes | None]],
    *,
    partition: int = 3,
    first_offset: int = 100,
    with_headers: bool = False,
) -> pa.RecordBatch:
    n = len(messages)
    arrays = [
        pa.array([k for k, _ in messages], type=pa.binary()),
        pa.array([v for _, v in messages], type=pa.binary()),
        pa.array([TOPIC] * n, type=pa.string()),
        pa.array([partition] * n, type=pa.int32()),
        pa.array(range(first_offset, first_offset + n), type=pa.int64()),
        pa.array([(KAFKA_TS_MS + i) * 1000 for i in range(n)], type=pa.timestamp("us", tz="UTC")),
        pa.array([0] * n, type=pa.int32()),
    ]
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    if with_headers:
        header = pa.struct([("key", pa.string()), ("value", pa.binary())])
        arrays.append(pa.array([[{"key": "h", "value": b"v"}]] * n, type=pa.list_(header)))
        names.append("headers")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def decode(spec: DecodeSpec, messages: Sequence[tuple[bytes | None, bytes | None]], **batch_options: Any) -> list[dict]:
    out = list(decode_batches(iter([kafka_batch(messages, **batch_options)]), spec))
    for batch in out:
        assert batch.schema == output_arrow_schema(spec)
    return [row for batch in out for row in batch.to_pylist()]


def change(
    op: str,
    after: Any = None,
    before: Any = None,
    *,
    lsn: int | None = 1000,
    ts_ms: int | None = 1_704_067_200_000,
    envelope_ts_ms: int | None = 1_704_067_200_500,
    sequence: str | None = None,
    snapshot: str | None = None,
) -> dict:
    source: dict[str, Any] = {"connector": "postgresql", "db": "shop", "schema": "public", "table": "things"}
    if lsn is not None:
        source["lsn"] = lsn
    if sequence is not None:
        source["sequence"] = sequence
    if snapshot is not None:
        source["snapshot"] = snapshot
    if ts_ms is not None:
        source["ts_ms"] = ts_ms
    payload: dict[str, Any] = {"before": before, "after": after, "source": source, "op": op}
    if envelope_ts_ms is not None:
        payload["ts_ms"] = envelope_ts_ms
    return payload


def field(name: str, kind: str, logical: str | None = None, **parameters: str) -> dict:
    schema: dict[str, Any] = {"type": kind, "optional": True, "field": name}
    if logical:
        schema["name"] = logical
    if parameters:
        schema["parameters"] = parameters
    return schema


def wrapped(payload: dict, row_fields: list[dict]) -> bytes:
    """A ``schemas.enable=true`` message whose before/after structs have ``row_fields``."""
    schema = {
        "type": "struct",
        "name": "shop.public.things.Envelope",
        "fields": [
            {"type": "struct", "fields": row_fields, "optional": True, "field": "before"},
            {"type": "struct", "fields": row_fields, "optional": True, "field": "after"},
            {"type": "struct", "fields": [{"type": "int64", "field": "lsn"}], "field": "source"},
            {"type": "string", "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }
    return dumps({"schema": schema, "payload": payload})


def key(value: int) -> bytes:
    return dumps({"id": value})


def only(rows: list[dict]) -> dict:
    assert len(rows) == 1, rows
    return rows[0]


def business(row: dict, spec: DecodeSpec) -> dict:
    return {name: row[name] for name, _ in spec.columns}


def assert_dead_letter(row: dict, spec: DecodeSpec, raw_key: bytes | None, raw_value: bytes, *fragments: str) -> None:
    reason = row["_dlq_reason"]
    assert reason, row
    for fragment in fragments:
        assert fragment in reason, (fragment, reason)
    assert row["_dlq_key"] == raw_key and row["_dlq_value"] == raw_value
    assert all(row[name] is None for name, _ in spec.columns)
    assert row["_cdc_op"] is None and row["_cdc_version"] is None and row["_cdc_ts"] is None
    assert row["_cdc_topic"] == TOPIC and row["_cdc_partition"] == 3 and isinstance(row["_cdc_offset"], int)


BASIC = make_spec({"id": "bigint", "name": "text", "qty": "integer"})


# ---- schema ------------------------------------------------------------------------------------------------------


def test_output_schema_ddl_quotes_names_and_matches_arrow() -> None:
    spec = make_spec(
        {
            "id": "bigint",
            "Order Total": "numeric(12,2)",
            'we"ird`name': "text",
            "small": "int2",
            "i": "int",
            "r": "real",
            "d": "float8",
            "free": "numeric",
            "huge": "numeric(50,3)",
            "b": "bool",
            "day": "date",
            "at": "timestamp",
            "attz": "timestamptz",
            "t": "time",
            "u": "uuid",
            "j": "jsonb",
            "raw": "bytea",
            "v": "varchar(10)",
            "iv": "interval",
        },
    )
    ddl = output_spark_schema(spec)
    assert ddl.startswith('`id` bigint, `Order Total` decimal(12,2), `we"ird``name` string, `small` smallint, ')
    assert ddl.endswith(
        "`_cdc_op` string, `_cdc_version` decimal(38,0), `_cdc_ts` timestamp, `_cdc_topic` string, `_cdc_partition` int, "
        "`_cdc_offset` bigint, `_dlq_reason` string, `_dlq_report` string, `_dlq_key` binary, `_dlq_value` binary"
    )
    schema = output_arrow_schema(spec)
    expected = {
        "id": pa.int64(),
        "Order Total": pa.decimal128(12, 2),
        'we"ird`name': pa.string(),
        "small": pa.int16(),
        "i": pa.int32(),
        "r": pa.float32(),
        "d": pa.float64(),
        "free": pa.string(),
        "huge": pa.string(),
        "b": pa.bool_(),
        "day": pa.date32(),
        "at": pa.timestamp("us"),
        "attz": pa.timestamp("us", tz="UTC"),
        "t": pa.string(),
        "u": pa.string(),
        "j": pa.string(),
        "raw": pa.binary(),
        "v": pa.string(),
        "iv": pa.string(),
        "_cdc_op": pa.string(),
        "_cdc_version": pa.decimal128(38, 0),
        "_cdc_ts": pa.timestamp("us", tz="UTC"),
        "_cdc_topic": pa.string(),
        "_cdc_partition": pa.int32(),
        "_cdc_offset": pa.int64(),
        "_dlq_reason": pa.string(),
        "_dlq_report": pa.string(),
        "_dlq_key": pa.binary(),
        "_dlq_value": pa.binary(),
    }
    assert [(f.name, f.type) for f in schema] == list(expected.items())
    assert all(f.nullable for f in schema)


def test_bad_specs_fail_on_the_driver() -> None:
    with pytest.raises(DecodeError, match="primary key column 'nope' is not declared"):
        output_spark_schema(make_spec({"id": "bigint"}, ("nope",)))
    with pytest.raises(DecodeError, match="a column is declared twice"):
        output_spark_schema(DecodeSpec("s", (("a", parse_pg_type("int")), ("a", parse_pg_type("text")))))


def test_spec_from_source_and_pickles() -> None:
    source = KafkaSource.model_validate(
        {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint", "amount": "numeric(12,2)"}}
    )
    spec = DecodeSpec.from_source("orders", source)
    assert spec == DecodeSpec(
        "orders",
        (("id", parse_pg_type("bigint")), ("amount", parse_pg_type("numeric(12,2)"))),
        ("id",),
        detect_schema_changes=True,
    )
    keyless = KafkaSource.model_validate({"type": "kafka", "topic": "t", "columns": {"id": "bigint"}})
    assert DecodeSpec.from_source("orders", keyless).primary_key is None
    function = pickle.loads(pickle.dumps(partial(decode_batches, spec=spec)))
    rows = [
        r
        for b in function(iter([kafka_batch([(key(1), dumps(change("c", {"id": 1, "amount": 2.5})))])]))
        for r in b.to_pylist()
    ]
    assert rows[0]["amount"] == Decimal("2.50")


# ---- ops and shapes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["c", "u", "r"])
def test_create_update_read_take_after(op: str) -> None:
    payload = change(op, after={"id": 7, "name": "new", "qty": 3}, before={"id": 7, "name": "old", "qty": 1})
    row = only(decode(BASIC, [(key(7), dumps(payload))]))
    assert business(row, BASIC) == {"id": 7, "name": "new", "qty": 3}
    assert row["_cdc_op"] == op and row["_dlq_reason"] is None
    assert row["_dlq_key"] is None and row["_dlq_value"] is None
    assert (row["_cdc_topic"], row["_cdc_partition"], row["_cdc_offset"]) == (TOPIC, 3, 100)


def versions(*payloads: dict) -> list[int]:
    rows = decode(BASIC, [(key(7), dumps(payload)) for payload in payloads])
    assert all(row["_dlq_reason"] is None for row in rows), rows
    return [int(row["_cdc_version"]) for row in rows]


def test_version_follows_commit_order_across_interleaved_transactions() -> None:
    """A DEFERRABLE key: T1 (began first, LSNs 100..) re-inserts key 7 and commits after T2, which deleted it at a
    higher LSN. Debezium streams T2 then T1; T1's changes carry T2's commit end as their last commit."""
    t2_delete = change("d", before={"id": 7}, lsn=300, sequence='["250","300"]')  # T0 committed at 250
    t1_insert = change("c", after={"id": 7, "name": "back"}, lsn=100, sequence='["340","100"]')  # T2 ended at 340
    t1_update = change("u", after={"id": 7, "name": "later"}, lsn=120, sequence='["340","120"]')
    next_tx = change("u", after={"id": 7, "name": "next"}, lsn=110, sequence='["400","110"]')
    delete, insert, update, after_that = versions(t2_delete, t1_insert, t1_update, next_tx)
    assert delete < insert < update < after_that  # the change's own LSN (300 > 100) would rank the delete first
    assert insert == (340 << 64) + 100


def test_commit_order_reads_the_same_with_and_without_schemas() -> None:
    fields = [field("id", "int64"), field("name", "string")]
    late = change("c", after={"id": 7, "name": "x"}, lsn=100, sequence='["340","100"]')
    early = change("d", before={"id": 7, "name": "x"}, lsn=300, sequence='["250","300"]')
    plain = versions(early, late)
    with_schemas = decode(BASIC, [(key(7), wrapped(early, fields)), (key(7), wrapped(late, fields))])
    assert [int(row["_cdc_version"]) for row in with_schemas] == plain and plain[0] < plain[1]


def test_snapshot_reads_rank_below_the_streamed_changes_after_them() -> None:
    """An initial snapshot with fresh offsets stamps ``[null, S]``; the first transaction after it carries no last
    commit and may have begun before S (a lower LSN); the next one carries the first one's commit end."""
    snapshot = change("r", after={"id": 7}, lsn=5000, sequence='[null,"5000"]', snapshot="last")
    older_snapshot = change("r", after={"id": 7}, lsn=4000, sequence='[null,"4000"]', snapshot="true")
    first_tx = change("u", after={"id": 7}, lsn=4990, sequence='[null,"4990"]')
    second_tx = change("d", before={"id": 7}, lsn=4995, sequence='["5100","4995"]')
    read, older, first, second = versions(snapshot, older_snapshot, first_tx, second_tx)
    assert older < read < first < second
    # A snapshot that knows the last commit (blocking, recovery) ranks at that commit: above every older
    # transaction (so it repairs), below every change of the transactions after it.
    blocking = change("r", after={"id": 7}, lsn=9000, sequence='["8000","9000"]', snapshot="true")
    before_it = change("u", after={"id": 7}, lsn=7990, sequence='["7900","7990"]')
    after_it = change("u", after={"id": 7}, lsn=7995, sequence='["8000","7995"]')
    stale, repair, newer = versions(before_it, blocking, after_it)
    assert second < stale < repair < newer
    # An incremental snapshot read is exact at its close-window position: it ranks like a streamed change.
    incremental = change("r", after={"id": 7}, lsn=9100, sequence='["9050","9100"]', snapshot="incremental")
    truncate = change("t", lsn=9010, sequence='["9000","9010"]')
    (watermark,) = versions(truncate)
    (chunk,) = versions(incremental)
    assert newer < watermark < chunk


def test_version_falls_back_to_source_lsn_then_the_kafka_offset() -> None:
    plain = change("u", after={"id": 7}, lsn=5000)  # no sequence: the LSN stands in for the commit position
    read = change("r", after={"id": 7}, lsn=6000)
    assert versions(plain, read) == [(5000 << 64) + 5000, 6000]
    no_lsn = only(decode(BASIC, [(key(7), dumps(change("r", after={"id": 7}, lsn=None)))]))
    streamed = only(decode(BASIC, [(key(7), dumps(change("u", after={"id": 7}, lsn=None)))]))
    assert (no_lsn["_cdc_version"], streamed["_cdc_version"]) == (100, (1 << 64) + 100)  # reads below changes


def test_a_position_that_does_not_fit_the_version_is_a_clear_reason() -> None:
    too_big = change("u", after={"id": 7}, lsn=5, sequence=f'["{2**62}","5"]')
    negative = change("u", after={"id": 7}, lsn=-5)
    rows = decode(BASIC, [(key(7), dumps(too_big)), (key(7), dumps(negative))])
    assert all("does not fit _cdc_version" in row["_dlq_reason"] for row in rows), rows


def test_delete_takes_before_even_when_it_holds_only_the_key() -> None:
    full = change("d", before={"id": 7, "name": "old", "qty": 1})
    key_only = change("d", before={"id": 8, "name": None, "qty": None})
    rows = decode(BASIC, [(key(7), dumps(full)), (key(8), dumps(key_only))])
    assert [business(r, BASIC) for r in rows] == [
        {"id": 7, "name": "old", "qty": 1},
        {"id": 8, "name": None, "qty": None},
    ]
    assert {r["_cdc_op"] for r in rows} == {"d"}


@pytest.mark.parametrize("primary_key", [("id",), None])
@pytest.mark.parametrize("wrapped_key", [False, True])
def test_delete_without_before_takes_the_key_from_the_message_key(primary_key: Any, wrapped_key: bool) -> None:
    spec = make_spec({"id": "bigint", "name": "text"}, primary_key)
    raw_key = key(9)
    if wrapped_key:
        key_schema = {"type": "struct", "fields": [{"type": "int64", "optional": False, "field": "id"}]}
        raw_key = dumps({"schema": key_schema, "payload": {"id": 9}})
    row = only(decode(spec, [(raw_key, dumps(change("d", before=None)))]))
    assert business(row, spec) == {"id": 9, "name": None}
    assert row["_cdc_op"] == "d" and row["_dlq_reason"] is None


def test_both_json_shapes_decode_to_the_same_row() -> None:
    fields = [field("id", "int64"), field("name", "string"), field("qty", "int32")]
    payload = change("u", after={"id": 1, "name": "x", "qty": 2})
    plain, wrap = decode(BASIC, [(key(1), dumps(payload)), (key(1), wrapped(payload, fields))])
    assert {k: v for k, v in plain.items() if k != "_cdc_offset"} == {
        k: v for k, v in wrap.items() if k != "_cdc_offset"
    }


def test_a_tombstone_is_a_delete_of_its_key_without_a_version() -> None:
    """Log compaction may have removed the delete event before it and kept the tombstone: it must delete."""
    payload = dumps(change("c", after={"id": 1, "name": "a", "qty": 1}))
    rows = decode(BASIC, [(key(1), None), (key(1), payload), (key(2), None), (None, None)])
    assert [(r["id"], r["name"], r["_cdc_op"], r["_cdc_version"], r["_cdc_offset"]) for r in rows] == [
        (1, None, "d", None, 100),
        (1, "a", "c", (1000 << 64) + 1000, 101),  # no sequence: (LSN, LSN)
        (2, None, "d", None, 102),
    ]  # a tombstone without a key deletes nothing: no row
    # A key that does not give the primary key: skipped (no dead letter, which would stop a run under fail).
    assert decode(BASIC, [(b"not json", None), (dumps({"other": 1}), None)]) == []


def test_the_delete_of_a_key_change_names_the_new_key_in_a_key_move_row() -> None:
    """Debezium's ``__debezium.newkey`` header (picked out by Spark into the ``new_key`` column): the delete of the
    old key is followed by a key-move row, the new key at the delete's version (cdcsync.sinks.key_moves)."""
    delete = dumps(change("d", before={"id": 1, "name": None, "qty": None}))
    create = dumps(change("c", after={"id": 5, "name": "a", "qty": 1}))
    batch = kafka_batch([(key(1), delete), (key(1), None), (key(5), create), (key(2), delete)])
    new_keys = pa.array([key(5), None, None, b"not a key"], pa.binary())
    batch = pa.RecordBatch.from_arrays([*batch.columns, new_keys], names=[*batch.schema.names, "new_key"])
    rows = [row for out in decode_batches(iter([batch]), BASIC) for row in out.to_pylist()]
    version = (1000 << 64) + 1000
    assert [(r["id"], r["name"], r["_cdc_op"], r["_cdc_version"], r["_cdc_offset"]) for r in rows] == [
        (1, None, "d", version, 100),
        (5, None, "n", version, 100),
        (1, None, "d", None, 101),
        (5, "a", "c", version, 102),
        (1, None, "d", version, 103),  # a header whose key does not decode: no key-move row, no dead letter
    ]


def test_headers_column_and_empty_batches_are_fine() -> None:
    payload = dumps(change("c", after={"id": 1, "name": "a", "qty": 1}))
    assert only(decode(BASIC, [(key(1), payload)], with_headers=True))["id"] == 1
    empty = kafka_batch([])
    assert [b.num_rows for b in decode_batches(iter([empty, kafka_batch([(key(1), payload)])]), BASIC)] == [1]


def test_a_truncate_is_a_row_without_values_or_key() -> None:
    """Debezium's truncate event has no row and no message key; the sinks apply it by its version."""
    (row,) = decode(BASIC, [(None, dumps(change("t", lsn=5000)))])
    assert business(row, BASIC) == {"id": None, "name": None, "qty": None}
    assert (row["_cdc_op"], row["_cdc_version"], row["_dlq_reason"]) == ("t", (5000 << 64) + 5000, None)


def test_the_toast_placeholder_of_a_json_column_is_valid_json() -> None:
    """Debezium's placeholder for an unchanged TOASTed value must reach the merge, which keeps the stored value."""
    spec = make_spec({"id": "bigint", "doc": "jsonb", "body": "text"})
    placeholder = "__debezium_unavailable_value"
    (row,) = decode(spec, [(key(1), dumps(change("u", after={"id": 1, "doc": placeholder, "body": placeholder})))])
    assert (row["doc"], row["body"]) == (f'"{placeholder}"', placeholder)


def test_hstore_in_map_and_json_modes_and_their_toast_placeholders() -> None:
    """Debezium's hstore.handling.mode=map sends a JSON object, json (its default) that object as JSON text; both
    become the Postgres text form, the unchanged-TOAST placeholder ``{p: p}`` included (cdcsync.config.toast)."""
    from cdcsync.config.toast import PLACEHOLDER_BY_KIND

    spec = make_spec({"id": "bigint", "attrs": "hstore"})
    placeholder = "__debezium_unavailable_value"
    values = [
        {"a": "1", 'quote"d': "back\\slash", "n": None},
        json.dumps({"a": "1", 'quote"d': "back\\slash", "n": None}),
        {placeholder: placeholder},
        json.dumps({placeholder: placeholder}),
        None,
        {},
    ]
    rows = decode(spec, [(key(i), dumps(change("u", after={"id": i, "attrs": v}))) for i, v in enumerate(values)])
    texts = [row["attrs"] for row in rows]
    expected = '"a"=>"1", "quote\\"d"=>"back\\\\slash", "n"=>NULL'
    assert texts == [expected, expected, PLACEHOLDER_BY_KIND["hstore"], PLACEHOLDER_BY_KIND["hstore"], None, ""]
    (bad,) = decode(spec, [(key(9), dumps(change("u", after={"id": 9, "attrs": {"a": 1}})))])
    assert "expected an object of strings" in bad["_dlq_reason"]


def test_a_missing_field_is_null() -> None:
    row = only(decode(BASIC, [(key(1), dumps(change("c", after={"id": 1})))]))
    assert business(row, BASIC) == {"id": 1, "name": None, "qty": None}


# ---- garbage -----------------------------------------------------------------------------------------------------

GARBAGE = [
    (b"\xff\xfe\x00garbage", "not valid UTF-8"),
    (b"not json at all {", "not JSON"),
    (b"", "not JSON"),
    (b"[1, 2, 3]", "an array"),
    (b'"just a string"', "a string"),
    (b"42", "a number"),
    (b"null", "null"),
    (dumps({"before": None, "after": {"id": 1}}), "no 'op' field"),
    (dumps({"schema": {"type": "struct"}, "payload": None}), "'payload' is null"),
    (dumps({"schema": {"type": "struct"}}), "no 'payload'"),
    (dumps({"schema": None, "payload": [1]}), "'payload' is an array"),
    (dumps(change("x", after={"id": 1})), "unsupported op 'x'"),
    (dumps({"op": 5, "after": {"id": 1}}), "unsupported op 5"),
    (dumps(change("c", after=None)), "op 'c' has no 'after' row"),
    (dumps(change("u", after=[1, 2])), "'after' is an array"),
    (b"[" * 5000 + b"]" * 5000, "value"),
]


@pytest.mark.parametrize(("raw", "fragment"), GARBAGE, ids=[g[1] + f"-{i}" for i, g in enumerate(GARBAGE)])
def test_garbage_becomes_a_dead_letter_with_the_raw_bytes(raw: bytes, fragment: str) -> None:
    row = only(decode(BASIC, [(b"\x00raw key", raw)]))
    assert_dead_letter(row, BASIC, b"\x00raw key", raw, fragment)
    assert len(row["_dlq_reason"]) < 300


def test_dead_letters_and_good_rows_mix_in_one_batch() -> None:
    good = dumps(change("c", after={"id": 1, "name": "a", "qty": 1}))
    rows = decode(BASIC, [(key(1), good), (None, b"nope"), (None, None), (key(3), good)])
    assert [r["_dlq_reason"] is None for r in rows] == [True, False, True]
    assert [r["_cdc_offset"] for r in rows] == [100, 101, 103]  # a tombstone without a key: no row
    assert rows[1]["_dlq_key"] is None and rows[1]["_dlq_value"] == b"nope"


def test_a_converter_bug_dead_letters_only_the_rows_arrow_refuses() -> None:
    spec = make_spec({"id": "bigint", "price": "numeric(10,2)"})
    plan = JsonPlan(spec)
    real = plan.converters[1]

    def buggy(value: Any, ctx: Any) -> Any:  # hands a str to a decimal column when the price is 13
        return "thirteen" if value == 13 else real(value, ctx)

    plan.converters[1] = buggy
    plan.decode_payload = compile_payload_decoder(plan)
    messages = [(key(i), dumps(change("c", after={"id": i, "price": 10 + i}))) for i in range(5)]
    rows = plan.decode_batch(kafka_batch(messages)).to_pylist()
    assert [r["id"] for r in rows] == [0, 1, 2, None, 4]
    assert rows[3]["_dlq_reason"].startswith("decoder error: ") and rows[3]["_dlq_value"] == messages[3][1]
    assert [r["price"] for r in rows] == [Decimal(10), Decimal(11), Decimal(12), None, Decimal(14)]


def test_workload_malformed_events_are_all_dead_letters() -> None:
    spec = make_spec(workload.ORDERS_COLUMNS)
    for is_wrapped in (False, True):
        events = workload.malformed_events(wrapped=is_wrapped)
        rows = decode(spec, [(e.key, e.value) for e in events])
        assert len(rows) == len(events)
        assert all(r["_dlq_reason"] for r in rows)
        assert "column 'customer_id'" in rows[-1]["_dlq_reason"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=60), st.none()), max_size=20))
def test_arbitrary_bytes_never_raise(values: list[bytes | None]) -> None:
    rows = decode(BASIC, [(b"k", v) for v in values])
    assert len(rows) == sum(v is not None for v in values)  # a tombstone whose key does not decode is skipped


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
        max_leaves=10,
    ),
    st.sampled_from(["c", "u", "d", "r"]),
)
def test_arbitrary_json_rows_never_raise(value: Any, op: str) -> None:
    spec = make_spec(
        {
            "id": "bigint",
            "n": "numeric(10,2)",
            "t": "timestamptz",
            "d": "date",
            "x": "jsonb",
            "b": "boolean",
            "f": "real",
            "s": "varchar(3)",
            "u": "uuid",
            "tm": "time",
            "by": "bytea",
        }
    )
    row = {name: value for name, _ in spec.columns}
    rows = decode(spec, [(key(1), dumps(change(op, after=row, before=row)))])
    assert len(rows) == 1


# ---- value conversion --------------------------------------------------------------------------------------------

DECIMAL = "org.apache.kafka.connect.data.Decimal"


def b64_unscaled(unscaled: int) -> str:
    length = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


# (declared type, JSON value, Connect field schema or None, expected decoded value)
GOOD_VALUES: list[tuple[str, Any, dict | None, Any]] = [
    ("smallint", -32768, None, -32768),
    ("smallint", 32767, None, 32767),
    ("integer", 2**31 - 1, None, 2**31 - 1),
    ("bigint", -(2**63), None, -(2**63)),
    ("bigint", 2**63 - 1, None, 2**63 - 1),
    ("real", 1.5, None, 1.5),
    ("real", 3, None, 3.0),
    ("real", "-Infinity", None, float("-inf")),
    ("double precision", 1e300, None, 1e300),
    ("double precision", "Infinity", None, float("inf")),
    ("double precision", 7, None, 7.0),
    ("numeric(12,2)", 123.45, None, Decimal("123.45")),
    ("numeric(12,2)", 123.4, None, Decimal("123.40")),
    ("numeric(12,2)", -0.01, None, Decimal("-0.01")),
    ("numeric(12,2)", 42, None, Decimal("42.00")),
    ("numeric(12,2)", "9999999999.99", None, Decimal("9999999999.99")),
    ("numeric(12,2)", "-1.5e2", None, Decimal("-150.00")),
    ("numeric(12,2)", "1.2300", None, Decimal("1.23")),
    ("numeric(12,2)", b64_unscaled(12345), field("x", "bytes", DECIMAL, scale="2"), Decimal("123.45")),
    ("numeric(12,2)", b64_unscaled(-128), field("x", "bytes", DECIMAL, scale="2"), Decimal("-1.28")),
    ("numeric(12,2)", b64_unscaled(5), field("x", "bytes", DECIMAL, scale="0"), Decimal("5.00")),
    ("numeric(12,2)", b64_unscaled(-999999999999), field("x", "bytes", DECIMAL, scale="2"), Decimal("-9999999999.99")),
    ("numeric(12,2)", {"scale": 3, "value": b64_unscaled(1500)}, None, Decimal("1.50")),
    ("numeric(38,0)", 12345678901234567890123456789012345678, None, Decimal("12345678901234567890123456789012345678")),
    ("numeric(38,30)", "1.000000000000000000000000000001", None, Decimal("1.000000000000000000000000000001")),
    ("numeric(5)", 99999, None, Decimal("99999")),
    ("numeric", "1.50", None, "1.50"),
    ("numeric", 7, None, "7"),
    ("numeric", "1e3", None, "1000"),
    ("numeric", "-0.000123", None, "-0.000123"),
    ("numeric", "NaN", None, "NaN"),
    ("numeric", "-Infinity", None, "-Infinity"),
    ("numeric", {"scale": 2, "value": b64_unscaled(-5)}, None, "-0.05"),
    ("numeric(40,2)", "12345678901234567890123456789012345678.5", None, "12345678901234567890123456789012345678.50"),
    ("numeric(40,2)", "NaN", None, "NaN"),
    ("boolean", True, None, True),
    ("boolean", False, None, False),
    ("text", "héllo \"q\" 'x'", None, "héllo \"q\" 'x'"),
    ("text", 5, None, "5"),
    ("text", True, None, "true"),
    ("text", {"a": [1, 2]}, None, '{"a":[1,2]}'),
    ("varchar(3)", "abc", None, "abc"),
    ("varchar(3)", "ab   ", None, "ab "),
    ("char(2)", "xy", None, "xy"),
    ("char", "y", None, "y"),
    ("jsonb", {"b": {"c": None}, "a": [1, "x"]}, None, '{"b":{"c":null},"a":[1,"x"]}'),
    ("json", '{"kept": "as text"}', None, '{"kept": "as text"}'),
    ("json", [1, 2.5], None, "[1,2.5]"),
    ("uuid", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", None, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("date", 19723, field("x", "int32", "io.debezium.time.Date"), date(2024, 1, 1)),
    ("date", -719162, None, date(1, 1, 1)),
    ("date", "2024-02-29", None, date(2024, 2, 29)),
    (
        "timestamp",
        1_704_067_200_123_456,
        field("x", "int64", "io.debezium.time.MicroTimestamp"),
        datetime(2024, 1, 1, 0, 0, 0, 123456),
    ),
    (
        "timestamp",
        1_704_067_200_123,
        field("x", "int64", "io.debezium.time.Timestamp"),
        datetime(2024, 1, 1, 0, 0, 0, 123000),
    ),
    (
        "timestamp",
        1_704_067_200_123_456_789,
        field("x", "int64", "io.debezium.time.NanoTimestamp"),
        datetime(2024, 1, 1, 0, 0, 0, 123456),
    ),
    ("timestamp", 1_704_067_200_000_001, None, datetime(2024, 1, 1, 0, 0, 0, 1)),
    ("timestamp", "2024-01-01T10:20:30.5", None, datetime(2024, 1, 1, 10, 20, 30, 500000)),
    ("timestamp", "2024-01-01T10:20:30+05:00", None, datetime(2024, 1, 1, 10, 20, 30)),
    (
        "timestamptz",
        "2024-01-01T12:00:00.5+02:00",
        field("x", "string", "io.debezium.time.ZonedTimestamp"),
        datetime(2024, 1, 1, 10, 0, 0, 500000, tzinfo=UTC),
    ),
    ("timestamptz", "2024-01-01T12:00:00Z", None, datetime(2024, 1, 1, 12, tzinfo=UTC)),
    ("timestamptz", "2024-01-01T12:00:00.123456789Z", None, datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)),
    ("timestamptz", "2024-01-01 12:00:00", None, datetime(2024, 1, 1, 12, tzinfo=UTC)),
    ("timestamptz", "2024-01-01T12:00:00-0130", None, datetime(2024, 1, 1, 13, 30, tzinfo=UTC)),
    ("timestamptz", 1_704_067_200_000_000, None, datetime(2024, 1, 1, tzinfo=UTC)),
    ("time", 3_723_000_001, field("x", "int64", "io.debezium.time.MicroTime"), "01:02:03.000001"),
    ("time", 3_723_000, field("x", "int32", "io.debezium.time.Time"), "01:02:03"),
    ("time", 3_723_000_000_000, field("x", "int64", "io.debezium.time.NanoTime"), "01:02:03"),
    ("time", 86_400_000_000, None, "24:00:00"),
    ("time", "13:45", None, "13:45:00"),
    ("time", "13:45:07.25", None, "13:45:07.250000"),
    ("bytea", base64.b64encode(b"\x00\x01\xff").decode(), None, b"\x00\x01\xff"),
    ("interval", "P1Y2M3DT4H5M6.78S", None, "P1Y2M3DT4H5M6.78S"),
    ("interval", 90_000_000, None, "90000000 microseconds"),
]


def _decode_value(pg: str, value: Any, schema: dict | None, *, wrap: bool) -> dict:
    spec = make_spec({"id": "bigint", "x": pg})
    payload = change("c", after={"id": 1, "x": value})
    if wrap or schema is not None:
        raw = wrapped(payload, [field("id", "int64"), {**(schema or field("x", "string")), "field": "x"}])
    else:
        raw = dumps(payload)
    return only(decode(spec, [(key(1), raw)]))


@pytest.mark.parametrize(
    ("pg", "value", "schema", "expected"), GOOD_VALUES, ids=[f"{g[0]}:{str(g[1])[:30]}" for g in GOOD_VALUES]
)
def test_value_conversion(pg: str, value: Any, schema: dict | None, expected: Any) -> None:
    row = _decode_value(pg, value, schema, wrap=False)
    assert row["_dlq_reason"] is None, row["_dlq_reason"]
    assert row["x"] == expected
    assert type(row["x"]) is type(expected)


# (declared type, JSON value, Connect field schema or None, fragment of the reason)
BAD_VALUES: list[tuple[str, Any, dict | None, str]] = [
    ("smallint", 32768, None, "32768 is out of range for smallint"),
    ("integer", -(2**31) - 1, None, "out of range for integer"),
    ("bigint", 2**63, None, "out of range for bigint"),
    ("bigint", 1.5, None, "1.5 is not a valid bigint"),
    ("bigint", 5.0, None, "not a valid bigint"),
    ("bigint", "12", None, "'12' is not a valid bigint"),
    ("bigint", True, None, "not a valid bigint"),
    ("real", 1e39, None, "out of range for real"),
    ("double precision", "fast", None, "'fast' is not a valid double precision"),
    ("numeric(12,2)", 1.234, None, "does not fit numeric(12,2) (more than 2 digits after the point)"),
    ("numeric(12,2)", 12345678901.5, None, "does not fit numeric(12,2) (more than 10 integer digits)"),
    ("numeric(12,2)", "1e10", None, "more than 10 integer digits"),
    ("numeric(12,2)", "NaN", None, "declare the column as numeric without precision"),
    ("numeric(12,2)", "POSITIVE_INFINITY", None, "not a finite number"),
    ("numeric(12,2)", "12,5", None, "'12,5' is not a valid numeric(12,2)"),
    ("numeric(12,2)", "AeJA", None, "not a valid numeric(12,2)"),
    ("numeric(12,2)", b64_unscaled(123456), field("x", "bytes", DECIMAL, scale="3"), "more than 2 digits"),
    ("numeric(12,2)", "@@@", field("x", "bytes", DECIMAL, scale="2"), "not a valid numeric(12,2)"),
    ("numeric(12,2)", {"scale": 1}, None, "VariableScaleDecimal"),
    ("numeric(12,2)", [1], None, "not a valid numeric(12,2)"),
    ("numeric(38,30)", "1e-31", None, "more than 30 digits after the point"),
    ("numeric", "1e999999", None, "out of range for numeric"),
    ("boolean", 1, None, "1 is not a valid boolean"),
    ("boolean", "true", None, "not a valid boolean"),
    ("text", "nul\x00inside", None, "cannot contain NUL"),
    ("varchar(3)", "abcd", None, "'abcd' is longer than character varying(3) allows"),
    ("char", "yz", None, "'yz' is longer than character allows"),
    ("uuid", "not-a-uuid", None, "'not-a-uuid' is not a valid uuid"),
    ("date", 2_145_042_906, None, "out of range for date (Postgres' dates run from 4714-11-24 BC"),
    ("date", -2_440_589, None, "out of range for date"),
    ("date", "-4714-11-23", None, "out of range for date"),
    ("date", "2024-13-01", None, "not a valid date"),
    ("date", 1.5, None, "not a valid date"),
    ("timestamp", 2**63 - 1, None, "out of range for timestamp without time zone"),
    ("timestamp", -210_866_803_200_000_001, None, "out of range for timestamp without time zone"),
    ("timestamptz", "yesterday", None, "'yesterday' is not a valid timestamp with time zone"),
    ("timestamptz", "+294276-12-31T23:59:59.999999Z", None, "out of range for timestamp with time zone"),
    ("timestamptz", "2024-02-30T00:00:00Z", None, "not a valid timestamp with time zone"),
    ("timestamptz", 2**70, field("x", "int64", "io.debezium.time.MicroTimestamp"), "out of range"),
    ("time", "25:00:00", None, "not a valid time without time zone"),
    ("time", 86_400_000_001, None, "out of range for time without time zone"),
    ("bytea", "not base64!", None, "not a valid bytea"),
    ("interval", 1.5, None, "not a valid interval"),
]


@pytest.mark.parametrize(
    ("pg", "value", "schema", "fragment"), BAD_VALUES, ids=[f"{b[0]}:{str(b[1])[:30]}" for b in BAD_VALUES]
)
def test_unconvertible_values_are_dead_letters_naming_column_value_and_type(
    pg: str, value: Any, schema: dict | None, fragment: str
) -> None:
    row = _decode_value(pg, value, schema, wrap=False)
    reason = row["_dlq_reason"]
    assert reason is not None and reason.startswith("column 'x': "), reason
    assert fragment in reason, reason
    assert row["x"] is None and row["id"] is None and row["_dlq_value"] is not None


def test_long_values_are_truncated_in_the_reason() -> None:
    row = _decode_value("bigint", "x" * 500, None, wrap=False)
    assert "..." in row["_dlq_reason"] and len(row["_dlq_reason"]) < 150


def test_json_number_decimals_are_exact_not_rounded_through_double() -> None:
    spec = make_spec({"id": "bigint", "x": "numeric(38,30)", "big": "numeric(38,0)", "free": "numeric"})
    raw = (
        b'{"before":null,"after":{"id":1,"x":1.000000000000000000000000000001,'
        b'"big":98765432109876543210987654321,"free":12.50},"op":"c","source":{"lsn":5}}'
    )
    row = only(decode(spec, [(key(1), raw)]))
    assert row["x"] == Decimal("1.000000000000000000000000000001")
    assert row["big"] == Decimal("98765432109876543210987654321")
    assert row["free"] == "12.50"  # Java writes a decimal with its scale; Postgres keeps it
    # before and after carry different exact values that round to the same double: re-parsed exactly
    raw = (
        b'{"before":{"id":1,"x":0.100000000000000000000000000001},'
        b'"after":{"id":1,"x":0.100000000000000000000000000002},"op":"u","source":{"lsn":6}}'
    )
    assert only(decode(spec, [(key(1), raw)]))["x"] == Decimal("0.100000000000000000000000000002")
    # whitespace between name and number, and a double that is not a plain short repr
    raw = b'{"after": {"id": 1, "x": 1.5E-1, "free": 2.50}, "op": "c"}'
    row = only(decode(spec, [(key(1), raw)]))
    assert (row["x"], row["free"]) == (Decimal("0.15"), "2.50")
    # a numeric key column given as a JSON number in the message key
    key_spec = make_spec({"id": "numeric(30,10)", "v": "text"}, None)
    row = only(decode(key_spec, [(b'{"id":12345678901234567890.0000000001}', dumps(change("c", {"v": "a"})))]))
    assert row["id"] == Decimal("12345678901234567890.0000000001")


def test_messages_parsed_exactly_convert_every_type() -> None:
    spec = make_spec({"id": "bigint", "f": "real", "n": "numeric(40,2)", "j": "jsonb", "t": "text"})
    # numbers inside a JSON column keep their text, which takes the exact (Decimal) parse of the whole message
    raw = (
        b'{"before":{"id":1,"n":1.000000000000000000000001},"after":{"id":1,"f":0.25,'
        b'"n":1234567890123456789012345678901234567.5,"j":{"a":1.50,"b":[2.0]},"t":3.10},"op":"u"}'
    )
    row = only(decode(spec, [(key(1), raw)]))
    assert row["_dlq_reason"] is None, row["_dlq_reason"]
    assert (row["f"], row["n"], row["j"], row["t"]) == (
        0.25,
        "1234567890123456789012345678901234567.50",
        '{"a":1.50,"b":[2.0]}',
        "3.10",
    )


def test_wrapped_schema_with_a_payload_key_inside_and_interleaved_schemas() -> None:
    spec = make_spec({"id": "bigint", "amount": "numeric(12,2)"})
    decimal_field = field("amount", "bytes", DECIMAL, scale="2", payload="tricky")
    first = wrapped(change("c", after={"id": 1, "amount": b64_unscaled(150)}), [field("id", "int64"), decimal_field])
    assert b',"payload":"tricky"' in first
    second = wrapped(
        change("c", after={"id": 2, "amount": b64_unscaled(250)}),
        [field("id", "int64"), field("amount", "bytes", DECIMAL, scale="1")],
    )
    rows = decode(spec, [(key(1), first), (key(2), second), (key(1), first), (key(2), second)])
    assert [r["amount"] for r in rows] == [Decimal("1.50"), Decimal("25.00")] * 2


# ---- primary key -------------------------------------------------------------------------------------------------


def test_key_columns_come_from_the_message_key_when_no_primary_key_is_declared() -> None:
    spec = make_spec({"tenant": "text", "id": "bigint", "name": "text"}, None)
    raw_key = dumps({"tenant": "acme", "id": 5})
    row = only(decode(spec, [(raw_key, dumps(change("u", after={"tenant": "other", "id": 99, "name": "n"})))]))
    assert business(row, spec) == {"tenant": "acme", "id": 5, "name": "n"}  # the key overrides the row


@pytest.mark.parametrize(
    ("raw_key", "fragment"),
    [
        (None, "message has no key, and the source declares no primary_key"),
        (b"{oops", "message key is not JSON"),
        (b"[5]", "message key is an array"),
        (b"{}", "message key has no fields"),
        (dumps({"id": 5, "region": "eu"}), "message key field 'region' is not a declared column"),
        (dumps({"id": None}), "primary key column 'id' is null"),
        (dumps({"id": "five"}), "message key column 'id': 'five' is not a valid bigint"),
    ],
)
def test_bad_message_keys_without_declared_primary_key(raw_key: bytes | None, fragment: str) -> None:
    spec = make_spec({"id": "bigint", "name": "text"}, None)
    raw = dumps(change("c", after={"id": 5, "name": "n"}))
    row = only(decode(spec, [(raw_key, raw)]))
    assert_dead_letter(row, spec, raw_key, raw, fragment)


def test_declared_primary_key_falls_back_to_the_message_key() -> None:
    spec = make_spec({"id": "bigint", "name": "text"})
    from_row = only(decode(spec, [(key(1), dumps(change("c", after={"id": 2, "name": "n"})))]))
    assert from_row["id"] == 2  # the row wins when it has the value
    from_key = only(decode(spec, [(key(1), dumps(change("c", after={"name": "n"})))]))
    assert from_key["id"] == 1
    raw = dumps(change("c", after={"name": "n"}))
    for raw_key, fragment in [
        (dumps({"other": 1}), "primary key column 'id' is null"),
        (None, "primary key column 'id' is null (message has no key)"),
        (b"nope", "primary key column 'id' is null (message key is not JSON"),
    ]:
        assert_dead_letter(only(decode(spec, [(raw_key, raw)])), spec, raw_key, raw, fragment)


def test_composite_declared_key_needs_every_column() -> None:
    spec = make_spec({"a": "integer", "b": "text", "v": "text"}, ("a", "b"))
    raw = dumps(change("c", after={"a": 1, "v": "x"}))
    row = only(decode(spec, [(dumps({"a": 1}), raw)]))
    assert_dead_letter(row, spec, dumps({"a": 1}), raw, "primary key column 'b' is null")
    row = only(decode(spec, [(dumps({"a": 1, "b": "k"}), raw)]))
    assert business(row, spec) == {"a": 1, "b": "k", "v": "x"}


# ---- metadata ----------------------------------------------------------------------------------------------------


def test_version_is_the_lsn_else_the_kafka_offset() -> None:
    after = {"id": 1, "name": "a", "qty": 1}
    messages = [
        (key(1), dumps(change("c", after, lsn=987_654_321, sequence='["987654000","987654321"]'))),
        (key(1), dumps(change("u", after, lsn=None))),
        (key(1), dumps({**change("u", after), "source": {"lsn": "0/16B3748"}})),
        (key(1), dumps({**change("u", after), "source": None})),
    ]
    rows = decode(BASIC, messages, first_offset=500)
    assert [r["_cdc_version"] for r in rows] == [
        (987_654_000 << 64) + 987_654_321,
        *((1 << 64) + o for o in (501, 502, 503)),
    ]


def test_ts_is_source_ts_ms_else_payload_ts_ms_else_kafka_timestamp() -> None:
    after = {"id": 1, "name": "a", "qty": 1}
    messages = [
        (key(1), dumps(change("c", after, ts_ms=1_704_067_200_123, envelope_ts_ms=1_704_067_999_000))),
        (key(1), dumps(change("c", after, ts_ms=None, envelope_ts_ms=1_704_067_999_000))),
        (key(1), dumps(change("c", after, ts_ms=None, envelope_ts_ms=None))),
    ]
    rows = decode(BASIC, messages)
    assert [r["_cdc_ts"] for r in rows] == [
        datetime(2024, 1, 1, 0, 0, 0, 123000, tzinfo=UTC),
        datetime(2024, 1, 1, 0, 13, 19, tzinfo=UTC),
        datetime.fromtimestamp((KAFKA_TS_MS + 2) / 1000, tz=UTC),
    ]


def test_kafka_source_columns_with_other_arrow_types_are_accepted() -> None:
    payload = dumps(change("c", after={"id": 1, "name": "a", "qty": 1}, lsn=None, ts_ms=None, envelope_ts_ms=None))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([key(1)], type=pa.large_binary()),
            pa.array([payload], type=pa.large_binary()),
            pa.array([TOPIC], type=pa.large_string()),
            pa.array([2], type=pa.int32()),
            pa.array([77], type=pa.int64()),
            pa.array([KAFKA_TS_MS], type=pa.timestamp("ms", tz="UTC")),
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp"],
    )
    out = next(decode_batches(iter([batch]), BASIC))
    assert out.schema == output_arrow_schema(BASIC)
    row = out.to_pylist()[0]
    assert (row["_cdc_version"], row["_cdc_partition"], row["_cdc_topic"]) == ((1 << 64) + 77, 2, TOPIC)
    assert row["_cdc_ts"] == datetime.fromtimestamp(KAFKA_TS_MS / 1000, tz=UTC)


# ---- generator round trip ----------------------------------------------------------------------------------------


def fold_newest(rows: list[dict], columns: list[str]) -> dict[int, dict[str, Any]]:
    """The mirror a correct sink keeps: per key, the row with the highest _cdc_version; deletes remove it."""
    newest: dict[int, dict] = {}
    for row in rows:
        if row["_cdc_version"] is None:  # a tombstone: its delete event came before it
            continue
        current = newest.get(row["id"])
        if current is None or row["_cdc_version"] > current["_cdc_version"]:
            newest[row["id"]] = row
    return {k: {c: r[c] for c in columns} for k, r in newest.items() if r["_cdc_op"] != "d"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.integers(0, 400),
    keys=st.integers(1, 60),
    seed=st.integers(0, 2**32),
    is_wrapped=st.booleans(),
    tombstones=st.booleans(),
    full_identity=st.booleans(),
    declared_key=st.booleans(),
    partitions=st.integers(1, 5),
    batch_size=st.integers(1, 500),
    replays=st.integers(0, 20),
)
def test_generated_changelogs_fold_to_the_expected_state(
    changes: int,
    keys: int,
    seed: int,
    is_wrapped: bool,
    tombstones: bool,
    full_identity: bool,
    declared_key: bool,
    partitions: int,
    batch_size: int,
    replays: int,
) -> None:
    load = workload.generate(
        changes, keys, seed=seed, wrapped=is_wrapped, tombstones=tombstones, replica_identity_full=full_identity
    )
    events = load.events + workload.stale_replays(load, replays, seed=seed)
    batch = workload.to_kafka_batch(events, partitions=partitions)
    batches = [batch.slice(i, batch_size) for i in range(0, batch.num_rows, batch_size)]
    spec = make_spec(workload.ORDERS_COLUMNS, workload.ORDERS_PRIMARY_KEY if declared_key else None)
    rows = [row for out in decode_batches(iter(batches), spec) for row in out.to_pylist()]
    assert [r["_dlq_reason"] for r in rows if r["_dlq_reason"]] == []
    assert len(rows) == len(events)  # tombstones too: each is a delete of its key
    assert fold_newest(rows, list(workload.ORDERS_COLUMNS)) == load.expected
