"""The services around a running pipeline fail, one after the other, in one ``cdcsync run``: the target Postgres
SIGKILLed while a task stages and again while the driver merges (crash recovery on restart empties the UNLOGGED
stages), Postgres stopped, ClickHouse stopped, the Kafka broker SIGKILLed and restarted.

All three are private instances (:class:`tests.faults.conftest.FaultStack`), never the session's. The run must
wait each outage out inside its retry budget, say so once per outage, exit 0 having drained the topic, and leave
every target equal to the stream's final state with every batch ledgered once. One run for all five faults keeps
``make test`` lean (one Spark start, one workload); ``make soak`` stops each service for 60 s over 200k changes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import ClickHouseDatabase
from tests.e2e.test_clickhouse_pipeline import stop_merges
from tests.faults.conftest import FaultStack
from tests.faults.harness import BOUND_S, FaultWorkload


@pytest.fixture()
def postgres_dsn(private_postgres_dsn: str) -> str:
    """Target, ledger and lock on the private Postgres."""
    return private_postgres_dsn


@pytest.fixture()
def kafka_bootstrap(fault_stack: FaultStack) -> str:
    """The private broker: the workload is produced to it and the run reads from it."""
    return fault_stack.service("kafka").address


@pytest.fixture()
def clickhouse_database(fault_stack: FaultStack) -> Iterator[ClickHouseDatabase]:
    """A database of its own on the private ClickHouse."""
    import clickhouse_connect

    url = fault_stack.service("clickhouse").address
    name = f"t_{uuid.uuid4().hex[:12]}"
    clickhouse_connect.get_client(dsn=url).command(f"CREATE DATABASE `{name}`")
    yield ClickHouseDatabase(url=url, database=name)
    fault_stack.restart("clickhouse")  # a test that failed midway may have left it stopped
    clickhouse_connect.get_client(dsn=url).command(f"DROP DATABASE IF EXISTS `{name}` SYNC")


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
    [pytest.param(12_000, 5.0, id="short"), pytest.param(200_000, 60.0, id="soak", marks=pytest.mark.soak)],
)
def test_postgres_clickhouse_and_kafka_fail_under_one_run(
    fault_workload: Callable[..., FaultWorkload],
    fault_stack: FaultStack,
    postgres_dsn: str,
    clickhouse_database: ClickHouseDatabase,
    changes: int,
    stop_s: float,
) -> None:
    faulted = fault_workload(changes=changes, seed=131, max_offsets=600 if stop_s < 60 else 2_000)
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
    postgres_stopped = faulted.moving_again(fault_stack.restart("postgres"), process)

    fault_stack.stop("clickhouse")
    time.sleep(stop_s)
    back_at = fault_stack.restart("clickhouse")
    stop_merges(clickhouse_database)  # a restarted server merges again; the raw row count must stay exact
    clickhouse_stopped = faulted.moving_again(back_at, process)

    fault_stack.kill("kafka")
    time.sleep(2.0)
    broker_killed = faulted.moving_again(fault_stack.restart("kafka"), process)

    stderr = faulted.finish(process)
    # Said once per outage (by the batch's retry loop, and by the lock check for Postgres), not per attempt or row.
    outages = stderr.count("retrying with backoff")
    assert 2 <= outages <= 4 * 2, stderr[-4000:]
    assert stderr.count("succeeded again after") >= 2, stderr[-4000:]
    faulted.assert_exact("target Postgres SIGKILLed (staging, merge)", 2, max(in_staging, in_merge))
    faulted.assert_exact(f"target Postgres stopped {stop_s:.0f} s", 1, postgres_stopped)
    faulted.assert_exact(f"ClickHouse stopped {stop_s:.0f} s", 1, clickhouse_stopped)
    faulted.assert_exact("Kafka broker SIGKILLed, restarted after 2 s", 1, broker_killed)


# In ``make soak`` only: in its first fresh-clone CI run (2026-11-27) its setup found the private Postgres's port
# held by a process the stack did not know of, right after the test above, which it never did alone or after that
# test here; until that is understood it stays out of ``make test``.
@pytest.mark.soak
def test_postgres_crashes_while_overlapped_merges_run(
    fault_workload: Callable[..., FaultWorkload], fault_stack: FaultStack, postgres_dsn: str
) -> None:
    """Postgres sinks alone: a batch's merges run while the next batch stages (``run.overlap_merges``). Postgres
    SIGKILLed during a merge (taking the next batch's staged rows with the UNLOGGED stages), twice, then stopped:
    each failed merge is landed again, staging and all, before the next batch's merges, and nothing is lost."""
    faulted = fault_workload(changes=12_000, seed=151, max_offsets=600, clickhouse_sink=False)
    faulted.project.env["CDCSYNC__RETRY__BUDGET_S"] = "95"
    admin = fault_stack.service("postgres").address
    database = str(conninfo_to_dict(postgres_dsn)["dbname"])
    process = faulted.start()
    faulted.wait_batches(1, process)
    recoveries = []
    for _ in range(2):
        wait_for_statement(admin, database, '%"_cdcsync_batch"%', process)  # a batch's merges run
        fault_stack.kill("postgres")
        recoveries.append(faulted.moving_again(fault_stack.restart("postgres"), process))
    fault_stack.stop("postgres")
    time.sleep(5.0)
    recoveries.append(faulted.moving_again(fault_stack.restart("postgres"), process))
    faulted.finish(process)
    faulted.assert_exact("target Postgres SIGKILLed in overlapped merges, then stopped 5 s", 3, max(recoveries))
