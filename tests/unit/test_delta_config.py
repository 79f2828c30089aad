"""Delta sinks without Spark: validation with YAML paths, the migration files (golden DDL, Spark SQL quoting), the
planner's additive and destructive changes, and the table summary read from a transaction log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.core.errors import ConfigError, MigrationError
from cdcsync.migrations import DELTA
from cdcsync.sinks.delta import table_summary
from cdcsync.sql.render import delta_table_ref, render, spark_quote_ident
from tests.unit.test_templates import check_golden

pytestmark = pytest.mark.unit

COLUMNS = {"id": "bigint", "region": "varchar(8)", "amount": "numeric(12,2)", "Note `x`": "text", "tags": "text[]"}


def raw_pipeline(columns: dict[str, str] | None = None, **sink: Any) -> dict[str, Any]:
    source = {"type": "kafka", "topic": "shop.orders", "primary_key": "id", "columns": dict(columns or COLUMNS)}
    lake = {"type": "delta", "from": "orders", **({"path": "/lake/orders"} if "table" not in sink else {}), **sink}
    return {"name": "shop", "sources": {"orders": source}, "sinks": {"lake": lake}}


def pipeline(columns: dict[str, str] | None = None, **sink: Any) -> Pipeline:
    return validate_pipeline_dict(raw_pipeline(columns, **sink))


def problems(**sink: Any) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        validate_pipeline_dict(raw_pipeline(**sink))
    return raised.value.problems


def test_defaults_are_a_hard_delete_mirror_with_the_change_data_feed() -> None:
    sink = pipeline().delta_sinks()["lake"]
    assert (sink.mode, sink.delete_mode, sink.change_data_feed, sink.partition_by) == ("mirror", "hard", True, [])
    assert pipeline().postgres_sinks() == {} and pipeline().clickhouse_sinks() == {}
    assert pipeline(partition_by="region").delta_sinks()["lake"].partition_by == ["region"]


@pytest.mark.parametrize(
    ("sink", "expected"),
    [
        ({"path": None}, "sinks.lake.path: required key is missing (or table, for a catalog table)"),
        ({"table": "db.orders", "path": "/x"}, "sinks.lake.table: give either path"),
        ({"mode": "history", "delete_mode": "soft"}, "sinks.lake.delete_mode: only for mode: mirror"),
        ({"mode": "scd"}, "sinks.lake.mode"),
        ({"path": "ftp://host/x"}, "sinks.lake.path: scheme 'ftp://' is not one of"),
        ({"table": "a.b.c.d"}, "sinks.lake.table: must be 'name', 'database.name' or 'catalog.database.name'"),
        ({"partition_by": ["regoin"]}, "sinks.lake.partition_by: column 'regoin' is not in source 'orders'"),
        ({"properties": {"delta.enableChangeDataFeed": "false"}}, "set change_data_feed instead"),
        ({"propertys": {}}, "sinks.lake.propertys"),
    ],
)
def test_validation_names_the_yaml_path(sink: dict[str, Any], expected: str) -> None:
    found = problems(**sink)
    assert any(expected in problem for problem in found), found


def test_added_columns_may_not_clash_and_two_sinks_not_share_a_path() -> None:
    with pytest.raises(ConfigError) as raised:
        validate_pipeline_dict(raw_pipeline({**COLUMNS, "_is_current": "boolean"}))
    assert any("column '_is_current' of source 'orders' clashes" in p for p in raised.value.problems)
    raw = raw_pipeline()
    raw["sinks"]["twin"] = dict(raw["sinks"]["lake"])
    with pytest.raises(ConfigError) as raised:
        validate_pipeline_dict(raw)
    assert any(
        "sinks.twin.path: delta./lake/orders is already the target of sink 'lake'" in p for p in raised.value.problems
    )


def test_spark_sql_quoting() -> None:
    assert spark_quote_ident("Note `x`") == "`Note ``x```"
    assert delta_table_ref({"path": "/lake/o`rders"}) == "delta.`/lake/o``rders`"
    assert delta_table_ref({"table": "db.orders"}) == "`db`.`orders`"
    sql = render("delta/runtime/merge_tombstones.sql.j2", tombstones={"path": "/t"}, source="v", primary_key=["a b"])
    assert "t.`a b` <=> s.`a b`" in sql


@pytest.mark.parametrize(
    ("name", "sink"),
    [
        ("delta_0001_init_hard.sql", {"partition_by": ["region"]}),
        ("delta_0001_init_soft.sql", {"delete_mode": "soft", "properties": {"delta.logRetentionDuration": "30 days"}}),
        ("delta_0001_init_history.sql", {"mode": "history", "table": "lake.orders", "change_data_feed": False}),
    ],
)
def test_init_renders_golden_spark_sql(tmp_path: Path, name: str, sink: dict[str, Any]) -> None:
    result = migrations.init(DELTA, pipeline(**sink), tmp_path)
    (path,) = list(result)
    check_golden(name, path.read_text())


def test_new_columns_are_additive_and_a_new_key_is_not(tmp_path: Path) -> None:
    migrations.init(DELTA, pipeline(), tmp_path)
    result = migrations.init(DELTA, pipeline({**COLUMNS, "shipped": "timestamptz"}), tmp_path)
    (path,) = list(result)
    assert path.name == "0002_add_columns_lake.sql"
    assert "ALTER TABLE delta.`/lake/orders` ADD COLUMNS (\n    `shipped` TIMESTAMP\n);" in path.read_text()
    with pytest.raises(MigrationError) as raised:
        migrations.init(DELTA, pipeline({**COLUMNS, "shipped": "timestamptz"}, mode="history"), tmp_path)
    assert "sink 'lake': mode changed from 'mirror' to 'history'" in str(raised.value)


def test_table_summary_reads_the_log(tmp_path: Path) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    assert table_summary(str(tmp_path / "nothing")) is None

    def add(path: str, rows: int, removed: int = 0) -> dict[str, Any]:
        action: dict[str, Any] = {"path": path, "stats": json.dumps({"numRecords": rows})}
        if removed:
            action["deletionVector"] = {"cardinality": removed}
        return {"add": action}

    commits = [
        [{"protocol": {}}, add("a", 10), add("b", 5)],
        [{"remove": {"path": "a"}}, add("c", 8, removed=2)],
    ]
    for version, actions in enumerate(commits):
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    assert table_summary(str(tmp_path / "t")) == (1, 11)
