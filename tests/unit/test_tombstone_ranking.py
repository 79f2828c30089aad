"""rank_tombstones is vectorised; these properties hold it to the rule it implements, stated row by row."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcsync.sinks import tombstones

pytestmark = pytest.mark.unit


def _rule(keys: list[tuple[Any, ...]], versions: list[Any], offsets: list[int]) -> list[Any]:
    """A tombstone takes the highest version among its key's changes at a lower offset (or the same offset and
    earlier in the table); None when there is none. Keys that are null compare equal."""
    ranked = list(versions)
    for i, version in enumerate(versions):
        if version is not None:
            continue
        earlier = [
            versions[j]
            for j in range(len(keys))
            if keys[j] == keys[i] and versions[j] is not None and (offsets[j], j) < (offsets[i], i)
        ]
        ranked[i] = max(earlier) if earlier else None
    return ranked


_key = st.one_of(st.none(), st.integers(0, 3))
_rows = st.lists(
    st.tuples(_key, _key, st.one_of(st.none(), st.integers(0, 6)), st.integers(0, 8)), min_size=0, max_size=40
)


@settings(max_examples=300, deadline=None)
@given(rows=_rows, composite=st.booleans(), decimal=st.booleans(), split=st.integers(0, 40))
def test_each_tombstone_takes_its_keys_newest_earlier_version(
    rows: list[tuple[Any, Any, Any, int]], composite: bool, decimal: bool, split: int
) -> None:
    version_type = pa.decimal128(38, 0) if decimal else pa.int64()
    versions = [None if v is None else Decimal(v) if decimal else v for _, _, v, _ in rows]
    table = pa.table(
        {
            "a": pa.array([a for a, _, _, _ in rows], pa.int64()),
            "b": pa.array([b for _, b, _, _ in rows], pa.int64()),
            "_cdc_version": pa.array(versions, version_type),
            "_cdc_offset": pa.array([o for _, _, _, o in rows], pa.int64()),
        }
    )
    if 0 < split < len(rows):  # more than one chunk, as a task's concatenated batches are
        table = pa.concat_tables([table.slice(0, split), table.slice(split)])
    primary_key = ("a", "b") if composite else ("a",)
    keys = [(a, b) if composite else (a,) for a, b, _, _ in rows]
    ranked = tombstones.rank_tombstones(table, primary_key)
    assert ranked.schema == table.schema
    assert ranked["_cdc_version"].to_pylist() == _rule(keys, versions, [o for _, _, _, o in rows])
    assert ranked.drop_columns(["_cdc_version"]).equals(table.drop_columns(["_cdc_version"]))


def test_keys_all_null_are_one_key() -> None:
    table = pa.table(
        {
            "a": pa.nulls(3),
            "_cdc_version": pa.array([4, None, 2], pa.int64()),
            "_cdc_offset": pa.array([0, 1, 2], pa.int64()),
        }
    )
    assert tombstones.rank_tombstones(table, ("a",))["_cdc_version"].to_pylist() == [4, 4, 2]
