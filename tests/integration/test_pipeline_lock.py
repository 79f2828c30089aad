"""The pipeline lock against a real Postgres: one holder per pipeline, named to the others, gone with its session."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import psycopg
import pytest

from cdcsync.core.errors import PipelineLocked, ServiceError
from cdcsync.runtime.lock import PipelineLock, lock_holder

BOUND_S = 60.0
"""Upper bound on any wait below; reaching it fails the test, it never decides a pass."""

HOLD_IN_SUBPROCESS = """
import sys, time
from cdcsync.runtime.lock import PipelineLock
lock = PipelineLock(sys.argv[1], sys.argv[2])
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture()
def locks(postgres_dsn: str) -> Iterator[list[PipelineLock]]:
    """PipelineLocks made by the test, released afterwards."""
    made: list[PipelineLock] = []
    yield made
    for lock in made:
        lock.release()


def new_lock(locks: list[PipelineLock], dsn: str, pipeline: str = "shop") -> PipelineLock:
    lock = PipelineLock(dsn, pipeline)
    locks.append(lock)
    return lock


def acquire_within_bound(lock: PipelineLock) -> None:
    """``acquire(wait=True)``, made to fail (stopped) if the lock is still taken after :data:`BOUND_S`."""
    stop = threading.Event()
    timer = threading.Timer(BOUND_S, stop.set)
    timer.start()
    try:
        lock.acquire(wait=True, stop=stop)
    finally:
        timer.cancel()


def test_second_acquire_is_refused_naming_the_holder(postgres_dsn: str, locks: list[PipelineLock]) -> None:
    first = new_lock(locks, postgres_dsn)
    first.acquire()
    with pytest.raises(PipelineLocked) as refused:
        new_lock(locks, postgres_dsn).acquire()
    message = str(refused.value)
    assert f"pid {os.getpid()} on host {socket.gethostname()} since " in message
    assert "pipeline 'shop' is already running" in message
    assert refused.value.user_error  # exit 2
    assert refused.value.hint is not None and "--wait" in refused.value.hint

    with psycopg.connect(postgres_dsn) as conn:
        holder = lock_holder(conn, "shop")
    assert holder is not None
    assert (holder.pid, holder.host) == (os.getpid(), socket.gethostname())
    assert holder.since is not None


def test_released_when_the_holder_closes_its_session(postgres_dsn: str, locks: list[PipelineLock]) -> None:
    first = new_lock(locks, postgres_dsn)
    first.acquire()
    first.release()
    with psycopg.connect(postgres_dsn) as conn:
        assert lock_holder(conn, "shop") is None
    second = new_lock(locks, postgres_dsn)
    second.acquire()
    assert second.held


def test_released_when_the_holder_is_sigkilled(postgres_dsn: str, locks: list[PipelineLock]) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_IN_SUBPROCESS, postgres_dsn, "shop"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(PipelineLocked, match=f"pid {holder.pid} on host "):
            new_lock(locks, postgres_dsn).acquire()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    successor = new_lock(locks, postgres_dsn)
    acquire_within_bound(successor)
    assert successor.held


def test_different_pipelines_do_not_block_each_other(postgres_dsn: str, locks: list[PipelineLock]) -> None:
    shop, billing = new_lock(locks, postgres_dsn, "shop"), new_lock(locks, postgres_dsn, "billing")
    shop.acquire()
    billing.acquire()
    assert shop.held and billing.held
    with pytest.raises(PipelineLocked):
        new_lock(locks, postgres_dsn, "billing").acquire()


def test_wait_takes_the_lock_once_the_holder_releases_it(
    postgres_dsn: str, locks: list[PipelineLock], caplog: pytest.LogCaptureFixture
) -> None:
    first, waiter = new_lock(locks, postgres_dsn), new_lock(locks, postgres_dsn)
    first.acquire()
    announced = threading.Event()

    class Announced(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting for it" in record.getMessage():
                announced.set()

    handler = Announced()
    logging.getLogger("cdcsync.runtime.lock").addHandler(handler)
    failure: list[BaseException] = []

    def wait_for_it() -> None:
        try:
            acquire_within_bound(waiter)
        except BaseException as error:  # reported by the test thread below
            failure.append(error)

    caplog.set_level(logging.WARNING, logger="cdcsync.runtime.lock")
    thread = threading.Thread(target=wait_for_it)
    try:
        thread.start()
        assert announced.wait(BOUND_S)
        thread.join(6.0)  # a few polls: still waiting, and said so only once
        assert thread.is_alive() and not waiter.held
        first.release()
        thread.join(BOUND_S)
    finally:
        logging.getLogger("cdcsync.runtime.lock").removeHandler(handler)
    assert not failure, failure
    assert waiter.held
    waiting = [r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage()]
    assert len(waiting) == 1, waiting
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in waiting[0]


def test_a_stop_ends_the_wait(postgres_dsn: str, locks: list[PipelineLock]) -> None:
    new_lock(locks, postgres_dsn).acquire()
    stop = threading.Event()
    stop.set()
    waiter = new_lock(locks, postgres_dsn)
    with pytest.raises(ServiceError, match="stopped while waiting for its lock"):
        waiter.acquire(wait=True, stop=stop)
    assert not waiter.held


def terminate_session_of(dsn: str, pipeline: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        holder = lock_holder(conn, pipeline)
        assert holder is not None
        conn.execute("SELECT pg_terminate_backend(%s)", (holder.backend_pid,))
        for _ in range(200):  # until the backend is gone (and its lock with it)
            if lock_holder(conn, pipeline) is None:
                return
            conn.execute("SELECT pg_sleep(0.05)")
    raise AssertionError("the terminated session still holds the lock")


def test_ensure_held_takes_the_lock_again_after_its_session_ended(postgres_dsn: str, locks: list[PipelineLock]) -> None:
    lock = new_lock(locks, postgres_dsn)
    lock.acquire()
    lock.ensure_held()  # still held: nothing to do
    terminate_session_of(postgres_dsn, "shop")
    lock.ensure_held()
    assert lock.held
    with pytest.raises(PipelineLocked):
        new_lock(locks, postgres_dsn).acquire()


def test_ensure_held_stops_the_run_when_another_took_the_lock(postgres_dsn: str, locks: list[PipelineLock]) -> None:
    lock = new_lock(locks, postgres_dsn)
    lock.acquire()
    terminate_session_of(postgres_dsn, "shop")
    new_lock(locks, postgres_dsn).acquire()
    with pytest.raises(ServiceError, match=r"lost its lock .* holds it now") as lost:
        lock.ensure_held()
    assert not lost.value.retriable and not lost.value.user_error  # exit 1, and no retry loop
    assert not lock.held
