"""A hybrid source end to end: an archive in ClickHouse and a stale copy of a table in Postgres backfilled in chunks,
then real Debezium's newer changes of the same keys streamed from Kafka, into a Postgres mirror and a Postgres
aggregate.

One source table, four runs of the real CLI: a job-mode run SIGKILLed in the middle of the backfill; a streaming
run that continues it and is SIGKILLed at the switch-over, as soon as the last chunk is in the ledger (the
backfill's progress and the Kafka phase's checkpoint in whatever state the kill left them); a job-mode run that
finds the backfill complete (each chunk in the ledger once, nothing merged twice, the second phase's rows over the
first's) and exits 0 with nothing streamed; a run that drains Kafka, each of its batches once, after which both
targets hold the newest state. The backfilled rows were in the targets first, so the stream's changes must rank
above them; the reverse order (a backfill landing after the stream) is
tests/integration/test_postgres_sink.py::test_backfilled_rows_rank_below_every_streamed_change.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.conftest import ClickHouseDatabase, DebeziumSource
from tests.e2e.conftest import Project, ledger_batches

pytestmark = pytest.mark.e2e

COLUMNS = {"id": "bigint", "name": "text", "qty": "integer", "grp": "integer"}
ROWS = 200
CHUNK_SIZE = 20  # 10 chunks: a kill lands in the middle of the backfill
ARCHIVED = 100  # the ClickHouse archive: the first keys, older still, in 2 pages
CHUNKS = 2 + ROWS // CHUNK_SIZE  # the archive's 2 pages, then the copy's chunks: one batch id each


def pipeline(source: DebeziumSource, archive: ClickHouseDatabase) -> dict[str, Any]:
    return {
        "name": "hybrid",
        "sources": {
            "items": {
                "type": "hybrid",
                "primary_key": "id",
                "columns": dict(COLUMNS),
                "bounded_sources": [
                    {
                        "source_type": "clickhouse",
                        "url": archive.url,
                        "database": archive.database,
                        "table_name": "items_archive",
                        "page_size": ARCHIVED // 2,
                    },
                    {
                        "source_type": "postgres",
                        "dsn": source.dsn,
                        "table": "items_seed",
                        "chunk_size": CHUNK_SIZE,
                        "parallelism": 2,
                    },
                ],
                "unbounded_source": {
                    "source_type": "kafka",
                    "topic": source.topic("public.items"),
                    "start_at": "earliest",
                },
            }
        },
        "sinks": {
            "mirror": {"type": "postgres", "from": "items", "schema": "app", "table": "items"},
            "totals": {
                "type": "postgres_aggregate",
                "from": "items",
                "schema": "app",
                "landing_table": "items_state",
                "agg_table": "qty_by_grp",
                "group_by": {"grp": {"type": "integer"}},
                "aggregate": {"qty": {"from": "qty", "fn": "sum", "type": "bigint"}, "items": {"fn": "count"}},
            },
        },
    }


def rows(dsn: str, query: str) -> set[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return {tuple(row) for row in conn.execute(query)}


def kill_when(process: subprocess.Popen[str], ready: Callable[[], bool]) -> bool:
    """SIGKILL the run (CLI and JVM) as soon as ``ready()``; False when it ended first or never got there."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None and not ready():
        time.sleep(0.1)
    alive = process.poll() is None
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    return alive and ready()


def streamed_batches(dsn: str) -> dict[str, list[int]]:
    """Batch ids in the ledger of the Kafka phase, by sink (the backfill's checkpoint ids start ``bounded-``)."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT sink, array_agg(batch_id ORDER BY batch_id) FROM cdcsync.batch_ledger "
            "WHERE pipeline = 'hybrid' AND checkpoint_id NOT LIKE 'bounded-%' GROUP BY sink"
        ).fetchall()
    return dict(found)


def test_backfill_killed_mid_way_and_at_the_switch_over_then_streamed(
    debezium_source: DebeziumSource,
    clickhouse_database: ClickHouseDatabase,
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
) -> None:
    source = debezium_source
    archive = clickhouse_database.client()
    archive.command(
        "CREATE TABLE items_archive (id Int64, name Nullable(String), qty Nullable(Int32), grp Nullable(Int32)) "
        "ENGINE = MergeTree ORDER BY id"
    )
    archive.command(f"INSERT INTO items_archive SELECT number, 'v0', 0, 0 FROM numbers(1, {ARCHIVED})")
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.items (id bigint PRIMARY KEY, name text, qty integer, grp integer)")
        conn.execute(
            "INSERT INTO public.items SELECT g, 'v1 ' || g, g %% 17, g %% 5 FROM generate_series(1, %s::int) AS g",
            (ROWS,),
        )
        conn.execute("CREATE TABLE public.items_seed (LIKE public.items INCLUDING ALL)")
        conn.execute("INSERT INTO public.items_seed SELECT * FROM public.items")  # the copy the backfill reads
    source.capture("public.items", overrides={"snapshot.mode": "no_data"})  # the backfill replaces the snapshot
    with psycopg.connect(source.dsn, autocommit=True) as conn:  # newer changes of the same keys, in Kafka only
        conn.execute("UPDATE public.items SET name = 'v2 ' || id, qty = qty + 100 WHERE id % 3 = 0")
        conn.execute("UPDATE public.items SET grp = 9 WHERE id % 7 = 0")
        conn.execute("DELETE FROM public.items WHERE id % 10 = 1")
        conn.execute(
            "INSERT INTO public.items SELECT g, 'new ' || g, 1, 9 FROM generate_series(%s::int, %s::int) AS g",
            (ROWS + 1, ROWS + 20),
        )
    source.wait_caught_up()

    project = make_project(pipeline(source, clickhouse_database))
    project.prepare()
    project.env["CDCSYNC__JOB_MODE"] = "true"

    process = project.start("run", str(project.pipeline_file))  # SIGKILLed in the middle of the backfill
    assert kill_when(process, lambda: len(ledger_batches(postgres_dsn, "hybrid").get("mirror", [])) >= 2)
    killed_at = len(ledger_batches(postgres_dsn, "hybrid")["mirror"])
    assert killed_at < CHUNKS

    # The switch-over: the last chunk landed in both sinks, the Kafka phase starting. Killed before it lands a
    # batch (its query takes seconds to start), so that the job-mode run below sees the backfill alone.
    del project.env["CDCSYNC__JOB_MODE"]
    process = project.start("run", str(project.pipeline_file), "--available-now")
    last_chunk = [CHUNKS - 1] * 2
    assert kill_when(
        process, lambda: [ids[-1] for ids in ledger_batches(postgres_dsn, "hybrid").values()] == last_chunk
    )
    assert not streamed_batches(postgres_dsn), "the Kafka phase landed a batch before the kill"

    project.env["CDCSYNC__JOB_MODE"] = "true"
    resumed = project.cdcsync("run", str(project.pipeline_file))  # job mode: the backfill is complete, exit 0
    assert "job mode" in resumed.stderr
    seed = rows(source.dsn, "SELECT id, name, qty, grp FROM public.items_seed")
    assert rows(postgres_dsn, "SELECT id, name, qty, grp FROM app.items") == seed
    with psycopg.connect(postgres_dsn) as conn:
        ledger = conn.execute(
            "SELECT sink, count(DISTINCT checkpoint_id), array_agg(batch_id ORDER BY batch_id), sum(rows_written) "
            "FROM cdcsync.batch_ledger WHERE pipeline = 'hybrid' GROUP BY sink"
        ).fetchall()
    chunks = list(range(CHUNKS))
    assert {sink: (checkpoints, ids, written) for sink, checkpoints, ids, written in ledger} == {
        "mirror": (1, chunks, ARCHIVED + ROWS),
        "totals": (1, chunks, ARCHIVED + ROWS),
    }  # one backfill, each chunk once, each row merged once (the copy's over the archive's)

    status = json.loads(project.cdcsync("status", str(project.pipeline_file), "--json").stdout)["bounded"]
    assert [(phase["chunks_done"], phase["chunks"]) for phase in status] == [(2, 2), (ROWS // CHUNK_SIZE,) * 2]

    del project.env["CDCSYNC__JOB_MODE"]
    project.cdcsync("run", str(project.pipeline_file), "--available-now")  # the backfill is done: Kafka only
    streamed = streamed_batches(postgres_dsn)
    assert set(streamed) == {"mirror", "totals"} and streamed["mirror"] == streamed["totals"]
    assert streamed["mirror"] == list(range(len(streamed["mirror"]))), "each Kafka batch once"
    newest = rows(source.dsn, "SELECT id, name, qty, grp FROM public.items")
    assert rows(postgres_dsn, "SELECT id, name, qty, grp FROM app.items") == newest
    assert rows(postgres_dsn, "SELECT grp, qty, items FROM app.qty_by_grp") == rows(
        source.dsn, "SELECT grp, sum(qty), count(*) FROM public.items GROUP BY grp"
    )
