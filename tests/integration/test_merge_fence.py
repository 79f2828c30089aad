"""The merge fence against a real Postgres: a merge commits only while its run holds the pipeline's lock, and a run
that takes the lock over waits for the merges already inside the fence (:mod:`cdcsync.db.fence`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdcsync.core.errors import ServiceError
from cdcsync.db.fence import Fenced, fence_key, key_halves
from cdcsync.runtime.lock import PipelineLock
from cdcsync.sinks.postgres import PostgresUpsertSink
from tests.integration.test_pipeline_lock import terminate_session_of
from tests.integration.test_postgres_sink import change, land, live, make_sink

BOUND_S = 60.0
"""Upper bound on any wait below; reaching it fails the test, it never decides a pass."""
PIPELINE = "sinktest"  # the pipeline of test_postgres_sink's sink


@pytest.fixture()
def locks() -> Iterator[list[PipelineLock]]:
    made: list[PipelineLock] = []
    yield made
    for lock in made:
        lock.release()


@pytest.fixture()
def fenced_sink(postgres_dsn: str, tmp_path: Path, locks: list[PipelineLock]) -> PostgresUpsertSink:
    """A mirror sink whose merges pass the fence of a lock this test holds (``locks[0]``)."""
    sink = make_sink("hard", postgres_dsn, tmp_path)
    lock = PipelineLock(postgres_dsn, PIPELINE)
    locks.append(lock)
    lock.acquire()
    sink.fence = lock.fence
    return sink


def ledgered(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT batch_id FROM cdcsync.batch_ledger WHERE pipeline = %s ORDER BY 1", (PIPELINE,))
        return [row[0] for row in rows]


def test_a_run_that_was_taken_over_merges_nothing(
    fenced_sink: PostgresUpsertSink, postgres_dsn: str, locks: list[PipelineLock]
) -> None:
    assert land(fenced_sink, 0, [change("c", 1, 10, "owner")]) == 1
    terminate_session_of(postgres_dsn, PIPELINE)  # its lock session ends: a Postgres restart, a network cut
    successor = PipelineLock(postgres_dsn, PIPELINE)
    locks.append(successor)
    successor.acquire()  # another run takes the pipeline over

    with pytest.raises(Fenced, match=r"another run took over .* this batch was not merged") as fenced:
        land(fenced_sink, 1, [change("u", 1, 11, "after the takeover")])
    assert not fenced.value.retriable and not fenced.value.user_error  # exit 1, no retry
    assert live(fenced_sink)[1]["Name"] == "owner"
    assert ledgered(postgres_dsn) == [0]


def test_a_lock_session_that_ended_fails_the_merge_retriably_until_the_run_takes_it_again(
    fenced_sink: PostgresUpsertSink, postgres_dsn: str, locks: list[PipelineLock]
) -> None:
    terminate_session_of(postgres_dsn, PIPELINE)
    with pytest.raises(ServiceError, match="nobody holds the lock") as ended:
        land(fenced_sink, 0, [change("c", 1, 10, "x")])
    assert ended.value.retriable
    assert ledgered(postgres_dsn) == []
    locks[0].ensure_held()  # what the batch's next attempt does first
    assert land(fenced_sink, 0, [change("c", 1, 10, "x")]) == 1
    assert ledgered(postgres_dsn) == [0]


def fence_waiters(dsn: str) -> int:
    """Sessions waiting for the pipeline's fence key (a new owner at its barrier)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid::bigint = %(classid)s AND objid::bigint = %(objid)s",
            key_halves(fence_key(PIPELINE)),
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_new_owner_waits_for_the_merge_already_inside_the_fence(
    fenced_sink: PostgresUpsertSink, postgres_dsn: str, locks: list[PipelineLock]
) -> None:
    owner = locks[0]
    successor = PipelineLock(postgres_dsn, PIPELINE)
    locks.append(successor)
    failure: list[BaseException] = []

    def take_over() -> None:
        try:
            successor.acquire(wait=True)
        except BaseException as error:  # reported by the test thread below
            failure.append(error)

    with psycopg.connect(postgres_dsn) as merging, merging.transaction():
        owner.fence.check(merging)  # a merge of the owner has passed the fence and has not committed yet
        terminate_session_of(postgres_dsn, PIPELINE)
        thread = threading.Thread(target=take_over)
        thread.start()
        deadline = time.monotonic() + BOUND_S
        while fence_waiters(postgres_dsn) == 0:  # the successor holds the lock and waits at its barrier
            assert thread.is_alive() and time.monotonic() < deadline, failure
            time.sleep(0.05)
        assert not successor.held
    thread.join(BOUND_S)  # the merge ended: the successor goes on
    assert not failure, failure
    assert successor.held
    with pytest.raises(Fenced):
        land(fenced_sink, 0, [change("c", 1, 10, "x")])
