"""The Kafka broker away under a running pipeline: shorter than the retry budget, then longer.

A task's read of its offsets rides out a short outage (it waits ``kafkaConsumer.pollTimeoutMs`` for the broker); a
longer one fails the batch as the broker's outage (the executors' own read, ``cdcsync.sources.kafka_fetch``: these
options are all ones it takes or leaves to Spark's planner; under Spark's reader, one of Kafka's retriable
exceptions). That failure is the broker's outage, not a failed write: the
batch is retried with backoff inside ``retry.budget_s`` (said once), so an outage shorter than the budget passes
without exiting, and one longer than the budget ends the run with exit 1 and one line naming the broker, with
nothing merged for the batch and nothing dead-lettered. The next run, with the broker back, lands every change
exactly once. Before, the first failed task stopped the run at once with the reader's raw error, and a query the
driver's offset requests ended said only "streaming query failed: …".

The reader's own timeouts are made short here (the source's ``options``; Spark's defaults are 120 s for a poll and
Kafka's 60 s for an offset request), so a few seconds of outage fail a task; the driver's offset requests get more
attempts (``fetchOffset.numRetries``) so that they outlast the short outage, as Spark's defaults (3 x 60 s) outlast
the default budget. Where the long outage meets the run decides which gives up first: a batch's retries (the
budget) or the driver's offset requests; either way the run ends with the broker named.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest
import yaml

from tests.faults.conftest import FaultStack
from tests.faults.harness import BOUND_S, FaultWorkload

READER_TIMEOUTS = {
    "kafkaConsumer.pollTimeoutMs": "2000",
    "kafka.default.api.timeout.ms": "4000",
    "kafka.request.timeout.ms": "2000",
    "fetchOffset.numRetries": "30",
}
BUDGET_S = 90
"""Room for the broker's restart (a JVM start, slow on a loaded machine) after the short outage."""
SHORT_OUTAGE_S = 12.0
"""Longer than a task waits for the broker (a poll and an offset request), shorter than the budget."""


@pytest.fixture()
def kafka_bootstrap(fault_stack: FaultStack) -> str:
    """The private broker: the workload is produced to it and the run reads from it."""
    return fault_stack.service("kafka").address


def with_reader_timeouts(faulted: FaultWorkload) -> None:
    pipeline_file = faulted.project.pipeline_file
    pipeline = yaml.safe_load(pipeline_file.read_text())
    for source in pipeline["sources"].values():
        source.setdefault("options", {}).update(READER_TIMEOUTS)
    pipeline_file.write_text(yaml.safe_dump(pipeline, sort_keys=False))


@pytest.mark.soak  # too heavy for make test's 25-minute budget: make soak (see docs/devstack.md)
def test_a_broker_outage_is_ridden_out_inside_the_budget_and_stops_the_run_past_it(
    fault_workload: Callable[..., FaultWorkload], fault_stack: FaultStack, kafka_bootstrap: str, postgres_dsn: str
) -> None:
    faulted = fault_workload(changes=8_000, seed=211, max_offsets=300)
    with_reader_timeouts(faulted)
    faulted.project.env["CDCSYNC__RETRY__BUDGET_S"] = str(BUDGET_S)
    process = faulted.start()
    faulted.wait_batches(1, process)

    fault_stack.kill("kafka")
    time.sleep(SHORT_OUTAGE_S)
    try:
        ridden_out = faulted.moving_again(fault_stack.restart("kafka"), process)
    except AssertionError:
        _stdout, stderr = process.communicate(timeout=BOUND_S)
        raise AssertionError(f"the run did not ride the outage out:\n{stderr[-4000:]}") from None

    fault_stack.kill("kafka")  # and it stays away until the run gives up
    _stdout, stderr = process.communicate(timeout=BOUND_S)
    assert process.returncode == 1, stderr[-4000:]
    error = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1, stderr[-4000:]
    assert f"the Kafka broker at {kafka_bootstrap} did not answer" in error[0], error
    assert "hint: check that the brokers in CDCSYNC__KAFKA__BOOTSTRAP_SERVERS are up" in stderr, stderr[-4000:]
    assert "Traceback" not in stderr
    # Said at most once per outage, never per attempt; a batch's retries name the budget they spent.
    retried = stderr.count("retrying with backoff")
    assert retried <= 2 and stderr.count("succeeded again after") <= 1, stderr[-4000:]
    assert "gave up after" not in error[0] or f"retry budget {BUDGET_S}s" in error[0], error
    with psycopg.connect(postgres_dsn) as conn:
        dead = conn.execute("SELECT count(*) FROM cdcsync.dead_letters WHERE pipeline = %s", (faulted.pipeline,))
        assert dead.fetchone() == (0,)

    started = fault_stack.restart("kafka")
    faulted.run()
    recovered = time.monotonic() - started
    faulted.assert_exact(f"Kafka broker down {SHORT_OUTAGE_S:.0f} s (under the retry budget)", 1, ridden_out)
    faulted.assert_exact(f"Kafka broker down past the retry budget ({BUDGET_S} s)", 1, recovered)
