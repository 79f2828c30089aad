"""Errors raised on executors reach the driver wrapped in Spark's exception text; recover what matters from it.

A task that fails on purpose raises :class:`~cdcsync.core.reports.ReportedFailure`, whose text carries a typed
:class:`~cdcsync.core.reports.Report` (a failed write, and whether a retry may help; an undecodable message). Spark
wraps it (with a Python traceback and JVM frames) into the exception the driver sees, and
:func:`executor_error` takes the report back out. Anything else is a bug or a crash: not retried.
"""

from __future__ import annotations

import re

from cdcsync.core.errors import CdcsyncError, SinkError, first_line
from cdcsync.core.reports import ReportedFailure, find_report, without_tokens, write_failed
from cdcsync.db.retry import classify_postgres_error

_PYTHON_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception): (?P<message>.+)$", re.MULTILINE)


def task_failure(doing: str, error: Exception) -> ReportedFailure:
    """What an executor task raises for a failed Postgres write: the message, and whether a retry may help."""
    return ReportedFailure(write_failed(f"{doing}: {str(error).strip()}", retriable=classify_postgres_error(error)))


def innermost_message(error: BaseException) -> str:
    """The innermost Python error message in a Spark-wrapped executor failure (its first line otherwise)."""
    text = str(error)
    messages = [m.group("message").strip() for m in _PYTHON_ERROR_LINE.finditer(text)]
    detail = messages[-1] if messages else first_line(error)
    return without_tokens(detail).strip()[:1000]


def executor_error(error: BaseException, doing: str, pipeline_file: str = "PIPELINE.yaml") -> CdcsyncError:
    """The CdcsyncError a failed Spark job stands for: what its task reported, else a sink failure (no retry)."""
    report = find_report(str(error))
    if report is not None:
        return report.error(doing, pipeline_file)
    return SinkError(f"{doing}: {innermost_message(error)}", retriable=False)
