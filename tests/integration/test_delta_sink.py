"""Delta sinks on the shared SparkSession and a real Postgres (the ledger): the migrations create the tables, and
the MERGEs keep the newest version per key (mirror) or every version in order (history), whatever order the
changes arrive in, while a replayed batch leaves the table's version where it was."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.core.errors import MigrationError
from cdcsync.migrations import DELTA, POSTGRES
from cdcsync.migrations.delta import DeltaConnection
from cdcsync.sinks.delta import DeltaTableSink, table_summary

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SCHEMA = "id bigint, `Name` string, amount decimal(12,2), _cdc_op string, _cdc_version decimal(38,0), _cdc_ts timestamp"
PLACEHOLDER = "__debezium_unavailable_value"


def definition(root: Path) -> Pipeline:
    sinks = {
        "hard": {"type": "delta", "from": "orders", "path": str(root / "hard")},
        "soft": {"type": "delta", "from": "orders", "path": str(root / "soft"), "delete_mode": "soft"},
        "hist": {"type": "delta", "from": "orders", "path": str(root / "hist"), "mode": "history"},
    }
    columns = {"id": "bigint", "Name": "text", "amount": "numeric(12,2)"}
    source = {"type": "kafka", "topic": "shop.orders", "primary_key": "id", "columns": columns}
    return validate_pipeline_dict({"name": "lake", "sources": {"orders": source}, "sinks": sinks})


@pytest.fixture()
def lake(spark: Any, postgres_dsn: str, tmp_path: Path) -> Pipeline:
    pipeline = definition(tmp_path / "lake")
    for target in (POSTGRES, DELTA):
        migrations.init(target, pipeline, tmp_path / "migrations")
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, tmp_path / "migrations")
        applied = migrations.apply_pending(DELTA, DeltaConnection(conn, spark), pipeline.name, tmp_path / "migrations")
    assert [item.filename for item in applied] == ["0001_init.sql"]
    return pipeline


def sink(pipeline: Pipeline, sink_id: str, dsn: str) -> DeltaTableSink:
    definition = pipeline.sinks[sink_id]
    return DeltaTableSink(pipeline, sink_id, definition, dsn)  # type: ignore[arg-type]


def change(op: str, key: int, version: int, name: str | None = "n", seconds: int = 0) -> dict[str, Any]:
    amount = None if op == "d" else Decimal("1.00")
    return {
        "id": key,
        "Name": None if op == "d" else name,
        "amount": amount,
        "_cdc_op": op,
        "_cdc_version": Decimal(version),
        "_cdc_ts": T0 + dt.timedelta(seconds=seconds or version),
    }


def land(spark: Any, target: DeltaTableSink, batch_id: int, rows: list[dict[str, Any]], checkpoint: str = "cp") -> Any:
    key = target.ledger_key(batch_id, checkpoint)
    if not target.prepare(key):
        return None
    return target.merge_changes(key, spark.createDataFrame(rows, SCHEMA))


def table(spark: Any, target: DeltaTableSink) -> dict[int, dict[str, Any]]:
    rows = spark.read.format("delta").load(target.location["path"]).collect()
    return {row["id"]: row.asDict() for row in rows}


def version(spark: Any, target: DeltaTableSink) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{target.location['path']}` LIMIT 1").collect()[0]["version"])


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_mirror_keeps_the_newest_version_and_never_resurrects_a_deleted_key(
    spark: Any, lake: Pipeline, postgres_dsn: str, mode: str
) -> None:
    mirror = sink(lake, mode, postgres_dsn)
    first = [change("c", 1, 10, "a"), change("u", 1, 12, "b"), change("c", 2, 11, "x"), change("c", 3, 13, "y")]
    land(spark, mirror, 0, first)
    assert {k: r["Name"] for k, r in table(spark, mirror).items()} == {1: "b", 2: "x", 3: "y"}

    # An older change of key 1, a delete of key 2, a tombstone (no version) and a truncate: only the delete lands.
    tombstone = {**change("d", 2, 0), "_cdc_version": None}
    truncate = {**change("t", 0, 1), "id": None}
    land(spark, mirror, 1, [change("u", 1, 11, "old"), change("d", 2, 20), tombstone, truncate])
    rows = table(spark, mirror)
    assert rows[1]["Name"] == "b" and rows[1]["_cdc_version"] == 12
    if mode == "hard":
        assert set(rows) == {1, 3}
    else:
        assert rows[2]["_cdc_deleted"] is True and rows[2]["_cdc_version"] == 20 and rows[2]["Name"] == "x"
        assert rows[1]["_cdc_deleted"] is False

    # The same changes again under a new checkpoint (a reset one: neither the ledger nor Delta skips them), plus a
    # create of key 2 older than its delete: the key stays deleted.
    land(spark, mirror, 0, [*first, change("c", 2, 15, "ghost")], checkpoint="reset")
    rows = table(spark, mirror)
    assert (2 not in rows) if mode == "hard" else rows[2]["_cdc_deleted"] is True
    assert rows[1]["Name"] == "b"

    # A newer create brings the key back (and removes its tombstone).
    land(spark, mirror, 1, [change("c", 2, 30, "back")], checkpoint="reset")
    assert table(spark, mirror)[2]["Name"] == "back"
    if mode == "hard":
        tombstones = spark.read.format("delta").load(mirror.tombstones["location"]["path"])  # type: ignore[index]
        assert tombstones.count() == 0


def test_a_replayed_batch_does_not_advance_the_table_and_placeholders_keep_values(
    spark: Any, lake: Pipeline, postgres_dsn: str
) -> None:
    mirror = sink(lake, "hard", postgres_dsn)
    land(spark, mirror, 0, [change("c", 1, 10, "a"), change("c", 2, 11, "b")])
    assert land(spark, mirror, 1, [change("u", 1, 20, "c"), change("d", 2, 21)]) == 2
    before, content = version(spark, mirror), table(spark, mirror)
    # A crash after Delta's commit, before the ledger row: the replay reaches the MERGE, and Delta skips it.
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute("DELETE FROM cdcsync.batch_ledger WHERE batch_id = 1")
    assert land(spark, mirror, 1, [change("u", 1, 20, "c"), change("d", 2, 21)]) == 0
    assert version(spark, mirror) == before
    assert table(spark, mirror) == content
    assert table_summary(mirror.location["path"]) == (before, 1)

    # Debezium's placeholder for an unchanged TOASTed value: the stored value stays, or one set earlier in the batch.
    land(
        spark, mirror, 2, [change("u", 1, 30, PLACEHOLDER), change("c", 3, 31, "set"), change("u", 3, 32, PLACEHOLDER)]
    )
    assert {k: r["Name"] for k, r in table(spark, mirror).items()} == {1: "c", 3: "set"}


def test_history_keeps_every_version_in_order_whatever_the_arrival(
    spark: Any, lake: Pipeline, postgres_dsn: str
) -> None:
    history = sink(lake, "hist", postgres_dsn)
    land(spark, history, 0, [change("c", 1, 10, "a"), change("u", 1, 30, "c"), change("c", 2, 5, "x")])
    land(spark, history, 1, [change("u", 1, 20, "b"), change("d", 2, 40)])  # 20 arrives after 30
    land(spark, history, 2, [change("d", 1, 50), change("c", 2, 60, "again")])

    rows = spark.read.format("delta").load(history.location["path"]).orderBy("id", "_cdc_version").collect()
    chains: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        chains.setdefault(row["id"], []).append(
            (int(row["_cdc_version"]), row["_cdc_op"], row["Name"], row["_valid_to"], row["_is_current"])
        )
    at = {v: (T0 + dt.timedelta(seconds=v)).replace(tzinfo=None) for v in (20, 30, 40, 50, 60)}
    assert chains[1] == [
        (10, "c", "a", at[20], False),
        (20, "u", "b", at[30], False),
        (30, "u", "c", at[50], False),
        (50, "d", None, None, False),  # deleted: no current row
    ]
    assert chains[2] == [(5, "c", "x", at[40], False), (40, "d", None, at[60], False), (60, "c", "again", None, True)]
    assert all(row["_valid_from"] == row["_cdc_ts"] for row in rows)

    # Batch 1 again under another checkpoint: no change, the versions are already there.
    land(spark, history, 1, [change("u", 1, 20, "b"), change("d", 2, 40)], checkpoint="reset")
    assert spark.read.format("delta").load(history.location["path"]).orderBy("id", "_cdc_version").collect() == rows


def test_the_start_check_names_a_missing_table_and_column(spark: Any, postgres_dsn: str, tmp_path: Path) -> None:
    pipeline = definition(tmp_path)
    mirror = sink(pipeline, "soft", postgres_dsn)
    with pytest.raises(MigrationError, match="cannot be read") as raised:
        mirror.check_table(spark)
    assert "cdcsync migrate" in (raised.value.hint or "")
    # A table made outside the migrations, without the pipeline's columns.
    spark.range(1).withColumnRenamed("id", "other").write.format("delta").save(mirror.location["path"])
    with pytest.raises(MigrationError) as raised:
        mirror.check_table(spark)
    assert f"sink 'soft': Delta table delta.`{mirror.location['path']}` does not match the pipeline" in str(
        raised.value
    )
    assert "it has no column Name (the pipeline needs string)" in str(raised.value)


def test_every_placeholder_kind_keeps_the_stored_value(spark: Any, postgres_dsn: str, tmp_path: Path) -> None:
    """Each form Debezium sends for an unchanged TOASTed value (cdcsync.config.toast), as the decoders hand it on:
    the MERGE keeps the stored value, and an older value of the same batch is carried (docs/types.md)."""
    from cdcsync.config.toast import PLACEHOLDER_BY_KIND

    kinds = {
        "body": ("text", "text"),
        "blob": ("bytea", "bytea"),
        "doc": ("jsonb", "jsonb"),
        "raw": ("json", "json"),
        "pairs": ("hstore", "hstore"),
        "tags": ("text[]", "text[]"),
        "docs": ("jsonb[]", "json[]"),
        "blobs": ("bytea[]", "bytea[]"),
        "ints": ("integer[]", "integer[]"),
        "nums": ("bigint[]", "integer[]"),
        "days": ("date[]", "date[]"),
        "uids": ("uuid[]", "uuid[]"),
    }
    columns = {"id": "bigint", "amount": "numeric(12,2)", **{name: pg for name, (pg, _) in kinds.items()}}
    source = {"type": "kafka", "topic": "t.docs", "primary_key": "id", "columns": columns}
    sinks = {"m": {"type": "delta", "from": "docs", "path": str(tmp_path / "docs")}}
    pipeline = validate_pipeline_dict({"name": "toasty", "sources": {"docs": source}, "sinks": sinks})
    for target in (POSTGRES, DELTA):
        migrations.init(target, pipeline, tmp_path / "migrations")
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, tmp_path / "migrations")
        migrations.apply_pending(DELTA, DeltaConnection(conn, spark), pipeline.name, tmp_path / "migrations")
    mirror = sink(pipeline, "m", postgres_dsn)
    schema = ", ".join(
        [
            "id bigint, amount decimal(12,2), body string, blob binary, doc string, raw string, pairs string",
            "tags array<string>, docs array<string>, blobs array<binary>, ints array<int>, nums array<bigint>",
            "days array<date>, uids array<string>, _cdc_op string, _cdc_version decimal(38,0), _cdc_ts timestamp",
        ]
    )

    def full(n: int) -> dict[str, Any]:
        return {
            "body": f"body {n} " * 300,
            "blob": bytes([n, 0, 255]) * 1000,
            "doc": f'{{"n": {n}}}',
            "raw": f'{{"raw": {n}}}',
            "pairs": f'"k"=>"{n}"',
            "tags": [f"t{n}", None],
            "docs": [f'{{"d": {n}}}'],
            "blobs": [bytes([n])],
            "ints": [n, -n],
            "nums": [n * 10**12],
            "days": [dt.date(2024, 2, 29), dt.date(1, 1, 1)],
            "uids": ["0b6a2b52-46bc-4f34-a2d1-3c1a6f0f3c11"],
        }

    unchanged = {name: PLACEHOLDER_BY_KIND[kind] for name, (_, kind) in kinds.items()}
    unchanged = {name: list(value) if isinstance(value, tuple) else value for name, value in unchanged.items()}

    def row(op: str, key: int, version: int, values: dict[str, Any], amount: str = "1.00") -> dict[str, Any]:
        return {"id": key, "amount": Decimal(amount), **values, "_cdc_op": op, "_cdc_version": Decimal(version)} | {
            "_cdc_ts": T0 + dt.timedelta(seconds=version)
        }

    def land_rows(batch_id: int, rows: list[dict[str, Any]]) -> None:
        key = mirror.ledger_key(batch_id, "cp")
        assert mirror.prepare(key)
        mirror.merge_changes(key, spark.createDataFrame(rows, schema))

    land_rows(0, [row("c", 1, 10, full(1)), row("c", 2, 11, full(2))])
    # Key 1: every large value unchanged, another column set. Key 2: set in the batch, then unchanged.
    land_rows(1, [row("u", 1, 20, unchanged, "2.00"), row("u", 2, 21, full(3)), row("u", 2, 22, unchanged, "3.00")])
    stored = table(spark, mirror)
    for key, values, amount in ((1, full(1), "2.00"), (2, full(3), "3.00")):
        got = {name: stored[key][name] for name in kinds}
        got = {name: bytes(v) if isinstance(v, bytearray) else v for name, v in got.items()}
        got["blobs"] = [bytes(b) for b in got["blobs"]]
        assert got == values, key
        assert stored[key]["amount"] == Decimal(amount)


def test_a_snapshot_below_the_merged_positions_stops_the_run(spark: Any, lake: Pipeline, postgres_dsn: str) -> None:
    """As for Postgres sinks (docs/operations.md#a-source-that-went-back): the Delta sink keeps its high-water
    mark in cdcsync.source_positions; reads of the snapshot already seen never stop the run."""
    from cdcsync.core.errors import SourceWentBack

    def position(commit: int, lsn: int) -> int:
        return (commit << 64) + lsn

    mirror = sink(lake, "hard", postgres_dsn)
    snapshot = 0x16_0000_0000
    land(
        spark,
        mirror,
        0,
        [
            change("r", 1, snapshot, "read", seconds=1),
            change("c", 2, position(0x16_B374_D848, 0x16_B374_D900), seconds=1),
        ],
    )
    land(spark, mirror, 1, [change("r", 3, snapshot, "read of the same snapshot, later", seconds=1)])
    land(spark, mirror, 2, [change("r", 4, 0x17_0000_0000, "a re-snapshot of the same source", seconds=1)])
    with pytest.raises(SourceWentBack) as went_back:
        land(spark, mirror, 3, [change("r", 5, 0x3_0000_0000, "restored source", seconds=1)])
    assert "topic 'shop.orders'" in str(went_back.value) and "3/0" in str(went_back.value)
    assert "16/B374D848" in str(went_back.value)
    assert set(table(spark, mirror)) == {1, 2, 3, 4}
    assert land(spark, mirror, 3, [change("c", 6, position(0x17_0000_0100, 0x17_0000_0200), seconds=1)]) is not None
    assert set(table(spark, mirror)) == {1, 2, 3, 4, 6}
