"""freeze_long_lived keeps a reused PySpark worker's long-lived objects out of the collection PySpark runs after
every task, and does so only in such a worker and only during its first tasks."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

from cdcsync.core import worker_heap

pytestmark = pytest.mark.unit


@pytest.fixture
def heap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(worker_heap, "_frozen", (0, 0))
    gc.unfreeze()
    yield
    gc.unfreeze()  # this test process is no worker: give its objects back to the collector


def test_a_reused_worker_freezes_during_its_first_tasks_only(heap: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    counts = []
    for _ in range(worker_heap.FREEZES_PER_WORKER + 2):
        worker_heap.freeze_long_lived()
        counts.append(gc.get_freeze_count())
        gc.unfreeze()  # so that each count shows whether this call froze
    assert all(count > 0 for count in counts[: worker_heap.FREEZES_PER_WORKER])
    assert counts[worker_heap.FREEZES_PER_WORKER :] == [0, 0]


def test_elsewhere_nothing_is_frozen(heap: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_REUSE_WORKER", raising=False)
    worker_heap.freeze_long_lived()
    assert gc.get_freeze_count() == 0


def test_a_fork_counts_its_own_tasks(heap: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    monkeypatch.setattr(worker_heap, "_frozen", (os.getpid() + 1, worker_heap.FREEZES_PER_WORKER))  # the parent's
    worker_heap.freeze_long_lived()
    assert gc.get_freeze_count() > 0
