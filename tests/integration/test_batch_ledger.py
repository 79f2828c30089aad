"""The batch ledger against a real Postgres, without Spark: what a batch read is recorded with it, a batch id is
skipped only when it reads the same offsets, and a checkpoint past the ledger is noticed and rewound.

The checkpoints here are written the way Spark writes them (``metadata``, ``sources/0/0``, ``offsets/N``,
``commits/N`` with Hadoop's ``.N.crc`` files beside them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.settings import load_settings
from cdcsync.core.errors import CheckpointAheadError
from cdcsync.db.ledger import OffsetRanges
from cdcsync.runtime.checkpoint import batch_offsets, check_ledger, end_offsets, rewind_to_ledger
from cdcsync.sinks.postgres import PostgresUpsertSink
from tests.integration.test_postgres_sink import SCHEMA, change, make_sink, target


def ranges(start: int, end: int) -> OffsetRanges:
    return {"t": {"0": [start, end]}}


def land(sink: PostgresUpsertSink, batch_id: int, offsets: OffsetRanges, rows: list[dict[str, Any]]) -> int | None:
    key = sink.ledger_key(batch_id, "cp", offsets)
    if not sink.prepare(key):
        return None
    staged = sink.stage_writer(batch_id).stage(pa.Table.from_pylist(rows, schema=SCHEMA))
    return sink.merge(key, staged)


def ledger(dsn: str) -> list[tuple[str, int, Any]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT sink, batch_id, offsets FROM cdcsync.batch_ledger ORDER BY sink, batch_id"
        ).fetchall()


def test_a_batch_id_is_skipped_only_when_it_reads_the_same_offsets(postgres_dsn: str, tmp_path: Path) -> None:
    sink = make_sink("hard", postgres_dsn, tmp_path)
    assert land(sink, 0, ranges(0, 2), [change("c", 1, 10, name="a"), change("c", 2, 11, name="b")]) == 2
    assert land(sink, 0, ranges(0, 2), [change("c", 1, 10, name="a"), change("c", 2, 11, name="b")]) is None

    # The same batch id re-planned over more offsets (a checkpoint edited by hand, a rewind): applied again, the
    # changes it shares with the ledgered batch idempotently, and its ledger row takes the new ranges.
    replanned = [change("c", 1, 10, name="a"), change("c", 2, 11, name="b"), change("c", 3, 12, name="c")]
    assert land(sink, 0, ranges(0, 3), replanned) == 1
    assert {key: row["Name"] for key, row in target(sink).items()} == {1: "a", 2: "b", 3: "c"}
    assert ledger(postgres_dsn) == [("m", 0, ranges(0, 3))]
    assert land(sink, 0, ranges(0, 3), replanned) is None


def test_a_ledger_that_lost_the_previous_batch_stops_the_batch(postgres_dsn: str, tmp_path: Path) -> None:
    sink = make_sink("soft", postgres_dsn, tmp_path)
    for batch_id in range(3):
        land(sink, batch_id, ranges(batch_id, batch_id + 1), [change("c", batch_id, 10 + batch_id)])
    with psycopg.connect(postgres_dsn) as conn:  # a failover to a replica that had not received batches 1 and 2
        conn.execute("DELETE FROM cdcsync.batch_ledger WHERE batch_id > 0")
    with pytest.raises(CheckpointAheadError) as behind:
        land(sink, 3, ranges(3, 4), [change("c", 3, 13)])
    assert "sink 'm': the ledger lacks batch 2, which Spark's checkpoint committed before batch 3" in str(behind.value)
    assert "cdcsync rewind" in (behind.value.hint or "")
    assert 3 not in target(sink)
    assert sink.prepare(sink.ledger_key(0, "a new checkpoint", ranges(0, 1)))  # a fresh checkpoint starts at 0
    # A sink that starts later (a topic_pattern's new table, a checkpoint rewound to its start) has no earlier
    # batch, so nothing was lost before its first one.
    assert sink.prepare(sink.ledger_key(7, "a new checkpoint", ranges(7, 8)))


# ---- the checkpoint against the ledger --------------------------------------------------------------------------


def write_checkpoint(directory: Path, last: int, *, per_batch: int = 10) -> None:
    """A query's checkpoint with batches 0..last committed, each reading ``per_batch`` offsets of partition 0."""
    (directory / "sources" / "0").mkdir(parents=True)
    (directory / "offsets").mkdir()
    (directory / "commits").mkdir()
    (directory / "metadata").write_text(json.dumps({"id": "cp"}))
    (directory / "sources" / "0" / "0").write_text('\0v1\n{"t":{"0":0}}')
    for batch_id in range(last + 1):
        end = json.dumps({"t": {"0": (batch_id + 1) * per_batch}})
        (directory / "offsets" / str(batch_id)).write_text(f'v1\n{{"batchWatermarkMs":0,"conf":{{}}}}\n{end}')
        (directory / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        for log in ("offsets", "commits"):
            (directory / log / f".{batch_id}.crc").write_bytes(b"crc")


def two_sink_pipeline() -> Any:
    return validate_pipeline_dict(
        {
            "name": "sinktest",
            "sources": {"s": {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint"}}},
            "sinks": {
                "m": {"type": "postgres", "from": "s", "schema": "app", "table": "m"},
                "added": {"type": "postgres", "from": "s", "schema": "app", "table": "added"},
            },
        }
    )


def record(dsn: str, sink: str, batch_ids: range, checkpoint: Path) -> None:
    with psycopg.connect(dsn) as conn:
        for batch_id in batch_ids:
            offsets = json.dumps(batch_offsets(checkpoint, batch_id))
            conn.execute(
                "INSERT INTO cdcsync.batch_ledger (pipeline, sink, checkpoint_id, batch_id, rows_written, offsets) "
                "VALUES ('sinktest', %s, 'cp', %s, 0, %s)",
                (sink, batch_id, offsets),
            )


def test_a_checkpoint_past_the_ledger_is_refused_then_rewound(postgres_dsn: str, tmp_path: Path) -> None:
    make_sink("hard", postgres_dsn, tmp_path / "migrations")  # the internal schema, with its ledger
    settings = load_settings(state_dir=tmp_path / "state", postgres__dsn=postgres_dsn)
    pipeline = two_sink_pipeline()
    checkpoint = settings.checkpoint_dir("sinktest", "s")
    write_checkpoint(checkpoint, 149)
    assert batch_offsets(checkpoint, 0) == ranges(0, 10)
    assert batch_offsets(checkpoint, 7) == ranges(70, 80)
    record(postgres_dsn, "m", range(150), checkpoint)
    record(postgres_dsn, "added", range(150), checkpoint)
    with psycopg.connect(postgres_dsn) as conn:
        check_ledger(conn, pipeline, settings)  # every sink has every committed batch

        # The target restored from a backup taken after batch 41; Spark kept only the newest 100 batches.
        conn.execute("DELETE FROM cdcsync.batch_ledger WHERE batch_id > 41")
        for batch_id in range(50):
            for log in ("offsets", "commits"):
                (checkpoint / log / str(batch_id)).unlink()
                (checkpoint / log / f".{batch_id}.crc").unlink()
        with pytest.raises(CheckpointAheadError) as behind:
            check_ledger(conn, pipeline, settings)
        message = str(behind.value)
        assert "has committed batches up to 149" in message and str(checkpoint) in message
        assert "sink 'added' lacks batches 42 to 149, sink 'm' lacks batches 42 to 149" in message
        assert "cdcsync rewind" in (behind.value.hint or "")

        (rewound,) = rewind_to_ledger(conn, pipeline, settings)
        assert (rewound.source, rewound.from_batch, rewound.to_batch) == ("s", 149, 41)
        # Batch 41 is written back from the ledger's ranges; Spark's next batch starts where it ended.
        assert end_offsets(checkpoint, 41) == {"t": {0: 420}}
        assert sorted(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()) == [41]
        assert sorted(p.name for p in (checkpoint / "commits").iterdir()) == ["41"]  # and no stale .crc
        check_ledger(conn, pipeline, settings)

        # A sink added after the pipeline ran has none of the batches: refused, then rewound to the start.
        conn.execute("DELETE FROM cdcsync.batch_ledger WHERE sink = 'added'")
        with pytest.raises(CheckpointAheadError) as added:
            check_ledger(conn, pipeline, settings)
        assert "sink 'added' has none of them" in str(added.value)
        (rewound,) = rewind_to_ledger(conn, pipeline, settings)
        assert rewound.to_batch == -1
        assert not [p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
        assert end_offsets(checkpoint, -1) == {"t": {0: 0}}  # batch 0 starts where the query first started
        assert rewind_to_ledger(conn, pipeline, settings) == []
