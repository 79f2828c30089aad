"""A bounded ClickHouse source's reads against the session's ClickHouse, without Spark: the pages' key ranges
cover every row exactly once (FINAL: the current row of each key only), in the text forms Spark casts back."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from cdcsync.config.bounded import ClickHouseTableSource
from cdcsync.config.types import parse_pg_type
from cdcsync.sources.bounded import Bound, chunk_count, chunk_ranges
from cdcsync.sources.bounded.clickhouse import ClickHouseRangeTask, key_bounds
from tests.conftest import ClickHouseDatabase

pytestmark = pytest.mark.integration

COLUMNS = (("region", "text"), ("id", "bigint"), ("note", "text"), ("blob", "bytea"), ("at", "timestamptz"))
KEY = ("region", "id")


def read(task: ClickHouseRangeTask, ranges: list[tuple[Bound, Bound]]) -> list[dict[str, object]]:
    rows = pa.RecordBatch.from_pydict(
        {"lower": [json.dumps(lower) for lower, _ in ranges], "upper": [json.dumps(upper) for _, upper in ranges]}
    )
    return [row for batch in task(iter([rows])) for row in batch.to_pylist()]


def test_the_pages_cover_every_current_row_once(clickhouse_database: ClickHouseDatabase) -> None:
    client = clickhouse_database.client()
    client.command(
        "CREATE TABLE `Items` (region String, id Int64, note Nullable(String), blob Nullable(String), "
        "at Nullable(DateTime64(6, 'UTC')), v UInt64) ENGINE = ReplacingMergeTree(v) ORDER BY (region, id)"
    )
    client.command(
        "INSERT INTO `Items` SELECT if(number % 3 = 0, 'eu', 'us, \"west\"'), number, "
        "multiIf(number % 5 = 0, NULL, number % 7 = 0, '', concat('line\\nnext,', toString(number))), "
        "unhex('00ff0a'), toDateTime64('2024-05-01 10:00:00', 6, 'UTC') + number, 1 FROM numbers(1, 95)"
    )
    client.command("INSERT INTO `Items` (region, id, note, v) VALUES ('eu', 3, 'newer', 2)")  # a second version
    source = ClickHouseTableSource.model_validate(
        {
            "type": "clickhouse",
            "database": clickhouse_database.database,
            "table_name": "Items",
            "page_size": 20,
            "parallelism": 2,
            "final": True,
        }
    )
    bounds = key_bounds(clickhouse_database.url, source, KEY)
    assert len(bounds) == 10 and chunk_count(bounds, 2) == 5
    columns = tuple((name, parse_pg_type(text)) for name, text in COLUMNS)
    task = ClickHouseRangeTask.of(clickhouse_database.url, source, columns, KEY)
    seen = [row for page in range(5) for row in read(task, chunk_ranges(bounds, 2, page))]
    keys = [(row["region"], row["id"]) for row in seen]
    assert len(keys) == len(set(keys)) == 95
    by_key = {(row["region"], row["id"]): row for row in seen}
    assert by_key[("eu", "3")]["note"] == "newer"
    assert by_key[("eu", "6")] == {
        "region": "eu",
        "id": "6",
        "note": "line\nnext,6",
        "blob": "00FF0A",
        "at": "2024-05-01 10:00:06.000000",
    }
    assert by_key[('us, "west"', "5")]["note"] is None and by_key[("eu", "21")]["note"] == ""


def test_a_missing_table_is_the_pipelines_error(clickhouse_database: ClickHouseDatabase) -> None:
    from cdcsync.core.errors import UserError

    source = ClickHouseTableSource.model_validate(
        {"type": "clickhouse", "database": clickhouse_database.database, "table_name": "absent"}
    )
    with pytest.raises(UserError, match=r"clickhouse table .*absent: planning its key ranges"):
        key_bounds(clickhouse_database.url, source, KEY)
