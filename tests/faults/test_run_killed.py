"""``cdcsync run`` SIGKILLed (with its JVM) at random moments, again and again: decoding, staging, merging,
committing the checkpoint. Each restart replays the batch in flight; the ledger skips what landed, ClickHouse's
insert tokens drop what was inserted twice. ``make test`` kills 5 times, ``make soak`` 100 times in 1M changes.

Without the ClickHouse sink, a batch's merges run while the next batch stages (``run.overlap_merges``), so a kill
also lands between Spark's commit of a batch and the end of its merges: the restart runs that batch again."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from cdcsync.runtime.checkpoint import UNMERGED_MARKER, last_committed
from tests.e2e.conftest import ledger_batches
from tests.faults.harness import BOUND_S, FaultWorkload


@pytest.mark.parametrize(
    ("changes", "kills", "max_offsets", "drain_bound_s", "clickhouse_sink"),
    [
        # about 44 batches: a life lands several in the seconds before its kill, and 6,000 changes in batches of 700
        # let the fourth or fifth life drain the topic before it could be killed (with merges overlapped, then, on a
        # faster host, without)
        pytest.param(10_000, 5, 250, BOUND_S, True, id="short"),
        pytest.param(10_000, 5, 250, BOUND_S, False, id="short-merges-overlapped"),
        # the last run drains what 100 lives left: hundreds of thousands of changes, more than one command's bound
        pytest.param(1_000_000, 100, 8_000, 6 * BOUND_S, True, id="soak", marks=pytest.mark.soak),
        pytest.param(1_000_000, 100, 8_000, 6 * BOUND_S, False, id="soak-merges-overlapped", marks=pytest.mark.soak),
    ],
)
def test_run_sigkilled_at_random_moments(
    fault_workload: Callable[..., FaultWorkload],
    changes: int,
    kills: int,
    max_offsets: int,
    drain_bound_s: float,
    clickhouse_sink: bool,
) -> None:
    faulted = fault_workload(
        changes=changes,
        keys=max(changes // 10, 500),
        seed=2026,
        max_offsets=max_offsets,
        clickhouse_sink=clickhouse_sink,
    )
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
    what = "cdcsync run SIGKILLed" + ("" if clickhouse_sink else " (merges overlapped)")
    faulted.assert_exact(what, kills, max(recoveries))


@pytest.mark.parametrize("transform", [False, True], ids=["direct", "through-a-transform"])
def test_run_sigkilled_after_spark_committed_a_batch_its_merges_had_not_landed(
    fault_workload: Callable[..., FaultWorkload], postgres_dsn: str, transform: bool
) -> None:
    """Deterministic: the mirror is locked, so a batch's overlapped merges wait while Spark commits the batch and
    the next one stages; the run is killed there. The restart must run that batch again (the checkpoint's marker),
    not skip it, and not refuse to start because the ledger lacks a batch the checkpoint committed. The mirror
    reads the source directly, or through a SQL transform (the graph path)."""
    faulted = fault_workload(
        changes=6_000, keys=600, seed=7, max_offsets=700, clickhouse_sink=False, transform=transform
    )
    checkpoint = faulted.project.root / "state" / "checkpoints" / faulted.pipeline / "orders"
    marker = checkpoint / UNMERGED_MARKER
    process = faulted.start()
    faulted.wait_batches(2, process)  # both sinks have batch 0
    with psycopg.connect(postgres_dsn) as blocker:
        blocker.execute('LOCK TABLE app."Orders Mirror" IN EXCLUSIVE MODE')  # reads go on, the merge's writes wait
        # The lock may have waited for a merge in flight: that batch is ledgered a moment before its marker goes,
        # so wait for a batch that is committed, marked and not merged (the next one, whose merge the lock holds).
        deadline = time.monotonic() + BOUND_S
        while not _held(_marked(marker), checkpoint, ledger_batches(postgres_dsn, faulted.pipeline)):
            assert process.poll() is None, "the run ended before a batch was committed with its merges held"
            assert time.monotonic() < deadline, "Spark committed no batch while the mirror was locked"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    rerun = faulted.run()
    assert "running it again from the same offsets" in rerun.stderr, rerun.stderr[-4000:]
    assert not marker.exists()
    what = "cdcsync run SIGKILLed, a batch committed before its merges" + (", through a transform" if transform else "")
    faulted.assert_exact(what, 1, None)


def _held(unmerged: int | None, checkpoint: Path, ledgered: dict[str, list[int]]) -> bool:
    return (
        unmerged is not None and last_committed(checkpoint) >= unmerged and unmerged not in ledgered.get("mirror", [])
    )


def _marked(marker: Path) -> int | None:
    """The batch the checkpoint's marker names, if there is one now (the run removes it as merges end)."""
    try:
        return int(marker.read_text())
    except FileNotFoundError:
        return None
