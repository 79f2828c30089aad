"""The aggregation-table layouts older cdcsync versions wrote: before sums and averages kept their state at full
precision, and before the trigger functions had a revision.

Tests that an upgrade migration follows an applied migration of that layout write their first migration with
:func:`legacy_layout` in force, as an older cdcsync would have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from cdcsync.migrations import postgres


@contextmanager
def _older_state(edit: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """``cdcsync init`` records the aggregate state as ``edit`` leaves it, as an older cdcsync would have."""
    real = postgres._aggregate_state

    def old(*args: Any) -> dict[str, Any]:
        state = real(*args)
        edit(state)
        return state

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(postgres, "_aggregate_state", old)
        yield


def _legacy(state: dict[str, Any]) -> None:
    for entry in state["aggregates"]:
        entry.pop("scale_index", None)
        if entry["fn"] == "sum":
            entry["accumulator_type"] = entry["type"]
        elif entry["fn"] == "avg" and entry["type"] in ("double precision", "real"):
            entry["accumulator_type"] = "double precision"


def legacy_layout() -> AbstractContextManager[None]:
    """Sums kept in their declared type, float averages of exact columns summed in floats, no scale tracking."""
    return _older_state(_legacy)


def first_trigger_revision() -> AbstractContextManager[None]:
    """The state an older cdcsync recorded before its trigger functions had a revision (revision 1)."""
    return _older_state(lambda state: state.pop("revision"))
