"""The Spark SQL the plan generates, run by a real local SparkSession over small DataFrames registered as the views
of the contract in ``cdcsync.config.plan``: one row out per row in, rejected changes as deletes of their key,
``dynamic_table_check`` as broadcast joins with the prior / batch key semantics."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from pyspark.sql.functions import arrow_udf

from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.config.plan import batch_keys_view, input_view, key_check_function, prior_keys_view
from cdcsync.sources.debezium.envelope import CDC_COLUMNS
from cdcsync.transforms.key_check import key_check, sorted_keys

TS = datetime(2024, 1, 1, tzinfo=timezone.utc)
META = "_cdc_op, _cdc_version, _cdc_ts, _cdc_topic, _cdc_partition, _cdc_offset"
ORDERS = {"id": "bigint", "customer_id": "bigint", "amount": "numeric(12,2)", "note": "text"}
EVENTS = {"event_id": "bigint", "user_id": "bigint"}


def make_pipeline(transforms: dict[str, Any], sink_from: str) -> Pipeline:
    return validate_pipeline_dict(
        {
            "name": "t",
            "sources": {
                "orders": {
                    "type": "kafka",
                    "topic": "orders",
                    "primary_key": "id",
                    "columns": ORDERS,
                    "untoasted_columns": ["note"],  # short notes: the transforms may filter and compute on them
                },
                "user.events": {"type": "kafka", "topic": "events", "primary_key": "event_id", "columns": EVENTS},
            },
            "transforms": transforms,
            "sinks": {"out": {"type": "postgres", "from": sink_from, "table": "out"}},
        }
    )


def change(op: str, offset: int, partition: int = 0) -> tuple[Any, ...]:
    return (op, Decimal(offset), TS, "orders", partition, offset)


def register_source(spark: Any, pipeline: Pipeline, source_id: str, rows: list[tuple[Any, ...]]) -> None:
    columns = pipeline.columns_of(source_id)
    schema = ", ".join([f"`{n}` {pg.spark_type}" for n, pg in columns.items()] + [f"`{n}` {t}" for n, t in CDC_COLUMNS])
    spark.createDataFrame(rows, schema).createOrReplaceTempView(input_view(source_id))


def register_keys(spark: Any, pipeline: Pipeline, table_id: str, keys: list[Any]) -> None:
    """A table's prior keys as the runtime registers them: the check function of an integer-keyed Postgres table,
    else the view."""
    spec = pipeline.plan.dynamic_tables[table_id]
    if spec.checked_by_function:
        packed = np.array(keys, dtype=">i8").tobytes()  # as the load sends them
        check = arrow_udf(key_check(spark.sparkContext.broadcast(sorted_keys(packed))), "boolean")
        spark.udf.register(key_check_function(table_id), check)
    else:
        frame = spark.createDataFrame([(k,) for k in keys], f"key {spec.key_type.spark_type}")
        frame.createOrReplaceTempView(prior_keys_view(table_id))


def run_batch(spark: Any, pipeline: Pipeline) -> dict[str, Any]:
    """What the runtime does for one micro-batch, in plan order: each fill's batch keys (smallest position per key)
    once its input exists, then each step. Returns every step's DataFrame."""
    frames: dict[str, Any] = {}
    pending = {tid: spec for tid, spec in pipeline.plan.dynamic_tables.items() if spec.fill is not None}

    def fill_ready() -> None:
        for table_id, spec in list(pending.items()):
            assert spec.fill is not None
            if spark.catalog.tableExists(input_view(spec.fill.input)):
                spark.sql(spec.fill.spark_sql).createOrReplaceTempView("__fill")
                spark.sql("SELECT key, min(pos) AS pos FROM __fill GROUP BY key").createOrReplaceTempView(
                    batch_keys_view(table_id)
                )
                del pending[table_id]

    fill_ready()
    for step in pipeline.plan.steps:
        frame = spark.sql(step.spark_sql)
        frame.createOrReplaceTempView(input_view(step.id))
        frames[step.id] = frame
        fill_ready()
    return frames


def rows_by_key(frame: Any, key: str = "id") -> dict[Any, dict[str, Any]]:
    return {row[key]: row.asDict() for row in frame.collect()}


@pytest.fixture(autouse=True)
def clean_views(spark: Any) -> None:
    for table in spark.catalog.listTables():
        if table.isTemporary:
            spark.catalog.dropTempView(table.name)


def test_rejected_changes_become_deletes_with_key_and_metadata(spark: Any) -> None:
    sql = (
        "SELECT id, amount, CAST(note AS BIGINT) AS note_number, amount * 2 AS doubled, "
        f"{META} FROM orders WHERE note RLIKE '^[0-9]+$' AND amount > 10"
    )
    pipeline = make_pipeline({"numbered": {"type": "sql", "sql": sql, "primary_key": "id"}}, "numbered")
    register_source(
        spark,
        pipeline,
        "orders",
        [
            (1, 7, Decimal("20.00"), "42", *change("c", 10)),
            (2, 7, Decimal("20.00"), "not a number", *change("u", 11)),  # the cast would fail under ANSI
            (3, 7, Decimal("5.00"), "5", *change("u", 12)),
            (4, None, None, None, *change("d", 13)),
            (None, None, None, None, *change("t", 14)),
            (5, 8, None, "9", *change("r", 15)),  # NULL amount: the WHERE is NULL, so rejected
        ],
    )
    frame = run_batch(spark, pipeline)["numbered"]
    step = pipeline.plan.steps[0]
    assert frame.columns == [name for name, _ in step.columns] + [name for name, _ in CDC_COLUMNS]
    assert [f.dataType.simpleString() for f in frame.schema.fields][: len(step.columns)] == [
        pg.spark_type for _, pg in step.columns
    ]
    rows = frame.collect()
    assert len(rows) == 6, "exactly one row out per row in"
    by_offset = {row["_cdc_offset"]: row.asDict() for row in rows}
    assert by_offset[10]["_cdc_op"] == "c" and by_offset[10]["note_number"] == 42
    assert by_offset[10]["doubled"] == "40.00" or Decimal(by_offset[10]["doubled"]) == Decimal("40")
    for offset, key in ((11, 2), (12, 3), (15, 5)):
        rejected = by_offset[offset]
        assert rejected["_cdc_op"] == "d" and rejected["id"] == key
        assert rejected["note_number"] is None and rejected["doubled"] is None
        assert (rejected["_cdc_version"], rejected["_cdc_topic"], rejected["_cdc_partition"]) == (offset, "orders", 0)
        assert rejected["_cdc_ts"] == by_offset[10]["_cdc_ts"] is not None
    assert by_offset[13]["_cdc_op"] == "d" and by_offset[13]["id"] == 4
    assert by_offset[14]["_cdc_op"] == "t", "truncates pass whatever the WHERE says"


LOOKUPS = {
    "vip": {"type": "dynamic_table", "backend_type": "postgres", "backend_entity_name": "vip", "key_type": "bigint"},
}


@pytest.mark.parametrize(
    ("where", "passing"),
    [
        ("dynamic_table_check('vip', customer_id)", {1, 2}),
        ("NOT dynamic_table_check('vip', customer_id)", {3, 4}),  # NULL is not a key, so NOT passes it
        ("amount > 100 OR dynamic_table_check('vip', customer_id)", {1, 2, 3}),
        ("dynamic_table_check('vip', CAST(note AS STRING))", {1}),  # cast to the key type; 'x' is no key, no error
    ],
)
def test_check_in_where(spark: Any, where: str, passing: set[int]) -> None:
    pipeline = make_pipeline(
        {**LOOKUPS, "f": {"type": "sql", "sql": f"SELECT * FROM orders WHERE {where}", "primary_key": "id"}}, "f"
    )
    register_source(
        spark,
        pipeline,
        "orders",
        [
            (1, 7, Decimal("1.00"), "7", *change("c", 1)),
            (2, 8, Decimal("1.00"), "x", *change("c", 2)),
            (3, 9, Decimal("500.00"), None, *change("c", 3)),
            (4, None, Decimal("1.00"), None, *change("c", 4)),
        ],
    )
    register_keys(spark, pipeline, "vip", [7, 8, 100])
    rows = rows_by_key(run_batch(spark, pipeline)["f"])
    assert {key for key, row in rows.items() if row["_cdc_op"] == "c"} == passing
    assert {key for key, row in rows.items() if row["_cdc_op"] == "d"} == {1, 2, 3, 4} - passing


@pytest.mark.parametrize(
    ("backend", "plan_holds"),
    [
        ("postgres", "ArrowEvalPython"),  # integer keys of a Postgres table: the vectorised check function
        ("in_memory", "BroadcastHashJoin"),  # any other table: a broadcast join against the prior keys
    ],
)
def test_check_in_select_list_and_its_plan(spark: Any, backend: str, plan_holds: str) -> None:
    sql = "SELECT *, dynamic_table_check('vip', customer_id) AS is_vip FROM orders"
    vip = {**LOOKUPS["vip"], "backend_type": backend}
    pipeline = make_pipeline({"vip": vip, "f": {"type": "sql", "sql": sql, "primary_key": "id"}}, "f")
    assert pipeline.columns_of("f")["is_vip"].sql == "boolean"
    register_source(
        spark,
        pipeline,
        "orders",
        [
            (1, 7, None, None, *change("c", 1)),
            (2, 8, None, None, *change("u", 2)),
            (3, None, None, None, *change("c", 3)),
            (4, 2**62, None, None, *change("c", 4)),  # beyond every key: no match
        ],
    )
    register_keys(spark, pipeline, "vip", [7, -3])
    frame = run_batch(spark, pipeline)["f"]
    assert {k: r["is_vip"] for k, r in rows_by_key(frame).items()} == {1: True, 2: False, 3: False, 4: False}
    plan_text = frame._jdf.queryExecution().executedPlan().toString()
    assert plan_holds in plan_text, plan_text
    assert ("Join" in plan_text) == (backend == "in_memory"), plan_text


def test_batch_keys_behave_as_if_changes_came_one_at_a_time(spark: Any) -> None:
    """Streamling's dedup: a table filled from the same stream it filters; each user passes once."""
    transforms = {
        "seen_users": {
            "type": "dynamic_table",
            "backend_type": "postgres",
            "backend_entity_name": "user_dedup",
            "sql": "SELECT user_id FROM user.events",
        },
        "first_events": {
            "type": "sql",
            "sql": "SELECT * FROM user.events WHERE NOT dynamic_table_check('seen_users', user_id)",
            "primary_key": "event_id",
        },
        "repeat_events": {
            "type": "sql",
            "sql": "SELECT * FROM user.events WHERE dynamic_table_check('seen_users', user_id)",
            "primary_key": "event_id",
        },
    }
    pipeline = make_pipeline(transforms, "first_events")
    assert pipeline.plan.dynamic_tables["seen_users"].fill is not None
    register_source(
        spark,
        pipeline,
        "user.events",
        [
            (100, 1, "c", Decimal(5), TS, "events", 0, 5),  # user 1 seen in an earlier batch
            (101, 2, "c", Decimal(6), TS, "events", 0, 6),  # user 2: first here ...
            (102, 2, "c", Decimal(7), TS, "events", 0, 7),  # ... and again later in the same batch
            (103, 3, "c", Decimal(3), TS, "events", 1, 3),  # user 3 on partition 1, lower offset ...
            (104, 3, "c", Decimal(4), TS, "events", 0, 4),  # ... than this one on partition 0 (partition orders first)
            (105, None, "c", Decimal(8), TS, "events", 0, 8),
        ],
    )
    register_keys(spark, pipeline, "seen_users", [1])
    frames = run_batch(spark, pipeline)
    first = rows_by_key(frames["first_events"], "event_id")
    assert {k for k, r in first.items() if r["_cdc_op"] == "c"} == {101, 104, 105}
    repeat = rows_by_key(frames["repeat_events"], "event_id")
    assert {k for k, r in repeat.items() if r["_cdc_op"] == "c"} == {100, 102, 103}
    assert all(r["user_id"] == first[k]["user_id"] for k, r in repeat.items())


def test_side_output_yields_keys_and_positions(spark: Any) -> None:
    transforms = {
        "big_customers": {
            "type": "dynamic_table",
            "backend_type": "in_memory",
            "backend_entity_name": "big",
            "sql": "SELECT customer_id AS cid FROM orders WHERE amount > 100",
            "key_type": "text",
        },
        "f": {"type": "sql", "sql": "SELECT * FROM orders", "primary_key": "id"},
    }
    pipeline = make_pipeline(transforms, "f")
    spec = pipeline.plan.dynamic_tables["big_customers"]
    assert spec.fill is not None and (spec.key_column, spec.key_type.sql) == ("cid", "text")
    register_source(
        spark,
        pipeline,
        "orders",
        [
            (1, 7, Decimal("500.00"), None, *change("c", 1)),
            (2, None, Decimal("500.00"), None, *change("c", 2)),
            (3, 8, Decimal("5.00"), None, *change("c", 3)),
        ],
    )
    rows = spark.sql(spec.fill.spark_sql).collect()
    assert [(r["key"], r["pos"]["topic"], r["pos"]["partition"], r["pos"]["offset"]) for r in rows] == [
        ("7", "orders", 0, 1)
    ]


def test_chained_transforms_carry_deletes_through(spark: Any) -> None:
    transforms = {
        **LOOKUPS,
        "vip_orders": {
            "type": "sql",
            "sql": "SELECT * FROM orders WHERE dynamic_table_check('vip', customer_id)",
            "primary_key": "id",
        },
        "labelled": {
            "type": "sql",
            "sql": f"SELECT id, upper(note) AS label, {META} FROM vip_orders WHERE amount > 10",
            "primary_key": "id",
        },
    }
    pipeline = make_pipeline(transforms, "labelled")
    register_source(
        spark,
        pipeline,
        "orders",
        [
            (1, 7, Decimal("50.00"), "a", *change("c", 1)),
            (2, 8, Decimal("50.00"), "b", *change("c", 2)),  # not vip: deleted by the first transform
            (3, 7, Decimal("5.00"), "c", *change("u", 3)),  # vip, too small: deleted by the second
        ],
    )
    register_keys(spark, pipeline, "vip", [7])
    rows = rows_by_key(run_batch(spark, pipeline)["labelled"])
    assert {k: r["_cdc_op"] for k, r in rows.items()} == {1: "c", 2: "d", 3: "d"}
    assert (rows[1]["label"], rows[3]["label"]) == ("A", None)
