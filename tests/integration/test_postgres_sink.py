"""The upsert sink's SQL against a real Postgres, without Spark: stage Arrow batches the way executors do,
merge them the way the driver does, and check versioning, deletes, tombstones, the ledger and value fidelity."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.migrations import POSTGRES
from cdcsync.sinks.postgres import PostgresUpsertSink

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("Name", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("blob", pa.binary()),
        ("_cdc_op", pa.string()),
        ("_cdc_version", pa.int64()),
        ("_cdc_ts", pa.timestamp("us", tz="UTC")),
    ]
)


def pipeline(delete_mode: str, on_truncate: str = "apply") -> Pipeline:
    return validate_pipeline_dict(
        {
            "name": "sinktest",
            "sources": {
                "s": {
                    "type": "kafka",
                    "topic": "t",
                    "primary_key": "id",
                    "columns": {"id": "bigint", "Name": "text", "amount": "numeric(12,2)", "blob": "bytea"},
                }
            },
            "sinks": {
                "m": {
                    "type": "postgres",
                    "from": "s",
                    "schema": "My App",
                    "table": "select",
                    "delete_mode": delete_mode,
                    "on_truncate": on_truncate,
                }
            },
        }
    )


def make_sink(delete_mode: str, dsn: str, migrations_dir: Path, on_truncate: str = "apply") -> PostgresUpsertSink:
    definition = pipeline(delete_mode, on_truncate)
    migrations.init(POSTGRES, definition, migrations_dir)
    with psycopg.connect(dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, definition.name, migrations_dir)
    return PostgresUpsertSink(definition, "m", definition.sinks["m"], dsn)


@pytest.fixture(params=["hard", "soft"])
def sink(request: pytest.FixtureRequest, postgres_dsn: str, tmp_path: Path) -> PostgresUpsertSink:
    return make_sink(request.param, postgres_dsn, tmp_path)


def change(
    op: str,
    key: int | None,
    version: int,
    name: str | None = "n",
    amount: str | None = "1.00",
    blob: bytes | None = None,
) -> dict[str, Any]:
    return {
        "id": key,
        "Name": name,
        "amount": None if amount is None else Decimal(amount),
        "blob": blob,
        "_cdc_op": op,
        "_cdc_version": version,
        "_cdc_ts": T0,
    }


def land(
    sink: PostgresUpsertSink, batch_id: int, *partitions: list[dict[str, Any]], checkpoint: str = "cp"
) -> int | None:
    """Stage each partition as an executor would, then merge; returns rows out (None: batch already merged)."""
    key = sink.ledger_key(batch_id, checkpoint)
    if not sink.prepare(key):
        return None
    writer = sink.stage_writer(batch_id)
    staged = sum(writer.stage(pa.Table.from_pylist(rows, schema=SCHEMA)) for rows in partitions)
    return sink.merge(key, staged)


def target(sink: PostgresUpsertSink) -> dict[int, dict[str, Any]]:
    with psycopg.connect(sink.dsn) as conn:
        cursor = conn.execute('SELECT * FROM "My App"."select"')
        names = [d.name for d in cursor.description or []]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cursor}


def live(sink: PostgresUpsertSink) -> dict[int, dict[str, Any]]:
    return {k: v for k, v in target(sink).items() if not v.get("_cdc_deleted", False)}


def test_newest_version_wins_within_and_across_partitions(sink: PostgresUpsertSink) -> None:
    land(sink, 0, [change("c", 1, 10, "a"), change("u", 1, 30, "c")], [change("u", 1, 20, "b"), change("c", 2, 5)])
    rows = live(sink)
    assert rows[1]["Name"] == "c" and rows[1]["_cdc_version"] == 30
    assert set(rows) == {1, 2}


def test_older_versions_replayed_later_are_ignored(sink: PostgresUpsertSink) -> None:
    land(sink, 0, [change("c", 1, 10, "a"), change("u", 1, 30, "new")])
    land(sink, 1, [change("u", 1, 20, "stale")])
    assert live(sink)[1]["Name"] == "new"


def test_delete_then_stale_replay_does_not_resurrect(sink: PostgresUpsertSink) -> None:
    land(sink, 0, [change("c", 1, 10, "a")])
    land(sink, 1, [change("d", 1, 40, None, None)])
    assert 1 not in live(sink)
    land(sink, 2, [change("u", 1, 30, "stale")])
    assert 1 not in live(sink)
    land(sink, 3, [change("c", 1, 50, "back")])
    assert live(sink)[1]["Name"] == "back"


def truncate(version: int) -> dict[str, Any]:
    """Debezium's truncate: no key, no values, only a version."""
    return change("t", None, version, None, None)


def test_truncate_lands_in_version_order_with_the_changes_around_it(sink: PostgresUpsertSink) -> None:
    land(sink, 0, [change("c", 1, 10, "before"), change("c", 2, 20, "before")])
    # One batch over two partitions: changes older than the truncate, the truncate, a change newer than it.
    land(sink, 1, [change("u", 1, 25, "gone"), truncate(30)], [change("c", 3, 40, "after"), change("u", 2, 28, "x")])
    assert {key: row["Name"] for key, row in live(sink).items()} == {3: "after"}
    # Later arrivals older than the truncate are ignored; newer ones land.
    land(sink, 2, [change("u", 1, 29, "late"), change("c", 2, 50, "new")])
    assert {key: row["Name"] for key, row in live(sink).items()} == {2: "new", 3: "after"}
    land(sink, 3, [truncate(60)])
    assert live(sink) == {}


def test_on_truncate_ignore_keeps_the_rows(postgres_dsn: str, tmp_path: Path) -> None:
    sink = make_sink("hard", postgres_dsn, tmp_path, on_truncate="ignore")
    land(sink, 0, [change("c", 1, 10, "kept"), truncate(20), change("c", 2, 30, "also")])
    assert {key: row["Name"] for key, row in live(sink).items()} == {1: "kept", 2: "also"}


PLACEHOLDER = "__debezium_unavailable_value"  # what Debezium sends for an unchanged TOASTed value


def test_unchanged_toasted_values_keep_the_stored_value(sink: PostgresUpsertSink) -> None:
    big = "x" * 5000
    land(sink, 0, [change("c", 1, 10, big, blob=b"\x00" * 3000), change("c", 2, 11, big, blob=b"\x01")])
    land(sink, 1, [change("u", 1, 20, PLACEHOLDER, "2.00", blob=PLACEHOLDER.encode())])
    row = live(sink)[1]
    assert (row["Name"], bytes(row["blob"]), row["amount"]) == (big, b"\x00" * 3000, Decimal("2.00"))
    # Within one batch: a value set, then left unchanged by a newer change; the set value wins.
    land(sink, 2, [change("u", 2, 30, "set in batch"), change("u", 2, 31, PLACEHOLDER, "3.00")])
    assert live(sink)[2]["Name"] == "set in batch" and live(sink)[2]["amount"] == Decimal("3.00")


def test_soft_delete_keeps_stored_values(postgres_dsn: str, tmp_path: Path) -> None:
    sink = make_sink("soft", postgres_dsn, tmp_path)
    land(sink, 0, [change("c", 7, 10, "kept", "9.99")])
    land(sink, 1, [change("d", 7, 20, None, None)])
    row = target(sink)[7]
    assert row["_cdc_deleted"] is True and row["Name"] == "kept" and row["_cdc_version"] == 20


def test_replayed_batch_is_skipped_by_the_ledger(sink: PostgresUpsertSink) -> None:
    assert land(sink, 0, [change("c", 1, 10, "first")]) == 1
    assert land(sink, 0, [change("u", 1, 99, "must not land")]) is None
    assert live(sink)[1]["Name"] == "first"
    # A reset checkpoint (new id) starts batch ids again; its batches are not mistaken for old ones.
    assert land(sink, 0, [change("u", 1, 11, "after reset")], checkpoint="cp2") == 1
    assert live(sink)[1]["Name"] == "after reset"


def test_a_retried_task_staging_twice_changes_nothing(sink: PostgresUpsertSink) -> None:
    part = [change("c", 1, 10, "x"), change("c", 2, 11, "y")]
    assert land(sink, 0, part, part) == 2
    assert {k: v["Name"] for k, v in live(sink).items()} == {1: "x", 2: "y"}


def test_values_round_trip_through_copy(sink: PostgresUpsertSink) -> None:
    tricky = ['comma, "quote" and\nnewline', "", "café 🎁", "back\\slash\ttab", None]
    land(
        sink,
        0,
        [
            change("c", i, 10 + i, name, "-12.34", blob)
            for i, (name, blob) in enumerate(zip(tricky, [b"\x00\xff", b"", None, b"\\x", b"a"], strict=True))
        ],
    )
    rows = live(sink)
    assert [rows[i]["Name"] for i in range(len(tricky))] == tricky  # '' stays '', NULL stays NULL
    assert [None if rows[i]["blob"] is None else bytes(rows[i]["blob"]) for i in range(5)] == [
        b"\x00\xff",
        b"",
        None,
        b"\\x",
        b"a",
    ]
    assert rows[0]["amount"] == Decimal("-12.34")
    assert rows[0]["_cdc_ts"] == T0


def test_ledger_holds_rows_written(sink: PostgresUpsertSink) -> None:
    land(sink, 0, [change("c", 1, 10), change("c", 2, 10), change("u", 1, 11)])
    with psycopg.connect(sink.dsn) as conn:
        rows = conn.execute("SELECT batch_id, rows_written FROM cdcsync.batch_ledger").fetchall()
        staged = conn.execute('SELECT count(*) FROM cdcsync."sinktest__m__stage"').fetchone()
    assert rows == [(0, 2)]
    assert staged == (0,)


TYPED_COLUMNS = {
    "id": "bigint",
    "tags": "text[]",
    "ints": "bigint[]",
    "prices": "numeric(10,2)[]",
    "stamps": "timestamptz[]",
    "blobs": "bytea[]",
    "tz": "timetz",
    "flags": "bit(4)",
    "vflags": "varbit",
    "t0": "time(0)",
}
TYPED_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("tags", pa.list_(pa.string())),
        ("ints", pa.list_(pa.int64())),
        ("prices", pa.list_(pa.decimal128(10, 2))),
        ("stamps", pa.list_(pa.timestamp("us", tz="UTC"))),
        ("blobs", pa.list_(pa.binary())),
        ("tz", pa.string()),
        ("flags", pa.string()),
        ("vflags", pa.string()),
        ("t0", pa.string()),
        ("_cdc_op", pa.string()),
        ("_cdc_version", pa.int64()),
        ("_cdc_ts", pa.timestamp("us", tz="UTC")),
    ]
)


def typed_sink(dsn: str, migrations_dir: Path) -> PostgresUpsertSink:
    definition = validate_pipeline_dict(
        {
            "name": "typedtest",
            "sources": {"s": {"type": "kafka", "topic": "t", "primary_key": "id", "columns": TYPED_COLUMNS}},
            "sinks": {"m": {"type": "postgres", "from": "s", "schema": "app", "table": "typed"}},
        }
    )
    migrations.init(POSTGRES, definition, migrations_dir)
    with psycopg.connect(dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, definition.name, migrations_dir)
    return PostgresUpsertSink(definition, "m", definition.sinks["m"], dsn)


def typed_change(key: int, version: int, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {name: None for name in TYPED_COLUMNS}
    return {**row, "id": key, **values, "_cdc_op": "u", "_cdc_version": version, "_cdc_ts": T0}


def land_typed(sink: PostgresUpsertSink, batch_id: int, rows: list[dict[str, Any]]) -> None:
    key = sink.ledger_key(batch_id, "cp")
    assert sink.prepare(key)
    staged = sink.stage_writer(batch_id).stage(pa.Table.from_pylist(rows, schema=TYPED_SCHEMA))
    sink.merge(key, staged)


def test_arrays_timetz_and_bits_round_trip_through_copy(postgres_dsn: str, tmp_path: Path) -> None:
    sink = typed_sink(postgres_dsn, tmp_path)
    tricky = ['comma, "quote"', "", None, "NULL", "back\\slash", "{brace}", "café\nnewline"]
    values = {
        "tags": tricky,
        "ints": [-(2**63), None, 2**63 - 1],
        "prices": [Decimal("-1.50"), None, Decimal("12345678.90")],
        "stamps": [T0, None],
        "blobs": [b"\x00\\", None, b""],
        "tz": "23:59:59.999999-05:30",
        "flags": "0101",
        "vflags": "",
        "t0": "13:14:15",
    }
    land_typed(sink, 0, [typed_change(1, 10, **values), typed_change(2, 11, tags=[], ints=[])])
    with psycopg.connect(postgres_dsn) as conn:
        row = conn.execute(
            "SELECT tags, ints, prices, stamps, blobs, tz::text, flags::text, vflags::text, t0::text"
            " FROM app.typed WHERE id = 1"
        ).fetchone()
        empty = conn.execute("SELECT tags, ints, prices FROM app.typed WHERE id = 2").fetchone()
    assert row is not None and empty is not None
    tags, ints, prices, stamps, blobs, *texts = row
    assert (tags, ints, prices, stamps) == (tricky, values["ints"], values["prices"], [T0, None])
    assert [None if b is None else bytes(b) for b in blobs] == [b"\x00\\", None, b""]
    assert texts == ["23:59:59.999999-05:30", "0101", "", "13:14:15"]
    assert empty == ([], [], None)


def test_unchanged_toasted_arrays_keep_the_stored_value(postgres_dsn: str, tmp_path: Path) -> None:
    sink = typed_sink(postgres_dsn, tmp_path)
    big_tags, big_ints = ["x" * 5000, None], list(range(3000))
    land_typed(sink, 0, [typed_change(1, 10, tags=big_tags, ints=big_ints, flags="1111")])
    placeholder_ints = list(PLACEHOLDER.encode())
    land_typed(sink, 1, [typed_change(1, 20, tags=[PLACEHOLDER], ints=placeholder_ints, flags="0000")])
    with psycopg.connect(postgres_dsn) as conn:
        row = conn.execute("SELECT tags, ints, flags::text FROM app.typed WHERE id = 1").fetchone()
    assert row == (big_tags, big_ints, "0000")
