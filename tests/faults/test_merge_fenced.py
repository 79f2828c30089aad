"""A run's lock is taken over while one of its batches is past the lock check and not yet merged.

The lock's session ends under a running run (a Postgres restart, a network cut, an idle timeout killing it) and
another run takes the pipeline: the first run's batch in flight must not merge beside the new owner. Without the
merge fence it did (its merges and ledger rows landed after the takeover); with it the merge finds the lock held
by another session, nothing of the batch is merged, and the run stops (exit 1) naming the takeover. The next run
lands everything, once.

The batch is held between its lock check and its merges deterministically: the test locks the mirror sink's
staging table, so the batch's COPY waits; the takeover happens then, and the stage is let go.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from cdcsync.core import names
from cdcsync.runtime.lock import PipelineLock
from tests.faults.harness import BOUND_S, FaultWorkload
from tests.integration.test_pipeline_lock import terminate_session_of


def waiting_on(dsn: str, table: sql.Composable) -> str | None:
    """The statement of a session waiting for a lock on ``table``, if any."""
    with psycopg.connect(dsn) as conn:
        query = sql.SQL(
            "SELECT a.query FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
            " WHERE l.relation = {}::regclass AND NOT l.granted LIMIT 1"
        ).format(sql.Literal(table.as_string(conn)))
        row = conn.execute(query).fetchone()
    return None if row is None else str(row[0])


def hold_a_batch_before_its_merge(dsn: str, stage: sql.Composable, process: Any) -> psycopg.Connection[Any]:
    """A transaction holding ``stage`` while the run's next batch waits for it to stage (its ``TRUNCATE`` of a
    crashed attempt's rows or its ``COPY``: past the batch's lock check, before its merge). A merge that waits
    instead (it had entered the fence before the lock was granted) is let through, and the test tries again."""
    deadline = time.monotonic() + BOUND_S
    while True:
        conn = psycopg.connect(dsn)
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(stage))
        while (waiting := waiting_on(dsn, stage)) is None:
            assert process.poll() is None and time.monotonic() < deadline, "the run ended before it staged again"
            time.sleep(0.05)
        if waiting.lstrip().upper().startswith(("TRUNCATE", "COPY")):
            return conn
        conn.close()  # rolls back: the merge goes on
        time.sleep(0.2)


def test_a_run_whose_lock_is_taken_over_mid_batch_merges_nothing_more(
    fault_workload: Callable[..., FaultWorkload], postgres_dsn: str
) -> None:
    faulted = fault_workload(changes=4_000, seed=89, max_offsets=500)
    stage = sql.Identifier(names.INTERNAL_SCHEMA, names.stage_table(faulted.pipeline, "mirror"))
    process = faulted.start()
    faulted.wait_batches(1, process)

    holding = hold_a_batch_before_its_merge(postgres_dsn, stage, process)
    terminate_session_of(postgres_dsn, faulted.pipeline)  # the run's lock session ends
    successor = PipelineLock(postgres_dsn, faulted.pipeline)
    successor.acquire()  # another run takes the pipeline over
    at_takeover = faulted.batches()
    holding.close()  # the batch stages and goes on to merge
    try:
        _stdout, stderr = process.communicate(timeout=BOUND_S)
        assert faulted.batches() == at_takeover, "the run merged a batch after another run took its lock over"
        assert process.returncode == 1, stderr[-4000:]
        assert "another run took over" in stderr and "this batch was not merged" in stderr, stderr[-4000:]
        assert "Traceback" not in stderr
    finally:
        successor.release()

    started = time.monotonic()
    faulted.run()
    faulted.assert_exact("the run's lock taken over mid-batch (merge fenced)", 1, time.monotonic() - started)
