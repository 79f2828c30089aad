"""A bounded Delta source on the tests' Spark session: the snapshot it pins, the change feed's newest change per
key with its op, and key-range chunks that cover every row once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdcsync.config.bounded import DeltaTableSource
from cdcsync.config.types import parse_pg_type
from cdcsync.runtime.bounded import bounded_changes
from cdcsync.sources.bounded import chunk_count, chunk_ranges
from cdcsync.sources.bounded.delta import changes, in_range, key_bounds, newest_version

pytestmark = pytest.mark.integration

COLUMNS = tuple((name, parse_pg_type(text)) for name, text in (("id", "bigint"), ("name", "text")))
KEY = ("id",)


def source(path: Path, **extra: Any) -> DeltaTableSource:
    return DeltaTableSource.model_validate({"type": "delta", "path": str(path), "chunk_size": 7, **extra})


def test_snapshot_and_change_feed_in_key_range_chunks(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "items"
    rows = spark.createDataFrame([(i, f"v0 {i}") for i in range(1, 31)], "id bigint, name string")
    rows.write.format("delta").option("delta.enableChangeDataFeed", "true").save(str(path))  # version 0
    spark.sql(f"UPDATE delta.`{path}` SET name = 'v1' WHERE id % 4 = 0")  # version 1
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 10 = 0")  # version 2
    spark.sql(f"UPDATE delta.`{path}` SET name = 'v3' WHERE id = 8")  # version 3
    assert newest_version(spark, source(path)) == 3

    snapshot = source(path, version=0)
    frame = changes(spark, snapshot, COLUMNS, KEY, pinned=3)
    bounds = key_bounds(frame, snapshot, KEY)
    assert bounds == [["1"], ["8"], ["15"], ["22"], ["29"]] and chunk_count(bounds, 1) == 5
    read = [
        (row["id"], row["name"], row["_cdc_op"])
        for chunk in range(5)
        for row in frame.where(in_range(COLUMNS, KEY, *chunk_ranges(bounds, 1, chunk)[0])).collect()
    ]
    assert sorted(read) == [(i, f"v0 {i}", "c") for i in range(1, 31)]

    feed = changes(spark, source(path, change_data_feed=True, starting_version=1), COLUMNS, KEY, pinned=3)
    landed = bounded_changes(feed, 2, "delta").collect()
    assert {row["id"]: (row["name"], row["_cdc_op"]) for row in landed} == {
        4: ("v1", "u"),
        8: ("v3", "u"),
        10: ("v0 10", "d"),
        12: ("v1", "u"),
        16: ("v1", "u"),
        20: ("v1", "d"),
        24: ("v1", "u"),
        28: ("v1", "u"),
        30: ("v0 30", "d"),
    }
    assert {int(row["_cdc_version"]) for row in landed} == {2}
