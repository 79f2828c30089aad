"""Bounded Postgres reads on the tests' Spark session and a real Postgres: a hybrid source's phases through its
transform graph, into a Delta mirror, a Delta history and, through a SQL transform, a Postgres mirror, each chunk
once, ranked below a change the stream had already merged, a chunk replayed after its Delta commit (its ledger row
and progress lost in a crash) leaving the Delta table's version where it was; and the types a chunk carries as the
decoder types them (arrays, bit strings, hstore)."""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdcsync import migrations
from cdcsync.config.bounded import PostgresTableSource
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.config.settings import Settings
from cdcsync.config.types import hstore_text, parse_pg_type
from cdcsync.migrations import DELTA, POSTGRES
from cdcsync.migrations.delta import DeltaConnection
from cdcsync.runtime.bounded import BoundedHandler, run_bounded
from cdcsync.runtime.lock import PipelineLock
from cdcsync.runtime.stream import BatchHandler
from cdcsync.sinks.delta import DeltaTableSink
from cdcsync.sources.bounded import read_ranges
from cdcsync.sources.bounded.postgres import PostgresRangeTask

pytestmark = pytest.mark.integration

STREAMED = Decimal(2**64 + 7)
"""A streamed Debezium change's version: commit part 1, above every bounded phase's."""
PHASES = ("items_old", "items")


def definition(root: Path, dsn: str) -> Pipeline:
    phases = [
        {"source_type": "postgres", "dsn": dsn, "table": table, "chunk_size": 100, "parallelism": 2} for table in PHASES
    ]
    source = {
        "type": "hybrid",
        "primary_key": "id",
        "columns": {"id": "bigint", "name": "text", "qty": "integer"},
        "bounded_sources": phases,
        "unbounded_source": {"source_type": "kafka", "topic": "db.public.items", "start_at": "earliest"},
    }
    big = {"type": "sql", "from": "items", "primary_key": "id", "sql": "SELECT * FROM items WHERE qty > 5"}
    sinks = {
        "lake": {"type": "delta", "from": "items", "path": str(root / "lake")},
        "hist": {"type": "delta", "from": "items", "path": str(root / "hist"), "mode": "history"},
        "big": {"type": "postgres", "from": "big", "schema": "app", "table": "big"},
    }
    return validate_pipeline_dict(
        {"name": "lakefill", "sources": {"items": source}, "transforms": {"big": big}, "sinks": sinks}
    )


def delta_rows(spark: Any, path: Path) -> list[Any]:
    return spark.read.format("delta").load(str(path)).orderBy("id", "_cdc_version").collect()


def delta_version(spark: Any, path: Path) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["version"])


def backfill(spark: Any, pipeline: Pipeline, settings: Settings) -> BoundedHandler:
    """The run's bounded part, under the pipeline's lock (its fence guards every merge)."""
    handlers: dict[str, BatchHandler] = {}
    with PipelineLock(settings.postgres_dsn, pipeline.name) as lock:
        lock.acquire()
        assert run_bounded(spark, pipeline, settings, lock, threading.Event(), handlers)
    handler = handlers["items.bounded"]
    assert isinstance(handler, BoundedHandler)
    assert handler.graph is not None, "a source feeding transforms and Delta sinks lands through its graph"
    return handler


def test_chunks_land_in_delta_and_through_sql_once_each_below_the_stream(
    spark: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for table, rows, name in (("items_old", 30, "old"), ("items", 25, "new")):
            conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, qty integer)")
            conn.execute(
                f"INSERT INTO {table} SELECT g, '{name} ' || g, (g * %s) %% 10 FROM generate_series(1, %s) AS g",
                (1 if name == "old" else 3, rows),
            )
    pipeline = definition(tmp_path, postgres_dsn)
    for target in (POSTGRES, DELTA):
        migrations.init(target, pipeline, tmp_path / "migrations")
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, tmp_path / "migrations")
        migrations.apply_pending(DELTA, DeltaConnection(conn, spark), pipeline.name, tmp_path / "migrations")
    settings = Settings(postgres={"dsn": postgres_dsn}, state_dir=tmp_path / "state")

    # The stream got there first: key 3's streamed update is in both Delta tables before the backfill starts.
    streamed = spark.createDataFrame(
        [(3, "streamed", 9, "u", STREAMED, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))],
        "id bigint, name string, qty int, _cdc_op string, _cdc_version decimal(38,0), _cdc_ts timestamp",
    )
    for sink_id in ("lake", "hist"):
        sink = DeltaTableSink(pipeline, sink_id, pipeline.sinks[sink_id], postgres_dsn)  # type: ignore[arg-type]
        key = sink.ledger_key(0, "kafka-checkpoint")
        assert sink.prepare(key) and sink.merge_changes(key, streamed) == 1

    backfill(spark, pipeline, settings)

    newest = {i: (f"new {i}", (i * 3) % 10, 2) for i in range(1, 26)} | {
        i: (f"old {i}", i % 10, 1) for i in range(26, 31)
    }
    lake = {
        row["id"]: (row["name"], row["qty"], int(row["_cdc_version"])) for row in delta_rows(spark, tmp_path / "lake")
    }
    assert lake == newest | {3: ("streamed", 9, int(STREAMED))}  # phase 2 over phase 1, the stream over both

    chains: dict[int, list[tuple[int, bool]]] = {}
    for row in delta_rows(spark, tmp_path / "hist"):
        chains.setdefault(row["id"], []).append((int(row["_cdc_version"]), row["_is_current"]))
    assert chains[3] == [(1, False), (2, False), (int(STREAMED), True)]
    assert chains[5] == [(1, False), (2, True)] and chains[26] == [(1, True)]
    assert set(chains) == set(newest)

    with psycopg.connect(postgres_dsn) as conn:
        big = {row[0]: row[1:] for row in conn.execute("SELECT id, name, qty FROM app.big")}
        ledger = conn.execute(
            "SELECT sink, checkpoint_id, array_agg(batch_id ORDER BY batch_id) FROM cdcsync.batch_ledger "
            "WHERE checkpoint_id LIKE 'bounded-%%' GROUP BY sink, checkpoint_id"
        ).fetchall()
    # The transform's filter over the newest backfilled rows: a phase-2 row it drops deletes the phase-1 row.
    assert big == {k: (name, qty) for k, (name, qty, _) in newest.items() if qty > 5}
    assert sorted((sink, batches) for sink, _, batches in ledger) == [(s, [0, 1]) for s in ("big", "hist", "lake")]
    assert len({checkpoint for _, checkpoint, _ in ledger}) == 1  # one chunk per phase, each once, one backfill

    # A crash after the last chunk's Delta commit, before its ledger row and progress: the rerun reads the chunk
    # again, the Postgres sink skips it by its ledger, and Delta skips the MERGE by (txnAppId, txnVersion).
    before, content = delta_version(spark, tmp_path / "lake"), delta_rows(spark, tmp_path / "lake")
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute("DELETE FROM cdcsync.batch_ledger WHERE sink = 'lake' AND batch_id = 1")
    handler = backfill(spark, pipeline, settings)  # a fresh handler reads the progress: both chunks done
    assert handler.sink_stats["lake"].batches == 0, "the progress says every chunk landed"
    progress = handler.progress
    progress.phases[1]["done"] = 0
    progress.save()
    handler = backfill(spark, pipeline, settings)
    assert (handler.sink_stats["big"].skipped_batches, handler.sink_stats["lake"].rows_out) == (1, 0)
    assert delta_version(spark, tmp_path / "lake") == before
    assert delta_rows(spark, tmp_path / "lake") == content
    with psycopg.connect(postgres_dsn) as conn:
        landed = conn.execute(
            "SELECT count(*) FROM cdcsync.batch_ledger WHERE sink = 'lake' AND batch_id = 1"
        ).fetchone()
    assert landed == (1,)


def test_arrays_bits_and_hstore_read_as_the_decoder_types_them(spark: Any, postgres_dsn: str) -> None:
    declared = {
        "id": "bigint",
        "ints": "integer[]",
        "names": "text[]",
        "amounts": "numeric(10,2)[]",
        "ats": "timestamptz[]",
        "blobs": "bytea[]",
        "flags": "bit(4)",
        "vary": "bit varying(8)",
        "attrs": "hstore",
    }
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS hstore")
        conn.execute(f"CREATE TABLE typed ({', '.join(f'{name} {text}' for name, text in declared.items())})")
        conn.execute(
            """INSERT INTO typed VALUES
                 (1, '{1,NULL,-3}', ARRAY['a "b"', E'line\\nnext', NULL, ''], '{1.50,-2}',
                  ARRAY['2024-05-01 12:00:00.5+02'::timestamptz], ARRAY['\\x00ff'::bytea, NULL], B'0101', B'0011',
                  'k=>v, "a b"=>NULL'),
                 (2, '{}', NULL, NULL, NULL, '{}', NULL, NULL, NULL)"""
        )
    columns = tuple((name, parse_pg_type(text)) for name, text in declared.items())
    source = {"type": "postgres", "table": "typed", "primary_key": "id", "columns": declared}
    task = PostgresRangeTask.of(postgres_dsn, PostgresTableSource.model_validate(source), columns, ("id",))
    frame = read_ranges(spark, task, columns, [(None, ["2"]), (["2"], None)])
    assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
        (name, pg.spark_type) for name, pg in columns
    ]
    first, second = sorted(frame.collect(), key=lambda row: row["id"])
    assert first.asDict() == {
        "id": 1,
        "ints": [1, None, -3],
        "names": ['a "b"', "line\nnext", None, ""],
        "amounts": [Decimal("1.50"), Decimal("-2.00")],
        "ats": [dt.datetime(2024, 5, 1, 10, 0, 0, 500000)],  # the session's time zone is UTC
        "blobs": [b"\x00\xff", None],
        "flags": "0101",
        "vary": "0011",  # Postgres keeps a bit varying's leading zeros; Debezium's Bits drop them
        "attrs": hstore_text({"k": "v", "a b": None}),  # Postgres orders keys by length, then bytes
    }
    assert second.asDict() == {"id": 2, "ints": [], "blobs": []} | {
        name: None for name in declared if name not in ("id", "ints", "blobs")
    }
