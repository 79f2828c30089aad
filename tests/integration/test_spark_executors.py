"""The session's start-up check of its executors: they import the driver's cdcsync, or the run is refused
before any batch. Local mode's Python workers are processes of their own that import cdcsync afresh, like a
cluster's executors."""

from __future__ import annotations

from typing import Any

import pytest

import cdcsync
from cdcsync.core.errors import DependencyError
from cdcsync.runtime.spark import _start_python_workers

pytestmark = pytest.mark.integration


def test_executors_running_the_drivers_cdcsync_pass(spark: Any) -> None:
    _start_python_workers(spark)


def test_executors_of_another_version_are_refused(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cdcsync, "__version__", "0.0.0-driver")
    with pytest.raises(DependencyError, match=r"executors run cdcsync .*, the driver 0\.0\.0-driver"):
        _start_python_workers(spark)
