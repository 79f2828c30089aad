"""``cdcsync run`` SIGKILLed (with its JVM) at random moments, again and again: decoding, staging, merging,
committing the checkpoint. Each restart replays the batch in flight; the ledger skips what landed, ClickHouse's
insert tokens drop what was inserted twice. ``make test`` kills 5 times, ``make soak`` 100 times in 1M changes."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable

import pytest

from tests.faults.harness import BOUND_S, FaultWorkload


@pytest.mark.parametrize(
    ("changes", "kills", "max_offsets", "drain_bound_s"),
    [
        pytest.param(6_000, 5, 700, BOUND_S, id="short"),
        # the last run drains what 100 lives left: hundreds of thousands of changes, more than one command's bound
        pytest.param(1_000_000, 100, 8_000, 6 * BOUND_S, id="soak", marks=pytest.mark.soak),
    ],
)
def test_run_sigkilled_at_random_moments(
    fault_workload: Callable[..., FaultWorkload], changes: int, kills: int, max_offsets: int, drain_bound_s: float
) -> None:
    faulted = fault_workload(changes=changes, keys=max(changes // 10, 500), seed=2026, max_offsets=max_offsets)
    rng = random.Random(2026)
    recoveries = []
    for _ in range(kills):
        process = faulted.start()
        # every life lands something, so the kills cannot starve the run
        recoveries.append(faulted.moving_again(time.monotonic(), process))
        time.sleep(rng.uniform(0.0, 2.0))  # then anywhere in the next batch
        assert process.poll() is None, "the run drained the topic before it could be killed: make it larger"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    started = time.monotonic()
    faulted.run(timeout=drain_bound_s)
    recoveries.append(time.monotonic() - started)
    faulted.assert_exact("cdcsync run SIGKILLed", kills, max(recoveries))
