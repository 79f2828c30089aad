"""The target goes back in time: its Postgres database is restored from a dump taken while the pipeline ran.

Spark's checkpoint is then past batches the target no longer has, and nothing in Spark notices: without the
check, the next run starts after the checkpoint's last batch and the restored-away changes never come back. With
it, ``run`` refuses (exit 2, before Spark starts) and names ``cdcsync rewind --to-ledger``, which rewrites the
checkpoint so the missing batches are read again; afterwards the mirror, the aggregation and the ClickHouse table
equal the source's final state, and the ledger holds each batch once.

The dump and restore use ``pg_dump``/``pg_restore`` on the test's own database; the shared server keeps running.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cdcsync.devstack import workload
from cdcsync.devstack.postgres import find_binaries
from tests.conftest import ClickHouseDatabase, Services
from tests.e2e.conftest import Project, assert_each_batch_once, ledger_batches, orders_pipeline
from tests.e2e.test_clickhouse_pipeline import assert_clickhouse_equals, with_clickhouse
from tests.e2e.test_upsert_pipeline import assert_hard_mirror_equals

BOUND_S = 300.0
"""Upper bound on any wait below; reaching it fails the test, it never decides a pass."""


def every_kind_pipeline(topic: str, clickhouse_database: str | None, *, max_offsets: int) -> dict[str, Any]:
    """The orders stream into a mirror, an aggregation and (given a database) a ClickHouse table. The name is
    unique: ClickHouse's migration ledger is shared by the test session."""
    pipeline = orders_pipeline(topic, max_offsets_per_trigger=max_offsets)
    pipeline["name"] = f"f_{uuid.uuid4().hex[:10]}"
    pipeline["sinks"] = {"mirror": pipeline["sinks"]["mirror"], **revenue_sink()}
    if clickhouse_database is not None:
        pipeline["sinks"]["orders_ch"] = {
            "type": "clickhouse",
            "from": "orders",
            "database": clickhouse_database,
            "table": "orders",
        }
    return pipeline


def revenue_sink() -> dict[str, Any]:
    return {
        "revenue": {
            "type": "postgres_aggregate",
            "from": "orders",
            "schema": "app",
            "landing_table": "orders_state",
            "agg_table": "revenue",
            "group_by": {"customer_id": {"type": "bigint"}},
            "aggregate": {"total": {"from": "amount", "fn": "sum"}, "orders": {"fn": "count"}},
        }
    }


def assert_revenue_equals(dsn: str, expected: dict[int, dict[str, Any]]) -> None:
    groups: dict[int, list[Decimal | None]] = defaultdict(list)
    for row in expected.values():
        groups[row["customer_id"]].append(row["amount"])
    wanted = {
        customer: (
            sum((a for a in amounts if a is not None), Decimal(0)) if any(a is not None for a in amounts) else None,
            len(amounts),
        )
        for customer, amounts in groups.items()
    }
    with psycopg.connect(dsn) as conn:
        actual = {
            row[0]: (row[1], row[2]) for row in conn.execute("SELECT customer_id, total, orders FROM app.revenue")
        }
    wrong = [customer for customer in wanted if actual.get(customer) != wanted[customer]]
    assert actual.keys() == wanted.keys() and not wrong, f"{len(wrong)} groups differ, e.g. {wrong[:3]}"


def restore(services: Services, dsn: str, dump: Path) -> None:
    """Replace the test's database by the dump, as a restore from a backup would."""
    name = str(conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    pg_restore = find_binaries().bindir / "pg_restore"
    subprocess.run([str(pg_restore), "--no-owner", "--dbname", dsn, str(dump)], check=True, capture_output=True)


def test_a_target_restored_from_a_dump_taken_mid_run_is_refused_then_rewound(
    make_project: Callable[[dict[str, Any]], Project],
    services: Services,
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
    clickhouse_database: ClickHouseDatabase,
    tmp_path: Path,
) -> None:
    load = workload.generate(8_000, 1_000, seed=53, wrapped=True)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    spec = every_kind_pipeline(topic_name, clickhouse_database.database, max_offsets=1_000)
    sinks = tuple(spec["sinks"])
    project = with_clickhouse(make_project(spec), clickhouse_database)
    project.prepare()

    # A dump of the target while the run streams: a consistent snapshot with some batches, not all.
    running = project.start("run", str(project.pipeline_file), "--available-now")
    deadline = time.monotonic() + BOUND_S
    while min((len(ids) for ids in ledger_batches(postgres_dsn, spec["name"]).values()), default=0) < 2:
        assert running.poll() is None and time.monotonic() < deadline, "the run ended before the dump"
        time.sleep(0.2)
    dump = tmp_path / "target.dump"
    pg_dump = find_binaries().bindir / "pg_dump"
    subprocess.run([str(pg_dump), "--format=custom", "--file", str(dump), postgres_dsn], check=True)
    assert running.wait(timeout=BOUND_S) == 0
    landed = assert_each_batch_once(postgres_dsn, spec["name"], sinks)

    restore(services, postgres_dsn, dump)
    restored = ledger_batches(postgres_dsn, spec["name"])
    assert 2 <= len(restored["mirror"]) < len(landed["mirror"]), "the dump was not taken mid-run"

    refused = project.cdcsync("run", str(project.pipeline_file), "--available-now", check=False)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert f"sink 'mirror' lacks batches {len(restored['mirror'])} to {len(landed['mirror']) - 1}" in refused.stderr
    assert f"cdcsync rewind {project.pipeline_file} --to-ledger" in refused.stderr
    assert "starting Spark" not in refused.stderr and "Traceback" not in refused.stderr

    rewound = project.cdcsync("rewind", str(project.pipeline_file), "--to-ledger").stdout
    first_lost = min(len(ids) for ids in restored.values())
    assert f"checkpoint rewound from batch {len(landed['mirror']) - 1} to {first_lost - 1}" in rewound, rewound
    project.cdcsync("run", str(project.pipeline_file), "--available-now")

    assert_hard_mirror_equals(postgres_dsn, load.expected)
    assert_revenue_equals(postgres_dsn, load.expected)
    assert_clickhouse_equals(clickhouse_database, load.expected)
    assert_each_batch_once(postgres_dsn, spec["name"], sinks)
