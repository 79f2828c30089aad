"""Which executor writers see cdcsync's key-move rows: only the sinks that keep a table by key."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from cdcsync.core.names import KEY_MOVE_OP
from cdcsync.engine.batch import WithoutKeyMoves

pytestmark = pytest.mark.unit


@dataclass
class Recording:
    seen: list[pa.Table] = field(default_factory=list)

    def stage(self, table: pa.Table) -> int:
        self.seen.append(table)
        return table.num_rows


def test_key_move_rows_are_not_handed_on() -> None:
    table = pa.table({"id": [1, 2, 3, 4], "_cdc_op": ["c", KEY_MOVE_OP, "d", None]})
    inner = Recording()
    assert WithoutKeyMoves(inner).stage(table) == 3
    assert inner.seen[0].column("_cdc_op").to_pylist() == ["c", "d", None]
    assert inner.seen[0].column("id").to_pylist() == [1, 3, 4]


def test_a_table_without_key_moves_passes_whole() -> None:
    table = pa.table({"id": [1, 2], "_cdc_op": ["c", "u"]})
    inner = Recording()
    WithoutKeyMoves(inner).stage(table)
    assert inner.seen[0].equals(table)
