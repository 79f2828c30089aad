"""Postgres connections: from the settings, for the commands that talk to Postgres from the driver (``migrate``,
``run``'s start-up checks), with one message when the server cannot be reached; and kept for the next
micro-batch (:func:`reused_connection`), for the statements every batch runs.

Why keep them: a new connection is a new Postgres backend (a fork, authentication, catalog caches warmed again),
several milliseconds of the server's CPU and a few round trips. A micro-batch used to open one per sink for the
ledger lookup, one for the merge, and one per task and sink on the executors for the COPY: at a one-second
trigger that was most of what a small batch cost Postgres (docs/benchmarks.md, "Latency: commit to visible").
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import ServiceError

if TYPE_CHECKING:
    import psycopg

    from cdcsync.config.settings import Settings


def connect_from_settings(settings: Settings) -> psycopg.Connection[Any]:
    """A connection to ``CDCSYNC__POSTGRES__DSN``; an unreachable server is a retriable ServiceError (DSN
    redacted)."""
    import psycopg

    from cdcsync.config.settings import redact_dsn

    try:
        return psycopg.connect(settings.postgres_dsn, connect_timeout=10)
    except psycopg.OperationalError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "connection failed"
        raise ServiceError(
            f"connecting to Postgres at {redact_dsn(settings.postgres_dsn)}: {first_line}",
            hint="start the dev stack with `cdcsync dev up`, or set CDCSYNC__POSTGRES__DSN",
            retriable=True,
        ) from None


_KEPT = 8
"""Idle connections kept per process, whatever their DSN (the oldest is closed first): one per batch running at
once (a worker runs one task at a time, the driver one batch per source), with room for a second database (a test
process goes through many, each dropped after its test)."""
_idle: list[tuple[int, str, psycopg.Connection[Any]]] = []
_idle_lock = threading.Lock()


@contextlib.contextmanager
def reused_connection(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to ``dsn``, open or kept from an earlier caller in this process; kept for the next
    one when the caller is done with it and it is idle, closed when the caller raised.

    So a failure looks exactly as on a new connection: a kept connection is first checked with one round trip (the
    server may have restarted, or ended an idle session, since), and a dead one is replaced by a new one before
    the caller's first statement. A caller that wants a transaction opens one (``conn.transaction()``). Session
    state outlives a caller: everything the batches run here is transaction-scoped (``ON COMMIT DROP`` temp
    tables, ``pg_advisory_xact_lock_shared``), and no caller may ``SET`` anything for the session."""
    import psycopg

    conn = _take(dsn)
    if conn is None:
        conn = psycopg.connect(dsn, autocommit=True)
    try:
        yield conn
    except BaseException:
        conn.close()
        raise
    _keep(dsn, conn)


def _take(dsn: str) -> psycopg.Connection[Any] | None:
    """A kept connection to ``dsn`` that still answers, or None. Never one opened before a fork: the parent's."""
    import psycopg

    while True:
        with _idle_lock:
            found = next((i for i, (pid, d, _) in enumerate(_idle) if d == dsn and pid == os.getpid()), None)
            conn = None if found is None else _idle.pop(found)[2]
        if conn is None:
            return None
        try:
            conn.execute("SELECT 1")
            return conn
        except psycopg.Error:
            conn.close()


def _keep(dsn: str, conn: psycopg.Connection[Any]) -> None:
    import psycopg

    if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.close()
        return
    with _idle_lock:
        _idle.append((os.getpid(), dsn, conn))
        oldest = _idle.pop(0) if len(_idle) > _KEPT else None
    if oldest is not None and oldest[0] == os.getpid():  # a parent's is only dropped: closing it would end its session
        oldest[2].close()
