"""Two runners of one pipeline (an overlapping cron ``run --available-now``, a rolling restart): exactly one runs.

Both share the pipeline's staging tables (and, on one host, its checkpoint), so without the pipeline lock one
run's TRUNCATE can empty the other's stage and a batch is ledgered with rows missing; runs on two hosts, a
checkpoint each, also land every batch twice. With it, the second run exits 2 naming the
first, or with ``--wait`` takes over when the first ends; the mirror then equals the source's final state and the
ledger holds every batch once.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from cdcsync.devstack import workload
from cdcsync.runtime.lock import lock_holder
from tests.e2e.conftest import Project, assert_each_batch_once, ledger_batches, orders_pipeline
from tests.e2e.test_upsert_pipeline import assert_hard_mirror_equals, assert_soft_mirror_matches

SINKS = ("mirror", "audit")
BOUND_S = 300.0
"""Upper bound on any wait below; reaching it fails the test, it never decides a pass."""


class Running:
    """A started ``cdcsync`` whose stderr is read as it comes (so the test can wait for a line)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str) -> None:
        deadline = time.monotonic() + BOUND_S
        while text not in self.stderr:
            assert self.process.poll() is None or self._reader.is_alive(), f"ended without {text!r}:\n{self.stderr}"
            assert time.monotonic() < deadline, f"no {text!r} yet:\n{self.stderr}"
            time.sleep(0.2)

    def finish(self) -> int:
        self.process.wait(timeout=BOUND_S)
        self._reader.join(timeout=30)
        return self.process.returncode


def holder_pid(dsn: str) -> int | None:
    with psycopg.connect(dsn) as conn:
        holder = lock_holder(conn, "e2e")
    return holder.pid if holder is not None else None


def test_two_runners_one_runs_the_other_is_refused_or_waits(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topic_name: str
) -> None:
    load = workload.generate(24_000, 3_000, seed=47, wrapped=True)
    workload.produce(kafka_bootstrap, topic_name, load.events[:12_000])
    project = make_project(orders_pipeline(topic_name, max_offsets_per_trigger=2_000))
    project.prepare()
    run = ("run", str(project.pipeline_file), "--available-now")

    # Started together, no --wait, as if on two hosts (a checkpoint each: nothing in Spark notices the other run):
    # one drains the topic, the other is turned away at once, naming it.
    elsewhere_env = {**project.env, "CDCSYNC__STATE_DIR": str(project.root / "state-elsewhere")}
    elsewhere = Project(project.root, project.pipeline_file, elsewhere_env)
    projects = [project, elsewhere]
    both = [Running(where.start(*run)) for where in projects]
    codes = [runner.finish() for runner in both]
    assert sorted(codes) == [0, 2], [runner.lines[-6:] for runner in both]
    winner, loser = both if codes[0] == 0 else both[::-1]
    project = projects[both.index(winner)]  # the checkpoint the pipeline goes on from
    assert f"pipeline 'e2e' is already running: pid {winner.process.pid} on host {socket.gethostname()}" in (
        loser.stderr
    ), loser.stderr
    assert "Traceback" not in loser.stderr and "starting Spark" not in loser.stderr
    assert sum(len(ids) for ids in assert_each_batch_once(postgres_dsn, "e2e", SINKS).values()) > 0

    # A streaming run holds the pipeline; a second one with --wait (a restart, same checkpoint) waits, and drains
    # the rest once the first stops.
    workload.produce(kafka_bootstrap, topic_name, load.events[12_000:])
    first = Running(project.start("run", str(project.pipeline_file)))
    deadline = time.monotonic() + BOUND_S
    while holder_pid(postgres_dsn) != first.process.pid:
        assert first.process.poll() is None and time.monotonic() < deadline, first.stderr[-3000:]
        time.sleep(0.2)
    status = project.cdcsync("status", str(project.pipeline_file)).stdout
    assert f"running: pid {first.process.pid} on host {socket.gethostname()} since " in status, status
    batches_before = sum(len(ids) for ids in ledger_batches(postgres_dsn, "e2e").values())
    second = Running(project.start(*run, "--wait"))
    second.wait_for_line("waiting for it")
    assert f"pid {first.process.pid} on host {socket.gethostname()}" in second.stderr
    while sum(len(ids) for ids in ledger_batches(postgres_dsn, "e2e").values()) <= batches_before:
        assert first.process.poll() is None and time.monotonic() < deadline, first.stderr[-3000:]
        time.sleep(0.2)
    assert holder_pid(postgres_dsn) == first.process.pid  # the waiting run has not started
    assert "starting Spark" not in second.stderr
    first.process.terminate()  # SIGTERM: the batch in flight finishes, the run exits 0 and lets go of the lock
    assert first.finish() == 0, first.stderr[-3000:]
    assert second.finish() == 0, second.stderr[-3000:]
    waited = second.stderr
    assert waited.index("waiting for it") < waited.index("took the lock") < waited.index("starting Spark")
    assert waited.count("waiting for it") == 1

    assert_hard_mirror_equals(postgres_dsn, load.expected)
    assert_soft_mirror_matches(postgres_dsn, load.expected)
    assert_each_batch_once(postgres_dsn, "e2e", SINKS)
    assert holder_pid(postgres_dsn) is None
    assert "running: none" in project.cdcsync("status", str(project.pipeline_file)).stdout
