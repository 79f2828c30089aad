"""ClickHouse stopped mid-run, then started again (a private server): the executors' inserts fail retriably, the
run waits it out with backoff inside its retry budget, and the batch lands once ClickHouse is back; its insert
tokens drop what a retried task had inserted before the outage."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import ClickHouseDatabase
from tests.e2e.test_clickhouse_pipeline import stop_merges
from tests.faults.conftest import FaultStack
from tests.faults.harness import FaultWorkload


@pytest.fixture()
def clickhouse_database(fault_stack: FaultStack) -> Iterator[ClickHouseDatabase]:
    """A database of its own on the private ClickHouse, which the test stops."""
    import clickhouse_connect

    url = fault_stack.service("clickhouse").address
    name = f"t_{uuid.uuid4().hex[:12]}"
    clickhouse_connect.get_client(dsn=url).command(f"CREATE DATABASE `{name}`")
    yield ClickHouseDatabase(url=url, database=name)
    fault_stack.restart("clickhouse")
    clickhouse_connect.get_client(dsn=url).command(f"DROP DATABASE IF EXISTS `{name}` SYNC")


@pytest.mark.parametrize(
    ("changes", "stop_s"),
    [pytest.param(6_000, 8.0, id="short"), pytest.param(200_000, 60.0, id="soak", marks=pytest.mark.soak)],
)
def test_clickhouse_stopped_mid_run(
    fault_workload: Callable[..., FaultWorkload],
    fault_stack: FaultStack,
    clickhouse_database: ClickHouseDatabase,
    changes: int,
    stop_s: float,
) -> None:
    faulted = fault_workload(changes=changes, seed=8123, max_offsets=800)
    faulted.project.env["CDCSYNC__RETRY__BUDGET_S"] = str(stop_s + 90)
    process = faulted.start()
    faulted.wait_batches(3, process)
    fault_stack.stop("clickhouse")
    time.sleep(stop_s)
    back_at = fault_stack.restart("clickhouse")
    stop_merges(clickhouse_database)  # a restarted server merges again; the raw row count must stay exact
    recovered = faulted.moving_again(back_at, process)
    stderr = faulted.finish(process)
    assert stderr.count("retrying with backoff") == 1, stderr[-4000:]  # once per outage, not per attempt
    assert "succeeded again after" in stderr
    faulted.assert_exact(f"ClickHouse stopped {stop_s:.0f} s", 1, recovered)
