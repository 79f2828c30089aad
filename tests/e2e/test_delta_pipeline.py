"""Real Debezium -> Kafka -> ``cdcsync run`` -> Delta tables, through the CLI: ``init`` renders the Delta migrations,
``migrate`` creates the tables, a run is SIGKILLed mid-stream and a second one finishes; read back with Spark, the
mirror equals the source table and the history's current rows do too, with every key's versions in one unbroken
chain; ``status`` shows the table's version and rows. One CLI session covers it all, to keep the suite lean."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import DebeziumSource
from tests.e2e.conftest import Project, assert_each_batch_once, sigkill_mid_stream
from tests.e2e.test_debezium_source import COLUMNS, CREATE_TABLE, TABLE, Workload, table_rows

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.soak,
]  # too heavy for make test's 25-minute budget: make soak (see docs/devstack.md)


def pipeline(topic: str, lake: str) -> dict[str, Any]:
    source = {"type": "kafka", "topic": topic, "primary_key": "id", "columns": dict(COLUMNS)}
    source["max_offsets_per_trigger"] = 150  # a few batches, so the kill lands mid-stream
    return {
        "name": "lake",
        "sources": {TABLE: source},
        "sinks": {
            "mirror": {"type": "delta", "from": TABLE, "path": f"{lake}/mirror"},
            "history": {"type": "delta", "from": TABLE, "path": f"{lake}/history", "mode": "history"},
        },
    }


def normalised(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A source row as Spark reads it back: timestamps in UTC without a zone (the session's time zone is UTC)."""
    return tuple(
        value.astimezone(dt.UTC).replace(tzinfo=None) if isinstance(value, dt.datetime) else value for value in row
    )


def test_debezium_into_delta_survives_a_sigkill_and_equals_the_source(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    debezium_source: DebeziumSource,
    spark: Any,
    tmp_path: Path,
) -> None:
    source = debezium_source
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute(CREATE_TABLE)
    workload = Workload(source.dsn, seed=11)
    workload.run(10)
    source.capture(f"public.{TABLE}")
    workload.run(100)  # inserts, updates, key changes and deletes, in transactions
    source.wait_caught_up()

    lake = str(tmp_path / "lake")
    project = make_project(pipeline(source.topic(f"public.{TABLE}"), lake))
    project.prepare()

    sigkill_mid_stream(project, postgres_dsn, "lake", after_batches=2)
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_each_batch_once(postgres_dsn, "lake", ["mirror", "history"])

    names = list(COLUMNS)
    expected = [normalised(row) for row in table_rows(source.dsn, "public")]
    assert len(expected) > 20
    mirror = spark.read.format("delta").load(f"{lake}/mirror").select(*names).orderBy("id").collect()
    assert [tuple(row) for row in mirror] == expected

    history = spark.read.format("delta").load(f"{lake}/history").orderBy("id", "_cdc_version").collect()
    current = [tuple(row[n] for n in names) for row in history if row["_is_current"]]
    assert current == expected
    chains: dict[int, list[Any]] = {}
    for row in history:
        chains.setdefault(row["id"], []).append(row)
    for key, versions in chains.items():
        for older, newer in itertools.pairwise(versions):
            assert older["_valid_to"] == newer["_valid_from"], f"key {key}: a gap in its chain"
            assert not older["_is_current"]
        assert versions[-1]["_valid_to"] is None
    assert len(history) > len(expected)  # updates and deletes kept as versions of their own

    project.env["COLUMNS"] = "400"  # Rich's table: one line per sink
    status = project.cdcsync("status", str(project.pipeline_file)).stdout
    assert f"delta.`{lake}/mirror` (version" in status
    assert f"{len(expected):,}" in status
