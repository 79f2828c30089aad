"""Errors raised on executors reach the driver wrapped in Spark's exception text; recover what matters from it.

Executor-side writers raise ``RuntimeError("<what failed> [cdcsync:retriable]")``; Spark wraps it (with a Python
traceback and JVM frames) into the exception the driver sees. The classification marker survives the wrapping.
"""

from __future__ import annotations

import re

RETRIABLE_MARKER = "[cdcsync:retriable]"

_PYTHON_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception): (?P<message>.+)$", re.MULTILINE)


def executor_failure(error: BaseException) -> tuple[str, bool]:
    """(the innermost Python error message, whether it was marked retriable)."""
    text = str(error)
    messages = [m.group("message").strip() for m in _PYTHON_ERROR_LINE.finditer(text)]
    detail = messages[-1] if messages else (text.strip().splitlines() or [type(error).__name__])[0]
    retriable = RETRIABLE_MARKER in text
    return detail.replace(RETRIABLE_MARKER, "").strip()[:1000], retriable
