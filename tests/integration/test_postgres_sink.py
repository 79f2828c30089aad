"""The upsert sink's SQL against a real Postgres, without Spark: stage Arrow batches the way executors do,
merge them the way the driver does, and check versioning, deletes, tombstones, the ledger and value fidelity."""

from __future__ import annotations

import json
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
from cdcsync.core.errors import CheckpointAheadError
from cdcsync.migrations import POSTGRES
from cdcsync.sinks.postgres import PostgresUpsertSink
from tests.unit.test_templates import percent_pipeline

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("Name", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("blob", pa.binary()),
        ("_cdc_op", pa.string()),
        ("_cdc_version", pa.decimal128(38, 0)),
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
    version: int | None,
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


def test_lone_tombstones_delete_what_the_target_holds_and_rank_just_above_it(sink: PostgresUpsertSink) -> None:
    """A compacted topic keeps a delete's tombstone (null version) and not the delete: it must still delete, rank
    above the stored row (an older change replayed later must not bring it back), and below a later re-insert."""
    schema = SCHEMA.append(pa.field("_cdc_offset", pa.int64()))

    def at(offset: int, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "_cdc_offset": offset}

    def stage(batch_id: int, rows: list[dict[str, Any]]) -> None:
        key = sink.ledger_key(batch_id, "cp")
        assert sink.prepare(key)
        staged = sink.stage_writer(batch_id).stage(pa.Table.from_pylist(rows, schema=schema))
        sink.merge(key, staged)

    def tombstone(key: int) -> dict[str, Any]:
        return change("d", key, None, None, None)

    stage(0, [at(1, change("c", 1, 10, "a")), at(2, change("c", 2, 11, "b")), at(3, change("c", 3, 12, "c"))])
    stage(
        1,
        [
            at(10, tombstone(1)),  # lone: the delete is gone
            at(11, tombstone(9)),  # a key never stored
            at(12, tombstone(2)),
            at(13, change("c", 2, 30, "again")),  # re-inserted after the tombstone
            at(14, change("u", 3, 20, "c2")),
            at(15, tombstone(3)),  # ranks with the update
        ],
    )
    rows = live(sink)
    assert set(rows) == {2} and (rows[2]["Name"], rows[2]["_cdc_version"]) == ("again", 30)
    stage(2, [at(20, change("u", 1, 10, "stale")), at(21, change("u", 3, 20, "stale"))])  # replays of older changes
    assert set(live(sink)) == {2}
    stage(3, [at(30, change("c", 1, 40, "back"))])
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


def position(commit: int, lsn: int) -> int:
    """A Debezium version: (last commit LSN, LSN) packed as the decoder packs it."""
    return (commit << 64) + lsn


def test_a_later_snapshot_repairs_after_deletes_and_a_truncate(sink: PostgresUpsertSink) -> None:
    """Snapshot reads that know their commit position (blocking snapshot (L, 0), incremental reads at their own
    position) overwrite a stale row and re-create a deleted one, also above a truncate watermark; one that does not
    (0, S) fills in only, below every streamed change."""
    land(sink, 0, [change("r", 1, 5000, "initial"), change("u", 1, position(4900, 4990), "streamed")])
    assert live(sink)[1]["Name"] == "streamed"  # the first change after the snapshot wins (it began before S)
    land(sink, 1, [truncate(position(6000, 6010)), change("c", 2, position(6100, 6110), "x")])
    land(sink, 2, [change("d", 2, position(6200, 6210), None, None)])
    land(sink, 3, [change("r", 2, position(7000, 0), "blocking read"), change("r", 3, position(7000, 7050), "chunk")])
    assert {key: row["Name"] for key, row in live(sink).items()} == {2: "blocking read", 3: "chunk"}
    land(sink, 4, [change("u", 3, position(7100, 7020), "streamed after")])
    assert live(sink)[3]["Name"] == "streamed after"


def test_a_snapshot_below_the_merged_positions_stops_the_run(sink: PostgresUpsertSink) -> None:
    from cdcsync.core.errors import SourceWentBack

    land(sink, 0, [change("c", 1, position(0x16_B374_D848, 0x16_B374_D900), "old source")])
    land(sink, 1, [change("r", 2, 0x17_0000_0000, "a re-snapshot of the same source")])  # above: fine
    with pytest.raises(SourceWentBack) as went_back:
        land(sink, 2, [change("r", 3, 0x3_0000_0000, "restored source")])
    message = str(went_back.value)
    assert "topic 't'" in message and "3/0" in message and "16/B374D848" in message
    assert went_back.value.hint is not None and "source_positions" in went_back.value.hint
    assert set(live(sink)) == {1, 2}  # nothing of the refused batch landed, and it is not in the ledger
    assert land(sink, 2, [change("c", 4, position(0x17_0000_0100, 0x17_0000_0200), "retried")]) is not None


def test_reads_of_the_snapshot_already_merged_never_stop_the_run(sink: PostgresUpsertSink) -> None:
    """Several partitions: one partition's streamed changes can be merged before another's reads of the same
    snapshot are read. Those reads lie below the mark, yet they are no sign of a source that went back."""
    snapshot = 0x16_0000_0000
    land(sink, 0, [change("r", 1, snapshot, "read in partition 0")])
    land(sink, 1, [change("u", 1, position(snapshot + 0x100, snapshot + 0x80), "streamed in partition 0")])
    assert land(sink, 2, [change("r", 2, snapshot, "read in partition 1, later")]) is not None
    assert {key: row["Name"] for key, row in live(sink).items()} == {
        1: "streamed in partition 0",
        2: "read in partition 1, later",
    }


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


def test_a_primary_key_change_carries_the_old_keys_unchanged_toasted_values(sink: PostgresUpsertSink) -> None:
    """Debezium sends a key change as a delete of the old key and a create of the new one at the same source
    position; the create carries the placeholder for untouched large values, which are the old key's."""
    big = "x" * 5000
    land(sink, 0, [change("c", 1, 10, big, blob=b"\x00" * 3000), change("c", 2, 11, "two")])
    # Old and new key in different partitions (tasks) of one batch; the new key is updated again in the batch
    # with its large value still untouched, so the create is not the change that lands.
    moved = change("c", 5, 20, PLACEHOLDER, blob=PLACEHOLDER.encode())
    land(
        sink,
        1,
        [change("d", 1, 20, None, None)],
        [moved, change("u", 5, 21, PLACEHOLDER, "7.00", blob=PLACEHOLDER.encode())],
    )
    rows = live(sink)
    assert set(rows) == {2, 5}
    assert (rows[5]["Name"], bytes(rows[5]["blob"]), rows[5]["amount"]) == (big, b"\x00" * 3000, Decimal("7.00"))
    # The old key inserted in the same batch, in another partition (task) than its move: its values are staged.
    land(
        sink, 2, [change("c", 3, 25, "three" * 900), change("d", 3, 26, None, None)], [change("c", 4, 26, PLACEHOLDER)]
    )
    assert live(sink)[4]["Name"] == "three" * 900 and 3 not in live(sink)
    # A create holding a placeholder whose old key is unknown (no delete at its version) keeps it, as before.
    land(sink, 3, [change("c", 6, 30, PLACEHOLDER)])
    assert live(sink)[6]["Name"] == PLACEHOLDER


def key_moves(sink: PostgresUpsertSink) -> list[tuple[Any, ...]]:
    with psycopg.connect(sink.dsn) as conn:
        return conn.execute(
            'SELECT "key", "_cdc_version" FROM cdcsync.key_moves WHERE "sink" = %s ORDER BY 1', (sink.sink_id,)
        ).fetchall()


def test_a_batch_runs_only_the_parts_of_the_merge_it_needs(sink: PostgresUpsertSink) -> None:
    """The key moves' statements run for a batch with a key-move row or a create holding a placeholder, or while
    values of earlier moves are stashed; the truncate's for a batch with a truncate, or once a watermark exists
    (``stage_count.sql.j2``). Every other batch skips them, and lands the same."""

    def parts_needed(batch_id: int, rows: list[dict[str, Any]]) -> set[str]:
        key = sink.ledger_key(batch_id, "cp")
        assert sink.prepare(key)
        staged = sink.stage_writer(batch_id).stage(pa.Table.from_pylist(rows, schema=SCHEMA))
        with psycopg.connect(sink.dsn) as conn:
            found, parts = sink._census(conn, batch_id)
        assert found == staged
        assert sink.merge(key, staged) is not None
        return parts

    assert parts_needed(0, [change("c", 1, 10, "a" * 3000), change("c", 2, 11, "b")]) == set()
    assert parts_needed(1, [change("u", 1, 12, PLACEHOLDER, "2.00")]) == set()  # an unchanged large value
    assert live(sink)[1]["Name"] == "a" * 3000
    assert parts_needed(2, [change("d", 2, 20, None, None), change("n", 4, 20, None, None)]) == {"key_moves"}
    assert key_moves(sink) == [({"id": "4"}, Decimal(20))]  # 2 moved to 4, whose create is still to come
    assert parts_needed(3, [change("u", 1, 21, "c")]) == {"key_moves"}  # while the values wait
    assert parts_needed(4, [change("c", 4, 20, PLACEHOLDER)]) == {"key_moves"}
    assert live(sink)[4]["Name"] == "b" and key_moves(sink) == []
    assert parts_needed(5, [change("c", 5, 22, PLACEHOLDER)]) == {"key_moves"}  # a move whose delete comes later
    assert parts_needed(6, [change("u", 1, 23, "d")]) == set()
    assert parts_needed(7, [truncate(30)]) == {"truncate"}
    assert parts_needed(8, [change("u", 1, 25, "older"), change("c", 6, 40, "e")]) == {"truncate"}  # the watermark
    assert {key: row["Name"] for key, row in live(sink).items()} == {6: "e"}


def test_a_primary_key_change_over_two_batches_in_either_order(sink: PostgresUpsertSink) -> None:
    """The delete of the old key (with its key-move row: the new key, from Debezium's ``__debezium.newkey``
    header) and the create of the new key land in different batches, in either order."""
    land(sink, 0, [change("c", 1, 10, "w" * 4000, blob=b"\x00" * 3000), change("c", 2, 11, "v" * 3000)])
    # Delete first: 1 changes its large value, then moves to 5; the create of 5 comes a batch later.
    land(
        sink,
        1,
        [change("u", 1, 15, "z" * 4000, blob=PLACEHOLDER.encode()), change("d", 1, 20, None, None)],
        [change("n", 5, 20, None, None)],  # the key-move row, read with its delete (another task here: no matter)
    )
    assert key_moves(sink) == [({"id": "5"}, Decimal(20))] and 5 not in target(sink)
    land(sink, 2, [change("d", 3, 18, None, None)])
    land(sink, 3, [change("c", 5, 20, PLACEHOLDER, "4.00", blob=PLACEHOLDER.encode())])
    row = live(sink)[5]
    assert (row["Name"], bytes(row["blob"]), row["amount"]) == ("z" * 4000, b"\x00" * 3000, Decimal("4.00"))
    assert key_moves(sink) == [] and 1 not in live(sink)
    # Create first: 2 moves to 6, whose create (another partition) lands before the delete of 2, and 6 changes
    # again; the large value of 2 changed just before the move, in the lagging partition.
    land(sink, 4, [change("c", 6, 30, PLACEHOLDER)])
    land(sink, 5, [change("u", 6, 31, PLACEHOLDER, "9.00")])
    assert live(sink)[6]["Name"] == PLACEHOLDER  # not known yet: the stored row of 2 is older than the move
    land(sink, 6, [change("u", 2, 25, "q" * 3000), change("d", 2, 30, None, None), change("n", 6, 30, None, None)])
    assert (live(sink)[6]["Name"], live(sink)[6]["amount"]) == ("q" * 3000, Decimal("9.00"))
    assert set(live(sink)) == {5, 6} and key_moves(sink) == []
    # A value the new key set since the move is its own: the delete, merged later, leaves it.
    land(sink, 7, [change("c", 7, 40, PLACEHOLDER), change("u", 7, 41, "own")])
    land(sink, 8, [change("d", 6, 40, None, None), change("n", 7, 40, None, None)])
    assert live(sink)[7]["Name"] == "own" and set(live(sink)) == {5, 7} and key_moves(sink) == []


def test_a_chain_of_primary_key_changes_in_the_orders_that_lost_the_values(sink: PostgresUpsertSink) -> None:
    """Two key changes in a row (7 -> 21 -> 31) that leave the large values alone: 21 is the new key of one move
    and the old key of the next, so its values may be known only after it moved on. Three orders, each once
    lost the values (the Debezium TOAST test, about one run in four): the first delete comes last (21 landed
    holding placeholders and moved on); the create and the delete of 21 in one batch after the first delete
    (its values waited in the stash); and both deletes in one batch after the create of 21 landed."""
    values = {7: ("a" * 4000, b"\x07" * 3000), 107: ("b" * 4000, b"\x08" * 3000), 207: ("c" * 4000, b"\x09" * 3000)}
    land(sink, 0, *([change("c", k, k + 3, name, blob=blob)] for k, (name, blob) in values.items()))

    def moved(key: int, version: int) -> dict[str, Any]:
        return change("c", key, version, PLACEHOLDER, blob=PLACEHOLDER.encode())

    def away(old: int, new: int, version: int) -> list[dict[str, Any]]:
        return [change("d", old, version, None, None), change("n", new, version, None, None)]

    land(sink, 1, [moved(21, 20)], away(107, 121, 120), [moved(221, 220)])
    land(
        sink,
        2,
        away(21, 31, 30),
        [moved(121, 120), *away(121, 131, 130)],
        away(207, 221, 220),
        away(221, 231, 230),
    )
    land(sink, 3, away(7, 21, 20), [moved(31, 30)], [moved(131, 130)], [moved(231, 230)])
    rows = live(sink)
    assert set(rows) == {31, 131, 231}
    for old, new in ((7, 31), (107, 131), (207, 231)):
        assert (rows[new]["Name"], bytes(rows[new]["blob"])) == values[old], f"{old} -> {new}"
    assert key_moves(sink) == []


def test_a_primary_key_change_split_over_two_batches_in_soft_mode(postgres_dsn: str, tmp_path: Path) -> None:
    """The delete of the old key landed in an earlier batch: the soft-deleted row still holds its values."""
    sink = make_sink("soft", postgres_dsn, tmp_path)
    land(sink, 0, [change("c", 1, 10, "y" * 4000)])
    land(sink, 1, [change("d", 1, 20, None, None)])
    land(sink, 2, [change("c", 9, 20, PLACEHOLDER)])
    assert live(sink)[9]["Name"] == "y" * 4000


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


def test_a_crashed_attempt_s_stage_is_emptied_and_an_empty_one_is_left_alone(sink: PostgresUpsertSink) -> None:
    def stage_file() -> tuple[int, int]:
        with psycopg.connect(sink.dsn) as conn:
            stage = 'cdcsync."sinktest__m__stage"'
            row = conn.execute(f"SELECT pg_relation_filenode('{stage}'), count(*) FROM {stage}").fetchone()
        assert row is not None
        return row[0], row[1]

    rows = pa.Table.from_pylist([change("c", 1, 10), change("c", 2, 10)], schema=SCHEMA)
    key = sink.ledger_key(0, "cp")
    empty = stage_file()
    assert sink.prepare(key) and stage_file() == empty  # nothing to remove: no TRUNCATE (new files, a sync)
    assert sink.stage_writer(0).stage(rows) == 2  # the attempt's tasks staged, then it failed before the merge
    assert stage_file()[1] == 2
    assert sink.prepare(key) and stage_file()[1] == 0  # the next attempt starts from an empty stage
    assert sink.merge(key, sink.stage_writer(0).stage(rows)) == 2
    assert set(live(sink)) == {1, 2}


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
        ("_cdc_version", pa.decimal128(38, 0)),
        ("_cdc_ts", pa.timestamp("us", tz="UTC")),
    ]
)


def typed_sink(dsn: str, migrations_dir: Path) -> PostgresUpsertSink:
    definition = validate_pipeline_dict(
        {
            "name": "typedtest",
            "sources": {
                "s": {
                    "type": "kafka",
                    "topic": "t",
                    "primary_key": "id",
                    "columns": TYPED_COLUMNS,
                    "untoasted_columns": ["prices", "stamps"],  # arrays Debezium has no TOAST placeholder for
                }
            },
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


def test_hstore_lands_and_keeps_its_stored_value_for_the_placeholder(postgres_dsn: str, tmp_path: Path) -> None:
    """The decoder's hstore text is what Postgres reads on COPY; the placeholder (the one pair placeholder =>
    placeholder, in both of Debezium's hstore modes) keeps the stored value."""
    from cdcsync.config.toast import PLACEHOLDER_BY_KIND
    from cdcsync.config.types import hstore_text

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS hstore")  # the target database needs the type
    definition = validate_pipeline_dict(
        {
            "name": "hstoretest",
            "sources": {
                "s": {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint", "h": "hstore"}}
            },
            "sinks": {"m": {"type": "postgres", "from": "s", "schema": "app", "table": "h"}},
        }
    )
    migrations.init(POSTGRES, definition, tmp_path)
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, definition.name, tmp_path)
    sink = PostgresUpsertSink(definition, "m", definition.sinks["m"], postgres_dsn)
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("h", pa.string()),
            ("_cdc_op", pa.string()),
            ("_cdc_version", pa.int64()),
            ("_cdc_ts", pa.timestamp("us", tz="UTC")),
        ]
    )
    pairs = {"a": "1", 'quote"d': "back\\slash, comma", "n": None, "big": "z" * 5000}

    def stage(batch_id: int, version: int, value: str) -> None:
        key = sink.ledger_key(batch_id, "cp")
        assert sink.prepare(key)
        row = {"id": 1, "h": value, "_cdc_op": "u", "_cdc_version": version, "_cdc_ts": T0}
        staged = sink.stage_writer(batch_id).stage(pa.Table.from_pylist([row], schema=schema))
        sink.merge(key, staged)

    def stored() -> dict[str, str | None]:
        with psycopg.connect(postgres_dsn) as conn:
            row = conn.execute("SELECT hstore_to_json(h)::text FROM app.h WHERE id = 1").fetchone()
        assert row is not None
        return json.loads(row[0])

    stage(0, 10, hstore_text(pairs))
    assert stored() == pairs
    stage(1, 20, str(PLACEHOLDER_BY_KIND["hstore"]))
    assert stored() == pairs


def test_backfilled_rows_rank_below_every_streamed_change(sink: PostgresUpsertSink) -> None:
    """A bounded phase's rows (op c, version (0, phase): cdcsync.config.bounded.phase_version) that arrive after
    streamed changes of their keys change nothing: not a newer row, not a deleted key, not a truncated table, not
    a Debezium snapshot read; they fill in keys nothing streamed, and a later phase outranks an earlier one. They
    are no snapshot reads, so they never stop the run as a source that went back."""
    from cdcsync.config.bounded import phase_version

    first, second = phase_version(1), phase_version(2)
    land(sink, 0, [change("c", 1, position(5000, 5010), "streamed"), change("r", 2, 4000, "debezium snapshot")])
    land(sink, 1, [change("c", 3, position(5100, 5110), "x"), change("d", 3, position(5200, 5210), None, None)])
    land(sink, 2, [change(op, key, first, "backfill") for op, key in (("c", 1), ("c", 2), ("c", 3), ("c", 4))])
    assert {key: row["Name"] for key, row in live(sink).items()} == {
        1: "streamed",
        2: "debezium snapshot",
        4: "backfill",
    }
    land(sink, 3, [change("c", 4, second, "phase 2"), change("c", 5, first, "phase 1")])
    land(sink, 4, [change("c", 5, first, "phase 1 again"), change("c", 4, first, "phase 1 late")])
    assert {key: live(sink)[key]["Name"] for key in (4, 5)} == {4: "phase 2", 5: "phase 1"}
    land(sink, 5, [truncate(position(6000, 6010))])
    land(sink, 6, [change("c", 6, first, "backfill after the truncate")])
    assert live(sink) == {}


def test_a_batch_stages_while_the_one_before_merges(sink: PostgresUpsertSink) -> None:
    """``run.overlap_merges``: batch 1 is prepared and staged while batch 0 is staged, not yet merged; neither
    wipes the other's rows from the shared stage, each merge removes only its own, and the ledger's check for a
    lost previous batch waits for the one still merging."""
    key0, key1 = sink.ledger_key(0, "cp"), sink.ledger_key(1, "cp")
    assert sink.prepare(key0)
    staged0 = sink.stage_writer(0).stage(pa.Table.from_pylist([change("c", 1, 10, "a")], schema=SCHEMA))
    # a crashed attempt of batch 1 left a row: preparing batch 1 removes it, and keeps batch 0's
    sink.stage_writer(1).stage(pa.Table.from_pylist([change("c", 9, 5, "crashed")], schema=SCHEMA))
    assert sink.prepare(key1, keep=(0,))
    staged1 = sink.stage_writer(1).stage(
        pa.Table.from_pylist([change("u", 1, 20, "b"), change("c", 2, 15)], schema=SCHEMA)
    )
    assert sink.merge(key0, staged0, shared_stage=True) == 1
    assert live(sink)[1]["Name"] == "a" and set(live(sink)) == {1}
    assert sink.merge(key1, staged1, shared_stage=True) == 2
    assert live(sink)[1]["Name"] == "b" and set(live(sink)) == {1, 2}
    with psycopg.connect(sink.dsn) as conn:
        stage = sink._delete_batch_sql.split("FROM ")[1].split(" WHERE")[0]
        assert conn.execute(f"SELECT count(*) FROM {stage}").fetchone() == (0,)


def test_a_merge_pairs_key_moves_of_its_own_batch_only(sink: PostgresUpsertSink) -> None:
    """While batch 1 merges, batch 2 (staged meanwhile) holds a primary-key change of key 1, whose values were
    changed in batch 1: batch 1's merge must leave that move to batch 2, whose merge carries the new values."""
    land(sink, 0, [change("c", 1, 10, "w" * 4000)])
    key1, key2 = sink.ledger_key(1, "cp"), sink.ledger_key(2, "cp")
    assert sink.prepare(key1)
    staged1 = sink.stage_writer(1).stage(pa.Table.from_pylist([change("u", 1, 15, "z" * 4000)], schema=SCHEMA))
    assert sink.prepare(key2, keep=(1,))
    moves = [change("d", 1, 20, None, None), change("n", 5, 20, None, None)]
    staged2 = sink.stage_writer(2).stage(pa.Table.from_pylist(moves, schema=SCHEMA))
    assert sink.merge(key1, staged1, shared_stage=True) == 1
    assert key_moves(sink) == [] and live(sink)[1]["Name"] == "z" * 4000
    assert sink.merge(key2, staged2, shared_stage=True) is not None
    assert key_moves(sink) == [({"id": "5"}, Decimal(20))] and 1 not in live(sink)
    land(sink, 3, [change("c", 5, 20, PLACEHOLDER)])
    assert live(sink)[5]["Name"] == "z" * 4000 and key_moves(sink) == []


def test_a_lost_previous_batch_is_still_found_while_another_merges(sink: PostgresUpsertSink) -> None:
    """Batch 3 prepared while batch 2 merges: the ledger need not have 2 yet, but it must have 1."""
    for batch_id in (0, 1):
        land(sink, batch_id, [change("c", batch_id + 1, 10)])
    assert sink.prepare(sink.ledger_key(3, "cp"), keep=(2,))
    with psycopg.connect(sink.dsn) as conn:  # the target went back in time: it lost batch 1
        conn.execute("DELETE FROM cdcsync.batch_ledger WHERE sink = %s AND batch_id = 1", (sink.sink_id,))
    with pytest.raises(CheckpointAheadError, match="lacks batch 1"):
        sink.prepare(sink.ledger_key(3, "cp"), keep=(2,))


PERCENT_NAMES = {"id": "id%", "Name": "note%s", "amount": "discount_%", "blob": "blob%(x)s"}
"""The test's columns renamed: names holding '%', which psycopg reads as a placeholder in statements run with
parameters (the collapse, the key moves, the position checks...) unless the templates write it as '%%'."""
_SPELLS_PLACEHOLDER = "at%(batch_id)s"


@pytest.mark.parametrize("delete_mode", ["hard", "soft"])
def test_names_holding_percent_signs(postgres_dsn: str, tmp_path: Path, delete_mode: str) -> None:
    """Schema, table, columns and sink id with '%' in them: the sink migrates, stages and merges (versions, deletes,
    unchanged TOASTed values, primary-key changes within a batch and over two, a truncate, overlapped merges)."""
    definition = percent_pipeline(delete_mode)
    migrations.init(POSTGRES, definition, tmp_path)
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, definition.name, tmp_path)
    sink = PostgresUpsertSink(definition, "m%", definition.sinks["m%"], postgres_dsn)
    renamed = [PERCENT_NAMES.get(name, name) for name in SCHEMA.names]

    def stage(batch_id: int, *partitions: list[dict[str, Any]], keep: tuple[int, ...] = ()) -> tuple[Any, int]:
        key = sink.ledger_key(batch_id, "cp")
        assert sink.prepare(key, keep)
        writer = sink.stage_writer(batch_id)
        tables = (pa.Table.from_pylist(rows, schema=SCHEMA).rename_columns(renamed) for rows in partitions)
        # A column whose name spells the merge's own placeholder, holding what "note%s" holds.
        return key, sum(writer.stage(table.append_column(_SPELLS_PLACEHOLDER, table["note%s"])) for table in tables)

    def rows() -> dict[int, tuple[Any, ...]]:
        with psycopg.connect(postgres_dsn) as conn:
            found = conn.execute(
                'SELECT "id%", "note%s", "discount_%", "blob%(x)s", "_cdc_version", "at%(batch_id)s" '
                'FROM "My App%"."sel%ect"' + (' WHERE NOT "_cdc_deleted"' if delete_mode == "soft" else "")
            ).fetchall()
        assert all(row[5] == row[1] for row in found), found
        return {row[0]: (row[1], row[2], None if row[3] is None else bytes(row[3]), row[4]) for row in found}

    big = "x" * 5000
    assert sink.merge(*stage(0, [change("c", 1, 10, big, blob=b"\x00" * 3000), change("c", 2, 11, "two")])) == 2
    assert sink.merge(
        *stage(
            1,
            [change("u", 1, 20, PLACEHOLDER, "2.00", blob=PLACEHOLDER.encode()), change("d", 2, 21, None, None)],
            [change("u", 1, 5, "stale"), change("c", 3, 22, "three" * 900, blob=b"\x03")],
        )
    )
    assert rows() == {1: (big, Decimal("2.00"), b"\x00" * 3000, 20), 3: ("three" * 900, Decimal("1.00"), b"\x03", 22)}
    # A primary-key change of 3 to 5 within a batch (delete and create in two tasks), one of 1 to 6 over two
    # batches (the delete with its key-move row first), the second batch staged while the first merges.
    key, staged = stage(
        2,
        [change("d", 3, 30, None, None), change("d", 1, 31, None, None), change("n", 6, 31, None, None)],
        [change("c", 5, 30, PLACEHOLDER, blob=PLACEHOLDER.encode())],
    )
    next_key, next_staged = stage(3, [change("c", 6, 31, PLACEHOLDER, "6.00", blob=PLACEHOLDER.encode())], keep=(2,))
    assert sink.merge(key, staged, shared_stage=True) is not None
    assert sink.merge(next_key, next_staged, shared_stage=True) is not None
    assert rows() == {
        5: ("three" * 900, Decimal("1.00"), b"\x03", 30),
        6: (big, Decimal("6.00"), b"\x00" * 3000, 31),
    }
    assert sink.merge(*stage(4, [change("u", 5, 40, "five"), truncate(45), change("c", 7, 50, "after")])) is not None
    assert rows() == {7: ("after", Decimal("1.00"), None, 50)}
