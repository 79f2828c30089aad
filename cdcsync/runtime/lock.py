"""One runner per pipeline: a Postgres advisory lock held by ``cdcsync run`` for its whole life.

Two runs of one pipeline (an overlapping cron ``run --available-now``, a rolling restart whose new pod starts
before the old one stops) would share the pipeline's staging tables and checkpoint: one run's TRUNCATE of a stage
can empty the other's, and a batch is then ledgered with rows missing. So a run first takes the pipeline's lock
in the target database, before Spark starts and before anything touches a stage or the checkpoint:

* The lock is a **session-level advisory lock** (``pg_try_advisory_lock``) on a 64-bit key derived from the
  pipeline's name (:func:`lock_key`), on a connection of its own kept open for the run. Different pipelines have
  different keys and never block each other; the same name in another database is another lock (advisory locks
  are per database, like the ledger).
* It lives and dies with that session. A run that ends, fails or is SIGKILLed closes its socket and Postgres
  releases the lock at once; a holder whose host vanished without closing it is found by the session's TCP
  keepalives (set on both ends, :data:`KEEPALIVE_IDLE_S` + :data:`KEEPALIVE_INTERVAL_S` x
  :data:`KEEPALIVE_COUNT` seconds) and its session ended. No lease to renew, no stale row to clean up, no new
  table: a crashed holder can never keep the pipeline locked.
* The holder is named from Postgres itself: its connection's ``application_name`` is ``cdcsync <pid>@<host>
  <pipeline>`` and it connects to take the lock, so ``pg_locks`` joined with ``pg_stat_activity`` gives the
  holder's pid, host and since when (its session's start). A second run exits 2 (:class:`PipelineLocked`) with
  that; ``run --wait`` polls instead (every :data:`WAIT_POLL_MIN_S` growing to :data:`WAIT_POLL_MAX_S` seconds,
  the holder logged once per holder) and starts when the lock is free. ``cdcsync status`` shows the holder.
* A Postgres restart (or ``pg_terminate_backend`` on the lock's session) ends the session and releases the lock
  while the run goes on. The run therefore checks the lock before every attempt of a batch
  (:meth:`PipelineLock.ensure_held`): it takes it again when it is free, and stops (exit 1) when another run took
  it in between, before staging anything.
* That check alone would not fence a batch already past it when the session drops. So every merge transaction
  checks that the run still holds the lock (:attr:`PipelineLock.fence`, :mod:`cdcsync.db.fence`), and a run that
  takes the lock first waits for the merges already inside that check to end: a merge commits only while its run
  owns the pipeline, and a run that was fenced out stops (exit 1) without merging.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from cdcsync.config.settings import redact_dsn
from cdcsync.core.errors import PipelineLocked, ServiceError
from cdcsync.db.fence import MergeFence, barrier, lock_key, lock_session
from cdcsync.db.retry import classify_postgres_error
from cdcsync.sql.render import render

log = logging.getLogger(__name__)

KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
WAIT_POLL_MIN_S = 0.5
WAIT_POLL_MAX_S = 5.0
_APPLICATION_NAME_BYTES = 63
"""Postgres keeps the first NAMEDATALEN - 1 bytes of an application_name."""
_HOLDER_NAME = re.compile(r"^cdcsync (\d+)@(\S+)")
_REFUSED_RETRIES = 3
"""Attempts without ``--wait`` when the lock was refused but its holder was gone by the time it was read."""


@dataclass(frozen=True)
class LockHolder:
    """The session holding a pipeline's lock, as Postgres sees it."""

    backend_pid: int
    pid: int | None
    """The holder's process id on its host (None when its session was not opened by cdcsync)."""
    host: str | None
    since: datetime | None
    client_addr: str | None

    def describe(self) -> str:
        who = f"pid {self.pid} on host {self.host}" if self.pid is not None else "a session not opened by cdcsync"
        since = f" since {self.since.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" if self.since is not None else ""
        addr = f", client {self.client_addr}" if self.client_addr else ""
        return f"{who}{since} (Postgres backend pid {self.backend_pid}{addr})"


def lock_holder(conn: Any, pipeline: str) -> LockHolder | None:
    """Who holds ``pipeline``'s lock in ``conn``'s database, or None when nobody does."""
    row = lock_session(conn, pipeline)
    if row is None:
        return None
    backend_pid, application_name, since, client_addr = row
    match = _HOLDER_NAME.match(application_name or "")
    return LockHolder(
        backend_pid=int(backend_pid),
        pid=int(match.group(1)) if match else None,
        host=match.group(2) if match else None,
        since=since,
        client_addr=client_addr,
    )


def _application_name(pipeline: str) -> str:
    name = f"cdcsync {os.getpid()}@{socket.gethostname()} {pipeline}"
    return name.encode("ascii", "replace")[:_APPLICATION_NAME_BYTES].decode("ascii")


class PipelineLock:
    """The lock of one pipeline for one run: :meth:`acquire`, then :meth:`ensure_held` before each batch, then
    :meth:`release` (or use it as a context manager, which releases)."""

    def __init__(self, dsn: str, pipeline: str) -> None:
        self.dsn = dsn
        self.pipeline = pipeline
        self._conn: Any = None
        self._guard = threading.Lock()
        """ensure_held runs on every source's batch thread."""
        self.fence = MergeFence(pipeline)
        """What this run's merges check (:mod:`cdcsync.db.fence`): kept naming the session holding the lock."""

    @property
    def held(self) -> bool:
        return self._conn is not None

    def acquire(self, *, wait: bool = False, stop: threading.Event | None = None) -> None:
        """Take the lock, or raise :class:`PipelineLocked` naming its holder; with ``wait``, poll until it is free
        (a ``stop`` set meanwhile ends the wait with an error: the run did nothing)."""
        delay, announced, refused = WAIT_POLL_MIN_S, None, 0
        stop = stop or threading.Event()
        while True:
            holder = self._attempt()
            if self.held:
                if announced is not None:
                    log.warning("pipeline '%s': took the lock; starting", self.pipeline)
                return
            if not wait:
                refused += 1
                if holder is not None or refused >= _REFUSED_RETRIES:
                    raise self._locked(holder)
                continue
            if holder is not None and holder.backend_pid != announced:
                announced = holder.backend_pid
                log.warning(
                    "pipeline '%s' is running elsewhere: %s holds its lock; waiting for it (--wait)",
                    self.pipeline,
                    holder.describe(),
                )
            if stop.wait(delay):
                raise ServiceError(
                    f"pipeline '{self.pipeline}': stopped while waiting for its lock; nothing was run",
                    retriable=False,
                )
            delay = min(delay * 2, WAIT_POLL_MAX_S)

    def ensure_held(self) -> None:
        """Before a batch: confirm the lock's session still holds it; take it again if the session dropped and
        the lock is free; raise (not retriable) when another run took it meanwhile."""
        import psycopg

        with self._guard:
            if self._conn is not None:
                try:
                    holder = lock_holder(self._conn, self.pipeline)
                except psycopg.Error:
                    holder = None
                if holder is not None and holder.backend_pid == self._conn.info.backend_pid:
                    return
                self._close()
            holder = self._attempt()
            if self.held:
                log.warning("pipeline '%s': the lock's session had ended; took the lock again", self.pipeline)
                return
            raise ServiceError(
                f"pipeline '{self.pipeline}': lost its lock (its Postgres session ended) and "
                + (f"{holder.describe()} holds it now" if holder else "could not take it again")
                + "; stopping before the next batch so two runs never share staging tables",
                hint="the batch not yet committed is replayed by the next run; nothing is lost",
                retriable=False,
            )

    def release(self) -> None:
        with self._guard:
            self._close()

    def __enter__(self) -> PipelineLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    # -- internals ------------------------------------------------------------------------------------------
    def _attempt(self) -> LockHolder | None:
        """One try on a fresh session (its start is then the holder's "since"): keep it when the lock was taken,
        else close it and return who holds the lock (None if that holder was gone by the time it was read)."""
        import psycopg

        try:
            conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=10,
                application_name=_application_name(self.pipeline),
                keepalives=1,
                keepalives_idle=KEEPALIVE_IDLE_S,
                keepalives_interval=KEEPALIVE_INTERVAL_S,
                keepalives_count=KEEPALIVE_COUNT,
            )
        except psycopg.Error as error:
            raise self._service_error("connecting to take its lock", error) from None
        try:
            conn.execute(
                render(
                    "postgres/runtime/pipeline_lock_session.sql.j2",
                    idle=KEEPALIVE_IDLE_S,
                    interval=KEEPALIVE_INTERVAL_S,
                    count=KEEPALIVE_COUNT,
                )
            )
            row = conn.execute(
                render("postgres/runtime/pipeline_lock_try.sql.j2"), {"key": lock_key(self.pipeline)}
            ).fetchone()
            if row is not None and row[0]:
                # Named before the barrier: this run's own merges on other sources' threads may be inside the fence
                # and must pass it (the barrier waits for them); an earlier owner's merges then find it taken.
                self.fence.holder = conn.info.backend_pid
                barrier(conn, self.pipeline)
                self._conn = conn
                return None
            holder = lock_holder(conn, self.pipeline)
        except psycopg.Error as error:
            conn.close()
            raise self._service_error("taking its lock", error) from None
        conn.close()
        return holder

    def _close(self) -> None:
        self.fence.holder = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()  # ends the session, which releases the lock

    def _locked(self, holder: LockHolder | None) -> PipelineLocked:
        who = holder.describe() if holder is not None else "another session (gone by the time it was asked)"
        return PipelineLocked(
            f"pipeline '{self.pipeline}' is already running: {who} holds its lock in {redact_dsn(self.dsn)}",
            hint=(
                "two runs of one pipeline would share its staging tables and checkpoint; wait for that run to end, "
                "stop it, or start this one with `cdcsync run --wait` to take over when it ends. A crashed run's "
                "lock is released by Postgres when its connection goes"
            ),
        )

    def _service_error(self, doing: str, error: Exception) -> ServiceError:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return ServiceError(
            f"pipeline '{self.pipeline}': {doing} in Postgres at {redact_dsn(self.dsn)}: {first_line}",
            retriable=classify_postgres_error(error),
        )
