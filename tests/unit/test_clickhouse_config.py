"""ClickHouse sinks without a server: validation with YAML paths, the type mapping, quoting, golden DDL and the
migration planner, and the insert token / Arrow shaping the executors use."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlglot
from sqlglot import exp

import cdcsync
from cdcsync import migrations
from cdcsync.config import clickhouse_types
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.config.types import parse_pg_type
from cdcsync.core.errors import ConfigError, MigrationError
from cdcsync.migrations import CLICKHOUSE, POSTGRES
from cdcsync.migrations import clickhouse as ch_migrations
from cdcsync.sinks.clickhouse import deduplication_token, to_clickhouse_arrow
from cdcsync.sql.render import ch_quote_ident, ch_quote_literal, render
from tests.unit.test_templates import check_golden

COLUMNS = {
    "id": "bigint",
    "region": "varchar(8)",
    "amount": "numeric(12,2)",
    "huge": "numeric(60,2)",
    "loose": "numeric",
    "paid": "boolean",
    "at": "timestamptz",
    "day": "date",
    "uid": "uuid",
    "doc": "jsonb",
    "Note `x`": "text",
}


def raw_pipeline(**sink: Any) -> dict[str, Any]:
    return {
        "name": "shop",
        "sources": {"orders": {"type": "kafka", "topic": "shop.orders", "primary_key": "id", "columns": dict(COLUMNS)}},
        "sinks": {
            "orders_ch": {"type": "clickhouse", "from": "orders", "database": "analytics", "table": "orders", **sink}
        },
    }


def pipeline(**sink: Any) -> Pipeline:
    return validate_pipeline_dict(raw_pipeline(**sink))


def problems(**sink: Any) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        validate_pipeline_dict(raw_pipeline(**sink))
    return raised.value.problems


# ---- validation ------------------------------------------------------------------------------------------------


def test_defaults_follow_streamling() -> None:
    sink = pipeline().clickhouse_sinks()["orders_ch"]
    assert (sink.append_only_mode, sink.compression, sink.legacy_server, sink.view_name) == (True, "none", False, None)
    assert pipeline().postgres_sinks() == {}


@pytest.mark.parametrize(
    ("sink", "expected"),
    [
        ({"compression": "brotli"}, "sinks.orders_ch.compression: 'brotli' is not one of none, gzip, lz4, zstd"),
        (
            {"low_cardinality": ["regoin"]},
            "sinks.orders_ch.low_cardinality: column 'regoin' is not in source 'orders' (did you mean 'region'?)",
        ),
        (
            {"low_cardinality": "amount"},
            "sinks.orders_ch.low_cardinality: column 'amount' is numeric(12,2); only columns stored as String",
        ),
        ({"low_cardinality": "id"}, "sinks.orders_ch.low_cardinality: column 'id' is bigint"),
        (
            {"partition_by": "toYYYYMM(at); DROP TABLE x"},
            "sinks.orders_ch.partition_by: must be one ClickHouse expression",
        ),
        ({"ttl": "at + INTERVAL 1 DAY -- x"}, "sinks.orders_ch.ttl: must be one ClickHouse expression"),
        ({"settings": {"bad name": 1}}, "sinks.orders_ch.settings: 'bad name' is not a ClickHouse setting name"),
        ({"view": "v"}, "sinks.orders_ch.view: only used with legacy_server: true"),
        (
            {"primary_key": "idd"},
            "sinks.orders_ch.primary_key: column 'idd' is not in source 'orders' (did you mean 'id'?)",
        ),
        ({"append_only": False}, "sinks.orders_ch.append_only: unknown key (did you mean 'append_only_mode'?)"),
        ({"table": "a`b"}, "sinks.orders_ch.table: ClickHouse names here cannot contain control characters or '`'"),
    ],
)
def test_invalid_sinks_are_reported_at_their_yaml_path(sink: dict[str, Any], expected: str) -> None:
    found = problems(**sink)
    assert any(p.startswith(expected) for p in found), found


def test_two_sinks_on_one_clickhouse_table_are_refused_but_a_postgres_table_of_that_name_is_fine() -> None:
    raw = raw_pipeline()
    raw["sinks"]["again"] = dict(raw["sinks"]["orders_ch"])
    raw["sinks"]["pg"] = {"type": "postgres", "from": "orders", "schema": "analytics", "table": "orders"}
    with pytest.raises(ConfigError) as raised:
        validate_pipeline_dict(raw)
    assert raised.value.problems == ["sinks.again.table: analytics.orders is already the target of sink 'orders_ch'"]


# ---- types -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pg", "key", "low_cardinality", "expected"),
    [
        ("bigint", True, False, "Int64"),
        ("smallint", False, False, "Nullable(Int16)"),
        ("integer", False, False, "Nullable(Int32)"),
        ("real", False, False, "Nullable(Float32)"),
        ("double precision", False, False, "Nullable(Float64)"),
        ("numeric(12,2)", False, False, "Nullable(Decimal(12, 2))"),
        ("numeric(38)", True, False, "Decimal(38, 0)"),
        ("numeric(39,2)", False, False, "Nullable(String)"),
        ("numeric", False, False, "Nullable(String)"),
        ("boolean", False, False, "Nullable(Bool)"),
        ("timestamptz", False, False, "Nullable(DateTime64(6, 'UTC'))"),
        ("timestamp", True, False, "DateTime64(6, 'UTC')"),
        ("date", False, False, "Nullable(Date32)"),
        ("uuid", True, False, "UUID"),
        ("jsonb", False, False, "Nullable(String)"),
        ("json", False, False, "Nullable(String)"),
        ("bytea", False, False, "Nullable(String)"),
        ("interval", False, False, "Nullable(String)"),
        ("text", False, True, "LowCardinality(Nullable(String))"),
        ("varchar(3)", True, True, "LowCardinality(String)"),
    ],
)
def test_type_mapping(pg: str, key: bool, low_cardinality: bool, expected: str) -> None:
    assert clickhouse_types.column_type(parse_pg_type(pg), key=key, low_cardinality=low_cardinality) == expected


def test_ch_quoting_cannot_be_broken_out_of() -> None:
    assert ch_quote_ident("a`b\\") == "`a\\`b\\\\`"
    assert ch_quote_literal("it's \\") == "'it\\'s \\\\'"
    with pytest.raises(ConfigError):
        ch_quote_ident("")


# ---- golden DDL and the planner ----------------------------------------------------------------------------------


def parse_clickhouse(sql: str) -> list[exp.Expr]:
    statements = [s for s in sqlglot.parse(sql, read="clickhouse") if s is not None]
    assert statements
    return statements


def test_table_golden() -> None:
    p = pipeline(
        low_cardinality="region",
        partition_by="toYYYYMM(day)",
        ttl="day + INTERVAL 1 YEAR",
        settings={"index_granularity": 4096},
    )
    state = CLICKHOUSE.desired_state(p)["sinks"]["orders_ch"]
    sql = render("clickhouse/table.sql.j2", sink={**state, "columns": ch_migrations.table_columns(state)})
    check_golden("clickhouse_table.sql", sql)
    assert "ENGINE = ReplacingMergeTree(`_version`, `_is_deleted`)" in sql
    assert "ORDER BY (`id`)" in sql and "PARTITION BY toYYYYMM(day)" in sql and "TTL day + INTERVAL 1 YEAR" in sql
    assert "SETTINGS index_granularity = 4096, non_replicated_deduplication_window = 1000;" in sql
    assert "`Note \\`x\\`` Nullable(String)" in sql
    kinds = [type(s).__name__ for s in parse_clickhouse(sql)]
    assert kinds == ["Create", "Create"]


def test_legacy_table_golden() -> None:
    state = CLICKHOUSE.desired_state(pipeline(legacy_server=True))["sinks"]["orders_ch"]
    sql = render("clickhouse/table.sql.j2", sink={**state, "columns": ch_migrations.table_columns(state)})
    check_golden("clickhouse_table_legacy.sql", sql)
    assert "ENGINE = ReplacingMergeTree(`_version`)\n" in sql
    assert "CREATE VIEW IF NOT EXISTS `analytics`.`orders_current` AS" in sql
    assert "WHERE `_is_deleted` = 0;" in sql


def test_init_renders_clickhouse_files_only_for_clickhouse_sinks(tmp_path: Path) -> None:
    p = pipeline()
    (planned,) = migrations.plan(CLICKHOUSE, p, tmp_path)
    text = planned.text.replace(f"cdcsync {cdcsync.__version__}", "cdcsync VERSION")
    check_golden("clickhouse_0001_init.sql", text)
    assert planned.path == tmp_path / "shop" / "clickhouse" / "0001_init.sql"
    parsed = migrations.parse_migration(planned.text)
    assert parsed.state == planned.state and parsed.declared_checksum == parsed.checksum
    assert [s.split("\n")[0] for s in ch_migrations.split_statements(parsed.body)] == [
        "CREATE DATABASE IF NOT EXISTS `cdcsync`",
        "CREATE TABLE IF NOT EXISTS `cdcsync`.`schema_migrations` (",
        "CREATE DATABASE IF NOT EXISTS `analytics`",
        "CREATE TABLE IF NOT EXISTS `analytics`.`orders` (",
    ]
    # The Postgres side still gets its internal schema, but no table for the ClickHouse sink.
    (pg_planned,) = migrations.plan(POSTGRES, p, tmp_path)
    assert '"orders"' not in pg_planned.text and "orders_ch" not in pg_planned.text

    raw = raw_pipeline()
    del raw["sinks"]["orders_ch"]
    raw["sinks"]["pg"] = {"type": "postgres", "from": "orders", "table": "orders"}
    assert migrations.plan(CLICKHOUSE, validate_pipeline_dict(raw), tmp_path) == []


def test_init_writes_only_the_next_file_and_refuses_destructive_changes(tmp_path: Path) -> None:
    migrations.init(CLICKHOUSE, pipeline(), tmp_path)
    assert migrations.plan(CLICKHOUSE, pipeline(), tmp_path) == []
    raw = raw_pipeline()
    raw["sources"]["orders"]["columns"]["extra"] = "integer"
    raw["sinks"]["more"] = {"type": "clickhouse", "from": "orders", "table": "more"}
    names = [m.filename for m in migrations.init(CLICKHOUSE, validate_pipeline_dict(raw), tmp_path).written]
    assert names == ["0002_add_sink_more.sql", "0003_add_columns_orders_ch.sql"]
    added = (tmp_path / "shop" / "clickhouse" / names[1]).read_text()
    assert "ADD COLUMN IF NOT EXISTS `extra` Nullable(Int32) AFTER `Note \\`x\\``;" in added

    with pytest.raises(MigrationError) as refused:
        migrations.plan(CLICKHOUSE, pipeline(primary_key=["id", "region"]), tmp_path)
    assert "sink 'orders_ch': primary_key changed from ['id'] to ['id', 'region']" in str(refused.value)
    assert "sink 'more' was removed or renamed" in str(refused.value)


def test_tables_with_uint64_versions_get_an_upgrade_that_widens_them(tmp_path: Path) -> None:
    migrations.init(CLICKHOUSE, pipeline(), tmp_path)
    first = tmp_path / "shop" / "clickhouse" / "0001_init.sql"
    text = first.read_text()
    assert "`_version` UInt128," in text
    state_line = next(line for line in text.splitlines() if line.startswith(migrations.STATE_PREFIX))
    old_state = json.loads(state_line[len(migrations.STATE_PREFIX) :])
    del old_state["sinks"]["orders_ch"]["version_type"]
    first.write_text(text.replace(state_line, migrations.state_line(old_state)))
    (written,) = migrations.init(CLICKHOUSE, pipeline(), tmp_path).written
    assert written.filename == "0002_upgrade_versions_orders_ch.sql"
    body = migrations.parse_migration(written.text).body
    assert (
        ch_migrations.split_statements(body)[0] == "ALTER TABLE `analytics`.`orders` MODIFY COLUMN `_version` UInt128"
    )
    assert migrations.plan(CLICKHOUSE, pipeline(), tmp_path) == []


# ---- executor-side shaping ---------------------------------------------------------------------------------------


def _decoded(offsets: list[int], partition: int = 3) -> Any:
    import pyarrow as pa

    n = len(offsets)
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "amount": pa.array([Decimal("1.00")] * n, pa.decimal128(12, 2)),
            "_cdc_op": ["c"] * (n - 1) + ["d"],
            "_cdc_version": pa.array([(1 << 64) + o for o in offsets], pa.decimal128(38, 0)),
            "_cdc_ts": pa.array([dt.datetime(2024, 1, 1)] * n, pa.timestamp("us", tz="UTC")),
            "_cdc_topic": ["shop.orders"] * n,
            "_cdc_partition": pa.array([partition] * n, pa.int32()),
            "_cdc_offset": pa.array(offsets, pa.int64()),
        }
    )


def test_deduplication_token_names_the_kafka_range_and_repeats_for_the_same_rows() -> None:
    token = deduplication_token("cdcsync/shop/orders_ch/ckpt/17", _decoded([500, 502, 501]))
    assert token == "cdcsync/shop/orders_ch/ckpt/17/shop.orders-3@500-502#3"
    assert deduplication_token("p", _decoded([500, 502, 501])) == deduplication_token("p", _decoded([501, 500, 502]))
    assert deduplication_token("p", _decoded([500, 501])) != deduplication_token("p", _decoded([500, 501, 502]))
    assert deduplication_token("p", _decoded([1, 2], 0)) != deduplication_token("p", _decoded([1, 2], 1))


def test_rows_for_clickhouse_carry_version_and_deleted_flag() -> None:
    import pyarrow as pa

    rows = to_clickhouse_arrow(_decoded([7, 8]), ("id", "amount"))
    assert rows.column_names == ["id", "amount", "_version", "_is_deleted", "_cdc_ts"]
    assert rows.schema.field("_version").type == pa.decimal128(38, 0)  # into UInt128; Arrow has no such type
    assert rows.column("_is_deleted").to_pylist() == [0, 1]
    assert rows.column("_version").to_pylist() == [(1 << 64) + 7, (1 << 64) + 8]


def test_retriable_errors_are_told_apart_by_code_not_text() -> None:
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    from cdcsync.db.clickhouse import is_retriable, wrap_clickhouse_error

    assert is_retriable(OperationalError("connection refused"))
    assert is_retriable(DatabaseError("Too many parts", code=252))
    assert not is_retriable(DatabaseError("Syntax error: timeout", code=62))
    error = wrap_clickhouse_error(DatabaseError("Unknown table", code=60), "sink 'x': inserting batch 3 into a.b")
    assert (error.retriable, error.user_error) == (False, False)
    assert str(error) == "sink 'x': inserting batch 3 into a.b: Unknown table"


@pytest.mark.parametrize(
    ("partition_by", "markers"),
    [
        (None, False),
        ("intHash32(id) % 8", False),  # key columns only: a change always lands in its key's partition
        ("toYYYYMM(at)", True),
        ("ifNull(region, 'id')", True),  # a literal naming a column is not a read of it
        ("`Note ``x``` != ''", True),  # ClickHouse escapes quotes by doubling them
        ("`Note \\`x\\`` != ''", True),  # or with a backslash
        ("'`id`' || `region`", True),
        ("'it''s toYYYYMM(at)' || toString(id)", False),
        ("`it's` = toYYYYMM(at)", True),
    ],
)
def test_partition_markers_only_when_the_partition_reads_non_key_columns(
    partition_by: str | None, markers: bool
) -> None:
    from cdcsync.sinks.clickhouse import ClickHouseTableSink

    piped = pipeline(partition_by=partition_by)
    sink = ClickHouseTableSink(piped, "orders_ch", piped.clickhouse_sinks()["orders_ch"], "postgresql://", "http://x")
    writer = sink.stage_writer(0, "c")
    assert bool(writer.markers_sql) is markers
    if markers:
        assert writer.markers_sql.startswith("INSERT INTO `analytics`.`orders` (`id`, `region`")
        assert "s.`_partition_id` != n.`_partition_id`" in writer.markers_sql
