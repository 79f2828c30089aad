"""Transient-or-terminal classification of I/O failures, and the backoff loop that retries only transient ones.

Classification happens where the error is raised (by SQLSTATE, never by message text), so the streaming loop
never retries a bug or a bad migration and never gives up on a restarting database.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from cdcsync.core.errors import CdcsyncError

log = logging.getLogger(__name__)

T = TypeVar("T")

# SQLSTATE classes / codes worth retrying: connection exceptions, serialization failures and deadlocks,
# insufficient resources, operator intervention (admin shutdown, crash recovery), system errors.
_RETRIABLE_SQLSTATE_CLASSES = ("08", "53", "57", "58")
_RETRIABLE_SQLSTATES = {"40001", "40P01", "55P03"}


def classify_postgres_error(error: BaseException) -> bool:
    """True when retrying the same work may succeed (the database was unreachable, busy or restarting)."""
    import psycopg

    if isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError)) and not getattr(error, "sqlstate", None):
        return True  # could not connect / connection lost: no SQLSTATE at all
    sqlstate = getattr(error, "sqlstate", None) or ""
    return sqlstate in _RETRIABLE_SQLSTATES or sqlstate[:2] in _RETRIABLE_SQLSTATE_CLASSES


def with_retries(
    action: Callable[[], T],
    *,
    describe: str,
    attempts: int = 6,
    first_delay: float = 0.5,
    max_delay: float = 15.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``action``; on a retriable CdcsyncError wait with exponential backoff and try again."""
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except CdcsyncError as error:
            if not error.retriable or attempt == attempts:
                raise
            log.warning(
                "%s failed (attempt %d of %d), retrying in %.1fs: %s", describe, attempt, attempts, delay, error
            )
            sleep(delay)
            delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")
