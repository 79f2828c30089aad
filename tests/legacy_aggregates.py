"""The aggregation-table layouts older cdcsync versions wrote: before sums and averages kept their state at full
precision, and before the trigger functions had a revision.

Tests that an upgrade migration follows an applied migration of that layout write their first migration with
:func:`legacy_layout` in force, as an older cdcsync would have.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from cdcsync.migrations import postgres


@contextmanager
def legacy_layout() -> Iterator[None]:
    """Sums kept in their declared type, float averages of exact columns summed in floats, no scale tracking."""
    real = postgres._aggregate_state

    def old(*args: Any) -> dict[str, Any]:
        state = real(*args)
        for entry in state["aggregates"]:
            entry.pop("scale_index", None)
            if entry["fn"] == "sum":
                entry["accumulator_type"] = entry["type"]
            elif entry["fn"] == "avg" and entry["type"] in ("double precision", "real"):
                entry["accumulator_type"] = "double precision"
        return state

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(postgres, "_aggregate_state", old)
        yield


@contextmanager
def first_trigger_revision() -> Iterator[None]:
    """The state an older cdcsync recorded before its trigger functions had a revision (revision 1)."""
    real = postgres._aggregate_state

    def old(*args: Any) -> dict[str, Any]:
        state = real(*args)
        state.pop("revision")
        return state

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(postgres, "_aggregate_state", old)
        yield
