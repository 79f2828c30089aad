"""The Kafka broker SIGKILLed mid-run and started again a few seconds later (a private broker).

The broker keeps its log on disk, so nothing is lost at the source; the run's Kafka consumers (Spark's source on
the driver and on the executors) reconnect, and the batch in flight is retried or replayed."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.faults.conftest import FaultStack
from tests.faults.harness import FaultWorkload


@pytest.fixture()
def kafka_bootstrap(fault_stack: FaultStack) -> str:
    """The private broker, which the test kills: the workload is produced to it and the run reads from it."""
    return fault_stack.service("kafka").address


def test_broker_sigkilled_and_restarted_mid_run(
    fault_workload: Callable[..., FaultWorkload], fault_stack: FaultStack
) -> None:
    faulted = fault_workload(changes=6_000, seed=404, max_offsets=800)
    process = faulted.start()
    faulted.wait_batches(3, process)
    fault_stack.kill("kafka")
    time.sleep(2.0)
    recovered = faulted.moving_again(fault_stack.restart("kafka"), process)
    faulted.finish(process)
    faulted.assert_exact("Kafka broker SIGKILLed, restarted", 1, recovered)
