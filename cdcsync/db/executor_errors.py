"""Errors raised on executors reach the driver wrapped in Spark's exception text; recover what matters from it.

Executor-side code raises ``RuntimeError("<what failed> <marker>")``; Spark wraps it (with a Python traceback
and JVM frames) into the exception the driver sees. The markers survive the wrapping and carry the
classification: transient (retry), or an undecodable message under ``on_decode_error: fail`` (the user's input).
"""

from __future__ import annotations

import re

from cdcsync.core.errors import CdcsyncError, SinkError, UndecodableMessage
from cdcsync.db.retry import classify_postgres_error

RETRIABLE_MARKER = "[cdcsync:retriable]"
DECODE_FAILURE_MARKER = "[cdcsync:decode-failure]"

_PYTHON_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception): (?P<message>.+)$", re.MULTILINE)


def task_failure(doing: str, error: Exception) -> RuntimeError:
    """What an executor task raises for a failed Postgres write: the message, marked when a retry may help."""
    marker = f" {RETRIABLE_MARKER}" if classify_postgres_error(error) else ""
    return RuntimeError(f"{doing}: {str(error).strip()}{marker}")


def executor_failure(error: BaseException) -> tuple[str, bool]:
    """(the innermost Python error message, whether it was marked retriable)."""
    text = str(error)
    messages = [m.group("message").strip() for m in _PYTHON_ERROR_LINE.finditer(text)]
    detail = messages[-1] if messages else (text.strip().splitlines() or [type(error).__name__])[0]
    for marker in (RETRIABLE_MARKER, DECODE_FAILURE_MARKER):
        detail = detail.replace(marker, "")
    return detail.strip()[:1000], RETRIABLE_MARKER in text


def executor_error(error: BaseException, doing: str) -> CdcsyncError:
    """The CdcsyncError a failed Spark job stands for: a decode failure, or a (maybe transient) sink failure."""
    detail, retriable = executor_failure(error)
    if DECODE_FAILURE_MARKER in str(error):
        return UndecodableMessage(
            detail,
            hint="fix the producer, or set on_decode_error: dlq to route such messages to cdcsync.dead_letters",
        )
    return SinkError(f"{doing}: {detail}", retriable=retriable)
