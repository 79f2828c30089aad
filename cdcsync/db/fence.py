"""The fence that keeps a merge from committing once its run no longer owns the pipeline.

A run owns its pipeline while one of its Postgres sessions holds the pipeline's session-level advisory lock
(:func:`lock_key`; :mod:`cdcsync.runtime.lock` takes it). That session can end under a running run (a Postgres
restart, ``pg_terminate_backend``, an idle or network timeout) and a second run can then take the lock. A check
before each batch is not enough: a batch already past it would still merge and ledger its rows while the new owner
stages. So every merge transaction checks ownership itself (:meth:`MergeFence.check`), and a run that takes the
lock waits for the merges already inside the fence to end (:func:`barrier`):

* the merge takes the pipeline's *fence* key (:func:`fence_key`, another advisory key) in shared mode for its own
  transaction, then reads from ``pg_locks`` which session holds the lock key. Only when it is the session its run
  holds the lock with does the merge go on; it then commits with the shared fence key still held;
* a run that has just taken the lock takes the fence key exclusively once, and lets go (:func:`barrier`). That
  waits for every merge holding it in shared mode, and a merge starting after it finds the lock held by the new
  owner.

So a merge commits only if its run held the lock when it checked, and no new owner gets past its barrier (and so
stages or merges anything) before that merge has ended. A merge that finds another session holding the lock stops
the run (:class:`Fenced`, not retriable); one that finds the lock free (its session ended, nobody took it)
fails retriably, and the batch's retry takes the lock again first. Two statements per merge; no table.
"""

from __future__ import annotations

import hashlib
from typing import Any

from cdcsync.core.errors import ServiceError
from cdcsync.sql.render import render


class Fenced(ServiceError):
    """Another run took the pipeline's lock after this run's lock session ended: this run merges nothing more."""


def _key(purpose: str, pipeline: str) -> int:
    digest = hashlib.blake2b(f"cdcsync pipeline {purpose}\0{pipeline}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def lock_key(pipeline: str) -> int:
    """The advisory lock key of ``pipeline``: a signed 64-bit number, the same on every machine and release."""
    return _key("lock", pipeline)


def fence_key(pipeline: str) -> int:
    """The key merges take in shared mode and a new owner once exclusively (:func:`barrier`)."""
    return _key("fence", pipeline)


def key_halves(key: int) -> dict[str, int]:
    """``classid`` and ``objid`` of ``key`` as pg_locks shows them."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return {"classid": unsigned >> 32, "objid": unsigned & 0xFFFF_FFFF}


def lock_session(conn: Any, pipeline: str) -> tuple[int, str | None, Any, str | None] | None:
    """(backend pid, application_name, session start, client address) of the session holding ``pipeline``'s
    lock in ``conn``'s database; None when nobody holds it."""
    row = conn.execute(render("postgres/runtime/pipeline_lock_holder.sql.j2"), key_halves(lock_key(pipeline)))
    found = row.fetchone()
    return None if found is None else (int(found[0]), found[1], found[2], found[3])


def barrier(conn: Any, pipeline: str) -> None:
    """On the session that has just taken the lock: wait until no merge of an earlier owner is inside the fence."""
    conn.execute(render("postgres/runtime/pipeline_fence_barrier.sql.j2"), {"key": fence_key(pipeline)})


class MergeFence:
    """One run's ownership of a pipeline, as its merges check it. :mod:`cdcsync.runtime.lock` keeps
    :attr:`holder` up to date (the backend pid of the session holding the lock for this run, None while none
    does)."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.holder: int | None = None

    def check(self, conn: Any) -> None:
        """Inside a merge transaction, before it writes: go on only while this run holds the pipeline's lock (see
        the module doc). Raises :class:`Fenced` when another session holds it, a retriable error when nobody does."""
        conn.execute(render("postgres/runtime/pipeline_fence_enter.sql.j2"), {"key": fence_key(self.pipeline)})
        session = lock_session(conn, self.pipeline)
        if session is not None and self.holder is not None and session[0] == self.holder:
            return
        if session is None:
            raise ServiceError(
                f"pipeline '{self.pipeline}': this run's lock session ended (nobody holds the lock); not merging "
                "until the run holds it again",
                retriable=True,
            )
        raise Fenced(
            f"pipeline '{self.pipeline}': another run took over (Postgres backend pid {session[0]}, "
            f"{session[1] or 'no application name'}) after this run's lock session ended; this batch was not merged "
            "and this run stops",
            hint="the run that holds the lock goes on and replays the batch; nothing is lost",
            retriable=False,
        )
