"""rank_tombstones is vectorised; these properties hold it to the rule it implements, stated row by row."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from unittest.mock import patch

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcsync.sinks import tombstones
from cdcsync.sinks.postgres import newest_per_key

pytestmark = pytest.mark.unit

PLACEHOLDER = "__debezium_unavailable_value"


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


_change = st.tuples(
    st.one_of(st.none(), st.integers(0, 3)),  # key
    st.one_of(st.none(), st.integers(0, 9)),  # version (None: a tombstone)
    st.integers(0, 12),  # offset
    st.sampled_from(["c", "u", "d", "r"]),
    st.sampled_from(["x", "y", PLACEHOLDER]),
)


@settings(max_examples=400, deadline=None)
@given(
    rows=st.lists(_change, min_size=0, max_size=30),
    growing=st.booleans(),
    keep_key_moves=st.booleans(),
    nullable_key=st.booleans(),
)
def test_newest_per_key_in_offset_order_is_the_general_collapse(
    rows: list[tuple[Any, Any, int, str, str]], growing: bool, keep_key_moves: bool, nullable_key: bool
) -> None:
    """The shortcut (one sort by key and offset, :func:`tombstones.ranked_newest_first`) gives the very table of
    the general path (rank, then sort by key and version), row for row, or declines."""
    if growing:  # the common case: unique offsets, versions growing with them (tombstones aside)
        rows = sorted({r[2]: r for r in rows}.values(), key=lambda r: r[2])
        versions = iter(range(1, 100))
        rows = [(k, None if v is None else next(versions), o, op, b) for k, v, o, op, b in rows]
    if not nullable_key:
        rows = [(0 if k is None else k, *rest) for k, *rest in rows]
    table = pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.int64()),
            "_cdc_op": pa.array([r[3] for r in rows], pa.string()),
            "_cdc_version": pa.array([None if r[1] is None else Decimal(r[1]) for r in rows], pa.decimal128(38, 0)),
            "_cdc_offset": pa.array([r[2] for r in rows], pa.int64()),
            "body": pa.array([r[4] for r in rows], pa.string()),
        }
    )
    toastable = (("body", PLACEHOLDER),)
    shortcut = newest_per_key(table, ("k",), toastable, keep_key_moves=keep_key_moves)
    with patch.object(tombstones, "ranked_newest_first", return_value=None):
        general = newest_per_key(table, ("k",), toastable, keep_key_moves=keep_key_moves)
    assert shortcut.equals(general)
    if growing and not nullable_key and len(rows) > 1:
        assert tombstones.ranked_newest_first(table, ("k",)) is not None


def test_the_shortcut_declines_versions_that_do_not_grow_with_the_offset() -> None:
    table = pa.table(
        {
            "k": pa.array([1, 1, 2], pa.int64()),
            "_cdc_version": pa.array([5, 3, 1], pa.int64()),  # a re-snapshot below a streamed change
            "_cdc_offset": pa.array([0, 1, 2], pa.int64()),
        }
    )
    assert tombstones.ranked_newest_first(table, ("k",)) is None
    assert newest_per_key(table, ("k",))["_cdc_version"].to_pylist() == [5, 1]
