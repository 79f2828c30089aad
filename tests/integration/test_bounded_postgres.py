"""A bounded Postgres source's reads against a real Postgres, without Spark: the plan's key ranges, and the
executors' COPY of each range, cover every row exactly once, whatever the key and whatever was inserted after
the plan; a source's progress survives a restart only while its definition stays the same."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from cdcsync.config.bounded import PostgresTableSource
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.types import parse_pg_type
from cdcsync.core.errors import UserError
from cdcsync.sources.bounded import Bound, chunk_count, chunk_ranges
from cdcsync.sources.bounded.postgres import PostgresRangeTask, key_bounds

pytestmark = pytest.mark.integration

COLUMNS = (("region", "text"), ("id", "bigint"), ("note", "text"), ("blob", "bytea"), ("at", "timestamptz"))
KEY = ("region", "id")


def source(**extra: object) -> PostgresTableSource:
    return PostgresTableSource.model_validate({"type": "postgres", "table": "Items", **extra})


def read_task(dsn: str) -> PostgresRangeTask:
    columns = tuple((name, parse_pg_type(text)) for name, text in COLUMNS)
    return PostgresRangeTask.of(dsn, source(), columns, KEY)


def read(task: PostgresRangeTask, ranges: list[tuple[Bound, Bound]]) -> list[dict[str, object]]:
    """What the executors read for ``ranges``: each range as an input row, as Spark hands them over."""
    rows = pa.RecordBatch.from_pydict(
        {"lower": [json.dumps(lower) for lower, _ in ranges], "upper": [json.dumps(upper) for _, upper in ranges]}
    )
    return [row for batch in task(iter([rows])) for row in batch.to_pylist()]


@pytest.fixture()
def table(postgres_dsn: str) -> str:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            'CREATE TABLE "Items" (region text, id bigint, note text, blob bytea, at timestamptz, extra int, '
            "PRIMARY KEY (region, id))"
        )
        conn.execute(
            """INSERT INTO "Items" SELECT CASE WHEN g % 3 = 0 THEN 'eu' ELSE 'us, "west"' END, g,
                 CASE WHEN g % 5 = 0 THEN NULL WHEN g % 7 = 0 THEN '' ELSE E'line\\nnext,' || g END,
                 '\\x00ff0a'::bytea, '2024-05-01 12:00:00.5+02'::timestamptz + g * interval '1 second', g
               FROM generate_series(1, 257) AS g"""
        )
    return postgres_dsn


def test_the_chunks_cover_every_row_once_also_rows_inserted_after_the_plan(table: str) -> None:
    bounds = key_bounds(table, source(chunk_size=40, parallelism=4), KEY)
    assert len(bounds) == 26 and chunk_count(bounds, 4) == 7  # 257 rows, ranges of 10, 4 ranges a chunk
    with psycopg.connect(table, autocommit=True) as conn:  # below the first bound, between two, above the last
        conn.execute("""INSERT INTO "Items" (region, id) VALUES ('a', 1), ('eu', 4), ('zz', 1)""")
    task = read_task(table)
    seen = [row for chunk in range(7) for row in read(task, chunk_ranges(bounds, 4, chunk))]
    keys = [(row["region"], int(str(row["id"]))) for row in seen]
    assert len(keys) == len(set(keys)) == 260
    by_key = {(row["region"], row["id"]): row for row in seen}
    assert by_key[("eu", "3")] == {
        "region": "eu",
        "id": "3",
        "note": "line\nnext,3",
        "blob": "00ff0a",
        "at": "2024-05-01 10:00:03.5+00",
    }
    assert by_key[('us, "west"', "5")]["note"] is None and by_key[("eu", "21")]["note"] == ""


def test_an_empty_table_is_one_chunk_of_nothing(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE "Items" (region text, id bigint, note text, blob bytea, at timestamptz)')
    bounds = key_bounds(postgres_dsn, source(), KEY)
    assert bounds == [] and chunk_count(bounds, 4) == 1
    assert read(read_task(postgres_dsn), chunk_ranges(bounds, 4, 0)) == []


def test_progress_resumes_only_for_the_same_definition(tmp_path: Path) -> None:
    from cdcsync.runtime.bounded import Progress

    def plan(chunk_size: int) -> object:
        raw = {
            "name": "p",
            "sources": {
                "s": {
                    "type": "postgres",
                    "table": "Items",
                    "primary_key": "id",
                    "columns": {"id": "bigint"},
                    "chunk_size": chunk_size,
                }
            },
            "sinks": {"m": {"type": "postgres", "from": "s", "table": "m"}},
        }
        return validate_pipeline_dict(raw).bounded["s"]

    progress = Progress.load(tmp_path, plan(10))  # type: ignore[arg-type]
    progress.phases[0].update(bounds=[["1"], ["11"]], done=1)
    progress.save()
    again = Progress.load(tmp_path, plan(10))  # type: ignore[arg-type]
    assert (again.plan_id, again.phases) == (progress.plan_id, [{"bounds": [["1"], ["11"]], "done": 1}])
    with pytest.raises(UserError, match="changed since their progress was recorded"):
        Progress.load(tmp_path, plan(20))  # type: ignore[arg-type]


def test_a_missing_table_or_key_column_is_the_pipelines_error(postgres_dsn: str) -> None:
    with pytest.raises(UserError, match=r'relation "public\.Items" does not exist'):
        key_bounds(postgres_dsn, source(), KEY)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE "Items" (id bigint PRIMARY KEY)')
    with pytest.raises(UserError, match='column "region" does not exist'):
        key_bounds(postgres_dsn, source(), KEY)
