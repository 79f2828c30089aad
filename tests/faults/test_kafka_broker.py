"""The Kafka broker SIGKILLed mid-run and started again a few seconds later (a private broker).

The broker keeps its log on disk, so nothing is lost at the source; the run's Kafka consumers (Spark's source on
the driver and on the executors) reconnect, and the batch in flight is retried or replayed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.conftest import ClickHouseDatabase
from tests.e2e.conftest import Project
from tests.faults.conftest import FaultStack
from tests.faults.harness import BOUND_S, prepare_workload


def test_broker_sigkilled_and_restarted_mid_run(
    make_project: Callable[[dict[str, Any]], Project],
    fault_stack: FaultStack,
    postgres_dsn: str,
    clickhouse_database: ClickHouseDatabase,
    topic_name: str,
) -> None:
    bootstrap = fault_stack.service("kafka").address
    faulted = prepare_workload(
        make_project,
        postgres_dsn,
        bootstrap,
        clickhouse_database,
        topic_name,
        changes=8_000,
        keys=1_000,
        seed=404,
        max_offsets=1_000,
    )
    faulted.project.env["CDCSYNC__KAFKA__BOOTSTRAP_SERVERS"] = bootstrap
    process = faulted.start()
    faulted.wait_batches(3, process)
    fault_stack.kill("kafka")
    time.sleep(2.0)
    back_at = fault_stack.restart("kafka")
    before = faulted.batches()
    faulted.wait_batches(before + 1, process)
    recovered = time.monotonic() - back_at
    _stdout, stderr = process.communicate(timeout=BOUND_S)
    assert process.returncode == 0, stderr[-4000:]
    faulted.assert_exact("Kafka broker SIGKILLed, restarted", 1, recovered)
