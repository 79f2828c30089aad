"""Transient-or-terminal classification of I/O failures, and the backoff loop that retries only transient ones.

Classification happens where the error is raised (by SQLSTATE, never by message text), so the streaming loop
never retries a bug or a bad migration and never gives up on a restarting database.

The loop has a budget in seconds (:class:`RetryBudget`, ``CDCSYNC__RETRY__BUDGET_S``), not in attempts: a
dependency that is away (Postgres restarting, ClickHouse stopped, a broker failing over) is waited for with
backoff for up to that long, and then the error is raised with the time spent, so ``run`` exits 1 with the reason.
An outage is logged twice, when it starts and when it ends, whatever the number of attempts in between; the
``on_wait`` callback tells the live view the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class RetryBudget:
    """How long transient failures of one piece of work are retried, and how the waits between attempts grow."""

    seconds: float = 120.0
    """Time from the first failure after which the next wait would be one too many: the error is raised."""
    first_delay_s: float = 0.5
    max_delay_s: float = 15.0


WaitReporter = Callable[[str | None], None]
"""Told what is being waited for (a message) when an outage starts, and None when it ends."""


def with_retries(
    action: Callable[[], T],
    *,
    describe: str,
    budget: RetryBudget | None = None,
    attempts: int | None = None,
    on_wait: WaitReporter | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``action``; on a retriable CdcsyncError wait with exponential backoff and try again, for up to
    ``budget.seconds`` from the first failure (and at most ``attempts`` attempts when given)."""
    budget = budget or RetryBudget()
    delay = budget.first_delay_s
    failed_at: float | None = None
    attempt = 0
    while True:
        attempt += 1
        try:
            result = action()
        except CdcsyncError as error:
            if not error.retriable:
                raise
            now = clock()
            if failed_at is None:
                failed_at = now
                log.warning("%s failed, retrying with backoff for up to %.0fs: %s", describe, budget.seconds, error)
                if on_wait is not None:
                    on_wait(f"{describe}: {error}")
            else:
                log.debug("%s failed again (attempt %d): %s", describe, attempt, error)
            spent = now - failed_at
            if spent + delay > budget.seconds or (attempts is not None and attempt >= attempts):
                if on_wait is not None:
                    on_wait(None)
                raise error.add_context(
                    f"{describe}: gave up after {attempt} attempt(s) over {spent:.0f}s (retry budget "
                    f"{budget.seconds:.0f}s, CDCSYNC__RETRY__BUDGET_S)"
                ) from None
            sleep(delay)
            delay = min(delay * 2, budget.max_delay_s)
            continue
        if failed_at is not None:
            log.warning("%s succeeded again after %d attempts (%.1fs)", describe, attempt, clock() - failed_at)
            if on_wait is not None:
                on_wait(None)
        return result
