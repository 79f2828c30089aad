"""A dynamic table's runtime side against real Postgres and a local Spark: key loads that follow edits made by
anyone, no reload while the change counter stands still, ledgered side-output writes, and replays that see the
table as it was before their first attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark import StorageLevel

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.migrations import POSTGRES
from cdcsync.transforms.dynamic_tables import DynamicTable

pytestmark = pytest.mark.integration

CHECKPOINT = "0f1e2d3c-checkpoint"


def _pipeline(backend: str = "postgres") -> Pipeline:
    return validate_pipeline_dict(
        {
            "name": "dtrt",
            "sources": {
                "events": {
                    "type": "kafka",
                    "topic": "t",
                    "primary_key": "id",
                    "columns": {"id": "bigint", "user": "text"},
                    "untoasted_columns": ["user"],  # short names: the transforms may test them
                }
            },
            "transforms": {
                "Seen Users": {
                    "type": "dynamic_table",
                    "backend_type": backend,
                    "backend_entity_name": "seen users",
                    "schema": "Lookup",
                    "sql": "SELECT `user` FROM events",
                },
                "fresh": {
                    "type": "sql",
                    "sql": "SELECT * FROM events WHERE NOT dynamic_table_check('Seen Users', `user`)",
                    "primary_key": "id",
                },
            },
            "sinks": {"out": {"type": "postgres", "from": "fresh", "schema": "app", "table": "out"}},
        }
    )


@pytest.fixture()
def table(postgres_dsn: str, tmp_path: Path) -> DynamicTable:
    pipeline = _pipeline()
    migrations.init(POSTGRES, pipeline, tmp_path)
    with psycopg.connect(postgres_dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, tmp_path)
    return DynamicTable(pipeline, pipeline.plan.dynamic_tables["Seen Users"], postgres_dsn)


def _keys(frame: Any) -> set[str]:
    return {row["key"] for row in frame.collect()}


def _sql(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def test_loads_follow_edits_and_only_when_the_table_changed(table: DynamicTable, postgres_dsn: str, spark: Any) -> None:
    table.cached_from = 1  # as a large table's keys are held
    assert _keys(table.prior_keys(spark, CHECKPOINT, 0)) == set()
    _sql(postgres_dsn, """INSERT INTO "Lookup"."seen users" ("user") VALUES ('ann'), ('bob'), ('')""")
    assert _keys(table.prior_keys(spark, CHECKPOINT, 1)) == {"ann", "bob", ""}
    loads = table.loads
    held = table.prior_keys(spark, CHECKPOINT, 2)
    assert held.storageLevel.useMemory  # cached from the load on: no batch reads them from Arrow again
    for batch_id in (2, 3, 4):  # nobody wrote: the counter decides, nothing is read again
        assert _keys(table.prior_keys(spark, CHECKPOINT, batch_id)) == {"ann", "bob", ""}
    assert table.loads == loads
    _sql(postgres_dsn, """DELETE FROM "Lookup"."seen users" WHERE "user" = 'bob'""")
    assert _keys(table.prior_keys(spark, CHECKPOINT, 5)) == {"ann", ""}
    assert held.storageLevel == StorageLevel.NONE  # the load that replaced them let them go
    _sql(postgres_dsn, """TRUNCATE "Lookup"."seen users" """)
    assert _keys(table.prior_keys(spark, CHECKPOINT, 6)) == set()
    assert table.loads == loads + 2


def test_side_output_writes_are_ledgered_and_invisible_to_their_own_replay(
    table: DynamicTable, postgres_dsn: str, spark: Any
) -> None:
    _sql(postgres_dsn, """INSERT INTO "Lookup"."seen users" ("user") VALUES ('ann')""")
    batch = spark.createDataFrame([("ann",), ("cid",), ("dee",)], "key string")
    assert table.write(batch, CHECKPOINT, 7) == 2  # 'ann' was there already and keeps its row
    assert table.write(batch, CHECKPOINT, 7) is None  # the ledger knows batch 7
    with psycopg.connect(postgres_dsn) as conn:
        rows = dict(conn.execute('SELECT "user", "_cdc_batch_id" FROM "Lookup"."seen users"').fetchall())
    assert rows == {"ann": None, "cid": 7, "dee": 7}

    # Batch 7 replayed (its first attempt crashed after writing): it must check against the table without its
    # own keys; the batch after it sees them. Another checkpoint (a reset) sees everything.
    assert _keys(table.prior_keys(spark, CHECKPOINT, 7)) == {"ann"}
    assert _keys(table.prior_keys(spark, CHECKPOINT, 8)) == {"ann", "cid", "dee"}
    assert _keys(table.prior_keys(spark, "another-checkpoint", 0)) == {"ann", "cid", "dee"}


def test_in_memory_tables_take_keys_only_when_told(spark: Any, postgres_dsn: str) -> None:
    pipeline = _pipeline("in_memory")
    table = DynamicTable(pipeline, pipeline.plan.dynamic_tables["Seen Users"], postgres_dsn)
    assert _keys(table.prior_keys(spark, CHECKPOINT, 0)) == set()
    table.write(spark.createDataFrame([("ann",), ("bob",)], "key string"), CHECKPOINT, 0)
    table.write(spark.createDataFrame([("bob",), ("cid",)], "key string"), CHECKPOINT, 1)
    assert sorted(row["key"] for row in table.prior_keys(spark, CHECKPOINT, 2).collect()) == ["ann", "bob", "cid"]
    assert table.loads == 0


def _integer_table(dsn: str, tmp_path: Path) -> DynamicTable:
    pipeline = validate_pipeline_dict(
        {
            "name": "dtint",
            "sources": {"events": {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint"}}},
            "transforms": {
                "seen": {
                    "type": "dynamic_table",
                    "backend_type": "postgres",
                    "backend_entity_name": "seen ids",
                    "schema": "Lookup",
                    "sql": "SELECT id FROM events",
                },
                "fresh": {
                    "type": "sql",
                    "sql": "SELECT * FROM events WHERE NOT dynamic_table_check('seen', id)",
                    "primary_key": "id",
                },
            },
            "sinks": {"out": {"type": "postgres", "from": "fresh", "schema": "app", "table": "out"}},
        }
    )
    migrations.init(POSTGRES, pipeline, tmp_path)
    with psycopg.connect(dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, tmp_path)
    return DynamicTable(pipeline, pipeline.plan.dynamic_tables["seen"], dsn)


def test_integer_keys_are_checked_by_a_function_that_follows_edits_and_replays(
    postgres_dsn: str, tmp_path: Path, spark: Any
) -> None:
    table = _integer_table(postgres_dsn, tmp_path)
    assert table.spec.checked_by_function
    values = spark.createDataFrame([(v,) for v in (None, -5, 1, 2, 3, 2**62)], "v bigint")

    def members(batch_id: int, checkpoint: str = CHECKPOINT) -> set[int]:
        check = table.key_check(spark, checkpoint, batch_id)
        rows = values.select("v", check("v").alias("member")).collect()
        assert all(row["member"] is not None for row in rows)  # NULL in, false out: never NULL
        return {row["v"] for row in rows if row["member"]}

    assert members(0) == set()
    _sql(postgres_dsn, """INSERT INTO "Lookup"."seen ids" (id) VALUES (-5), (2), (7)""")
    assert members(1) == {-5, 2}
    loads = table.loads
    assert members(2) == {-5, 2} and members(3) == {-5, 2}
    assert table.loads == loads  # the counter stood still: nothing read, the same broadcast reused
    _sql(postgres_dsn, """DELETE FROM "Lookup"."seen ids" WHERE id = 2""")
    assert members(4) == {-5}

    # Batch 5's side output lands keys 1 and 3; replayed, batch 5 must not see them, batch 6 must.
    assert table.write(spark.createDataFrame([(1,), (3,)], "key bigint"), CHECKPOINT, 5) == 2
    assert members(5) == {-5}
    assert members(6) == {-5, 1, 3}
    assert members(0, "another-checkpoint") == {-5, 1, 3}
