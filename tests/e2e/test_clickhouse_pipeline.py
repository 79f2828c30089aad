"""Kafka -> Spark -> ClickHouse ReplacingMergeTree (and a Postgres mirror of the same stream), end to end.

Exactly-once in ClickHouse rests on two things these tests take apart: the Postgres batch ledger (a replayed
batch that landed is skipped) and the per-insert deduplication tokens (a batch replayed after its inserts but
before its ledger row adds nothing). The invariant checked throughout: the table's raw row count (before any
merge) equals the sum of the rows the ledger says each batch wrote, so no insert ever landed twice.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdcsync.devstack import workload
from tests.conftest import ClickHouseDatabase
from tests.e2e.conftest import Project, ledger_batches, mirror_rows, orders_pipeline

COLUMNS = list(workload.ORDERS_COLUMNS)


def clickhouse_pipeline(topic: str, database: str, *, with_mirror: bool, max_offsets: int) -> dict[str, Any]:
    """The orders stream into a ClickHouse table (and, ``with_mirror``, the usual hard-delete Postgres mirror).

    The pipeline name is unique: ClickHouse's migration ledger (``cdcsync.schema_migrations``) is shared by the
    whole test session, while each test has a database of its own.
    """
    pipeline = orders_pipeline(topic, max_offsets_per_trigger=max_offsets)
    pipeline["name"] = f"ch_{uuid.uuid4().hex[:10]}"
    sinks = {"mirror": pipeline["sinks"]["mirror"]} if with_mirror else {}
    sinks["orders_ch"] = {
        "type": "clickhouse",
        "from": "orders",
        "database": database,
        "table": "orders",
        "low_cardinality": ["status"],
        "compression": "lz4",
    }
    pipeline["sinks"] = sinks
    return pipeline


def with_clickhouse(project: Project, clickhouse_database: ClickHouseDatabase) -> Project:
    project.env["CDCSYNC__CLICKHOUSE__URL"] = clickhouse_database.url
    return project


def clickhouse_rows(clickhouse_database: ClickHouseDatabase) -> dict[int, dict[str, Any]]:
    client = clickhouse_database.client()
    names = ", ".join(f"`{c}`" for c in COLUMNS)
    result = client.query(f"SELECT {names} FROM orders FINAL WHERE NOT _is_deleted")
    rows = {}
    for row in result.result_rows:
        record = dict(zip(COLUMNS, row, strict=True))
        stamp = record["updated_at"]
        if stamp is not None and stamp.tzinfo is None:  # clickhouse-connect returns naive UTC on some versions
            record["updated_at"] = stamp.replace(tzinfo=dt.timezone.utc)
        rows[record["id"]] = record
    return rows


def assert_clickhouse_equals(clickhouse_database: ClickHouseDatabase, expected: dict[int, dict[str, Any]]) -> None:
    actual = clickhouse_rows(clickhouse_database)
    assert actual.keys() == expected.keys(), (
        f"{len(actual.keys() - expected.keys())} unexpected keys, {len(expected.keys() - actual.keys())} missing"
    )
    wrong = [key for key in expected if actual[key] != expected[key]]
    assert not wrong, f"{len(wrong)} rows differ, e.g. {actual[wrong[0]]} != {expected[wrong[0]]}"


def stop_merges(clickhouse_database: ClickHouseDatabase) -> None:
    """Background merges fold versions away at any time; without them the raw row count is exact."""
    clickhouse_database.client().command("SYSTEM STOP MERGES orders")


def raw_rows(clickhouse_database: ClickHouseDatabase) -> int:
    return int(clickhouse_database.client().command("SELECT count() FROM orders"))


def ledger_rows_written(dsn: str, pipeline: str, sink: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(rows_written), 0) FROM cdcsync.batch_ledger WHERE pipeline = %s AND sink = %s",
            (pipeline, sink),
        ).fetchone()
    assert row is not None
    return int(row[0])


def checkpoint_commits(project: Project) -> Path:
    (commits,) = list((project.root / "state").rglob("commits"))
    return commits


def test_clickhouse_and_postgres_mirror_end_equal_and_a_replayed_batch_adds_nothing(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
    clickhouse_database: ClickHouseDatabase,
) -> None:
    load = workload.generate(50_000, 5_000, seed=31, wrapped=False)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    spec = clickhouse_pipeline(topic_name, clickhouse_database.database, with_mirror=True, max_offsets=15_000)
    project = with_clickhouse(make_project(spec), clickhouse_database)
    project.prepare()
    stop_merges(clickhouse_database)
    assert (project.root / "migrations" / spec["name"] / "clickhouse" / "0001_init.sql").is_file()

    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_clickhouse_equals(clickhouse_database, load.expected)
    assert mirror_rows(postgres_dsn, "app", "Orders Mirror", COLUMNS) == clickhouse_rows(clickhouse_database)
    batches = ledger_batches(postgres_dsn, spec["name"])
    assert batches["orders_ch"] == batches["mirror"] == list(range(len(batches["mirror"])))
    assert len(batches["orders_ch"]) >= 4  # 50k+ messages in batches of 15k
    raw_before = raw_rows(clickhouse_database)
    assert raw_before == ledger_rows_written(postgres_dsn, spec["name"], "orders_ch")
    # The ClickHouse sink's mark of source positions (raised from its tasks through a Spark accumulator) is the
    # one the Postgres mirror keeps in SQL over the same batches.
    with psycopg.connect(postgres_dsn) as conn:
        marks = dict(
            conn.execute(
                "SELECT sink, position FROM cdcsync.source_positions WHERE pipeline = %s", (spec["name"],)
            ).fetchall()
        )
    assert marks.keys() == {"mirror", "orders_ch"} and marks["orders_ch"] == marks["mirror"] > 2**65
    assert raw_before > len(load.expected)  # versions and delete rows, not yet merged away

    # Crash after the last batch's inserts but before its commit and its ClickHouse ledger row: Spark replays
    # the batch; Postgres skips it by its ledger, ClickHouse must drop the re-sent inserts by their tokens.
    last = batches["orders_ch"][-1]
    commits = checkpoint_commits(project)
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)  # else Spark cannot write the commit again
    with psycopg.connect(postgres_dsn) as conn:
        deleted = conn.execute(
            "DELETE FROM cdcsync.batch_ledger WHERE pipeline = %s AND sink = 'orders_ch' AND batch_id = %s",
            (spec["name"], last),
        ).rowcount
    assert deleted == 1
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert ledger_batches(postgres_dsn, spec["name"])["orders_ch"] == batches["orders_ch"]  # the batch re-ran
    assert raw_rows(clickhouse_database) == raw_before
    assert_clickhouse_equals(clickhouse_database, load.expected)

    status = project.cdcsync("status", str(project.pipeline_file)).stdout
    assert f"{clickhouse_database.database}.orders" in status
    assert status.count(f"{len(load.expected):,}") == 2  # rows in the mirror and current rows in ClickHouse


# `make test` covers this sink through tests/faults/test_run_killed.py (mirror, aggregation and ClickHouse in one
# workload, 5 kills); this single-sink variant runs in `make soak`.
@pytest.mark.soak
def test_sigkill_mid_stream_then_restart_is_exact(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
    clickhouse_database: ClickHouseDatabase,
) -> None:
    load = workload.generate(50_000, 5_000, seed=37, wrapped=True)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    spec = clickhouse_pipeline(topic_name, clickhouse_database.database, with_mirror=False, max_offsets=4_000)
    project = with_clickhouse(make_project(spec), clickhouse_database)
    project.prepare()
    stop_merges(clickhouse_database)

    process = project.start("run", str(project.pipeline_file), "--available-now")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if len(ledger_batches(postgres_dsn, spec["name"]).get("orders_ch", [])) >= 3:
            break
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before it could be killed; make the workload larger"
    time.sleep(random.uniform(0.0, 1.5))
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    killed_at = ledger_batches(postgres_dsn, spec["name"]).get("orders_ch", [])
    assert len(killed_at) < 14, "the kill came after the stream was drained"

    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_clickhouse_equals(clickhouse_database, load.expected)
    batches = ledger_batches(postgres_dsn, spec["name"])["orders_ch"]
    assert batches == list(range(len(batches))) and len(batches) > len(killed_at)
    # Whatever the killed run had inserted without recording it was re-sent under the same tokens and dropped.
    assert raw_rows(clickhouse_database) == ledger_rows_written(postgres_dsn, spec["name"], "orders_ch")
