"""The target Postgres crashes (SIGKILL: crash recovery on restart) or stops, under a running pipeline.

Staging tables are UNLOGGED, and crash recovery empties unlogged tables. A crash after the tasks staged a batch
and before the driver merged it left an empty (or, with tasks on both sides of the crash, partial) stage that the
merge used to apply and ledger as done: those changes were lost for good. The merge now counts the stage in its
own transaction against what the tasks reported and, short, fails retriably, so the batch is staged again.

Here Postgres is a private instance (:class:`tests.faults.conftest.FaultStack`), never the session's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg.conninfo import conninfo_to_dict

from cdcsync.core.errors import SinkError
from tests.e2e.conftest import ledger_batches
from tests.faults.conftest import FaultStack
from tests.faults.harness import BOUND_S, FaultWorkload
from tests.integration.test_postgres_sink import SCHEMA, change, make_sink, target


@pytest.fixture()
def postgres_dsn(private_postgres_dsn: str) -> str:
    """Every Postgres of these tests (target, ledger, lock) is the private one."""
    return private_postgres_dsn


def test_a_stage_emptied_by_a_crash_is_not_merged(fault_stack: FaultStack, postgres_dsn: str, tmp_path: Path) -> None:
    """Deterministic: stage, crash Postgres, merge. Before the fix the merge ledgered the empty stage (0 rows)."""
    sink = make_sink("hard", postgres_dsn, tmp_path)
    rows = pa.Table.from_pylist([change("c", key, 10 + key) for key in range(1, 51)], schema=SCHEMA)
    key = sink.ledger_key(0, "cp")
    assert sink.prepare(key)
    staged = sink.stage_writer(0).stage(rows)
    assert staged == 50
    fault_stack.kill("postgres")
    fault_stack.restart("postgres")  # crash recovery resets the unlogged stage

    with pytest.raises(SinkError) as caught:
        sink.merge(key, staged)
    assert caught.value.retriable, caught.value
    assert "holds 0 of the 50 row(s) the tasks staged" in str(caught.value)
    assert ledger_batches(postgres_dsn, "sinktest") == {}
    assert target(sink) == {}

    # What the runtime does with a retriable failure: the whole batch again, which lands every row.
    assert sink.prepare(key)
    assert sink.merge(key, sink.stage_writer(0).stage(rows)) == 50
    assert len(target(sink)) == 50


def active_statement(admin_dsn: str, database: str, pattern: str) -> bool:
    """A session of ``database`` runs (or sits in a transaction after) a statement matching ``pattern``."""
    try:
        with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query LIKE %s"
                " AND state IN ('active', 'idle in transaction')",
                (database, pattern),
            ).fetchone()
    except psycopg.Error:
        return False
    return bool(row and row[0])


def wait_for_statement(admin_dsn: str, database: str, pattern: str, process: Any) -> None:
    deadline = time.monotonic() + BOUND_S
    while not active_statement(admin_dsn, database, pattern):
        assert process.poll() is None, "the run ended before the statement the test waits for"
        assert time.monotonic() < deadline, f"no {pattern!r} seen in {BOUND_S}s"
        time.sleep(0.005)


@pytest.mark.parametrize(
    ("changes", "stop_s"),
    [pytest.param(8_000, 5.0, id="short"), pytest.param(200_000, 60.0, id="soak", marks=pytest.mark.soak)],
)
def test_postgres_killed_in_staging_and_in_merge_and_stopped(
    fault_workload: Callable[..., FaultWorkload],
    fault_stack: FaultStack,
    postgres_dsn: str,
    changes: int,
    stop_s: float,
) -> None:
    faulted = fault_workload(changes=changes, seed=131, max_offsets=1_000)
    faulted.project.env["CDCSYNC__RETRY__BUDGET_S"] = str(stop_s + 90)
    admin = fault_stack.service("postgres").address
    database = str(conninfo_to_dict(postgres_dsn)["dbname"])
    process = faulted.start()

    faulted.wait_batches(1, process)
    wait_for_statement(admin, database, "COPY %", process)  # a task is staging
    fault_stack.kill("postgres")
    in_staging = faulted.moving_again(fault_stack.restart("postgres"), process)

    wait_for_statement(admin, database, '%"_cdcsync_batch"%', process)  # the driver is merging
    fault_stack.kill("postgres")
    in_merge = faulted.moving_again(fault_stack.restart("postgres"), process)

    fault_stack.stop("postgres")
    time.sleep(stop_s)
    stopped = faulted.moving_again(fault_stack.restart("postgres"), process)

    stderr = faulted.finish(process)
    assert "retrying with backoff" in stderr  # said once per outage (and per retry loop), not per attempt or row
    assert stderr.count("retrying with backoff") <= 3 * 2, stderr[-4000:]
    faulted.assert_exact("Postgres SIGKILLed (staging, merge)", 2, max(in_staging, in_merge))
    faulted.assert_exact(f"Postgres stopped {stop_s:.0f} s", 1, stopped)
