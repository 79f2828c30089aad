"""Issue 3, Deliver 6 with the real Debezium connector: one ``topic_pattern`` source reads the topics of several
source tables (different columns, one composite key) and a routed sink lands each in a table of its own; then a
table created at the source mid-stream stops the run (exit 2, naming its topic) until ``init`` + ``migrate``
create its table, after which the replayed batch lands everything. Under ``schema_evolution: auto`` the run
writes and applies that migration itself and carries on.

Equality is checked as ``EXCEPT`` both ways over every column rendered as text by Postgres.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import yaml
from psycopg import sql

from cdcsync import migrations
from tests.conftest import ClickHouseDatabase, DebeziumSource
from tests.e2e.conftest import Project

TABLES = {
    "customers": "CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, tier smallint)",
    "orders": (
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(10,2), "
        "placed_at timestamptz, note text)"
    ),
    "order_lines": (
        "CREATE TABLE order_lines (order_id bigint, line integer, sku varchar(12), qty integer, "
        "PRIMARY KEY (order_id, line))"
    ),
}
CLICKHOUSE_COMPARED = {
    "customers": ("id", "name"),
    "orders": ("id", "amount"),
    "order_lines": ("order_id", "line", "qty"),
    "refunds": ("refund_id", "amount"),
}
FILL = (
    "INSERT INTO customers SELECT g, 'customer ' || g, (g % 3)::smallint FROM generate_series(1, 200) g",
    "INSERT INTO orders SELECT g, g % 200 + 1, g * 1.25, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 hour', "
    "CASE WHEN g % 4 = 0 THEN NULL ELSE 'n' || g END FROM generate_series(1, 300) g",
    "INSERT INTO order_lines SELECT o, l, 'SKU-' || (o * 10 + l), l * 2 FROM generate_series(1, 100) o, "
    "generate_series(1, 3) l",
)
CHANGES = (
    "UPDATE customers SET tier = NULL WHERE id % 7 = 0",
    "DELETE FROM customers WHERE id BETWEEN 190 AND 200",
    "UPDATE orders SET amount = amount + 1, note = 'changed' WHERE id % 5 = 0",
    "DELETE FROM orders WHERE id % 11 = 0",
    "UPDATE order_lines SET qty = qty + 100 WHERE line = 2",
    "DELETE FROM order_lines WHERE order_id % 9 = 0 AND line = 3",
    "UPDATE order_lines SET line = 4 WHERE order_id = 1 AND line = 1",  # a key change
)


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def rows_as_text(dsn: str, schema: str, table: str) -> set[tuple[Any, ...]]:
    """Every row, every business column (in name order) rendered as text by Postgres."""
    with psycopg.connect(dsn) as conn:
        columns = [
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "AND column_name NOT LIKE '\\_cdc\\_%%' ORDER BY column_name",
                (schema, table),
            )
        ]
        assert columns, f"{schema}.{table} does not exist"
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns),
            sql.Identifier(schema, table),
        )
        return {tuple(zip(columns, row, strict=True)) for row in conn.execute(query)}


def assert_targets_equal_sources(source: DebeziumSource, target_dsn: str, schema: str, tables: list[str]) -> None:
    for table in tables:
        expected = rows_as_text(source.dsn, "public", table)
        got = rows_as_text(target_dsn, schema, f"public_{table}")
        assert expected, f"source table {table} is empty: nothing was compared"
        assert not expected - got and not got - expected, (
            f"{table}: source EXCEPT target: {sorted(expected - got)[:3]}; "
            f"target EXCEPT source: {sorted(got - expected)[:3]}"
        )


def pipeline(name: str, prefix: str, schema: str, schema_evolution: str = "stop") -> dict[str, Any]:
    return {
        "name": name,
        "sources": {
            "shop": {
                "type": "kafka",
                "topic_pattern": prefix + r"\.public\..*",
                "format": "json",
                "on_decode_error": "fail",
                "schema_evolution": schema_evolution,
            }
        },
        "sinks": {"mirror": {"type": "postgres", "from": "shop", "schema": schema, "table": "{schema}_{table}"}},
    }


def assert_clickhouse_equals_sources(source: DebeziumSource, clickhouse: ClickHouseDatabase) -> None:
    """Key and one value per row, as Python values, in every ClickHouse table (deleted rows hidden)."""
    client = clickhouse.client()
    for table, columns in CLICKHOUSE_COMPARED.items():
        names = ", ".join(columns)
        with psycopg.connect(source.dsn) as conn:
            expected = set(conn.execute(f"SELECT {names} FROM {table}").fetchall())
        query = f"SELECT {names} FROM `{clickhouse.database}`.`{table}` FINAL WHERE NOT _is_deleted"
        got = set(client.query(query).result_rows)
        assert expected and expected == got, (table, sorted(expected - got)[:3], sorted(got - expected)[:3])


def test_a_topic_pattern_routes_each_source_table_to_its_own_table(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    debezium_source: DebeziumSource,
    clickhouse_database: ClickHouseDatabase,
) -> None:
    source = debezium_source
    execute(source.dsn, *TABLES.values(), *FILL)
    source.capture()  # every table of public, and tables created later
    execute(source.dsn, *CHANGES)
    source.wait_caught_up()

    project = make_project(pipeline("routed", source.name, source.name))
    project.prepare()
    # The same topics under schema_evolution: auto, into tables of their own (first run after the new table).
    # The same topics under schema_evolution: auto, into tables of their own in Postgres and in ClickHouse (first
    # run after the new table). Unique name: ClickHouse's migration ledger is shared by the test session.
    evolving = Project(project.root, project.root / "auto.yaml", dict(project.env), project.owner_dsn)
    evolving.env["CDCSYNC__CLICKHOUSE__URL"] = clickhouse_database.url
    auto = pipeline(f"routed_auto_{uuid.uuid4().hex[:8]}", source.name, "auto", "auto")
    auto["sinks"]["analytics"] = {
        "type": "clickhouse",
        "from": "shop",
        "database": clickhouse_database.database,
        "table": "{table}",
    }
    evolving.pipeline_file.write_text(yaml.safe_dump(auto))
    evolving.prepare(as_writer=False)  # run applies the new table's migration: the owner's work
    [first] = migrations.list_migration_files(project.root / "migrations", "routed", "postgres")
    text = first.read_text()
    assert 'PRIMARY KEY ("order_id", "line")' in text and '"amount" numeric(10,2)' in text
    ran = project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert f"mirror[{source.topic('public.order_lines')}] -> {source.name}.public_order_lines" in ran.stdout
    assert_targets_equal_sources(source, postgres_dsn, source.name, list(TABLES))

    # A table created at the source mid-stream: its topic matches, but no migration created its table yet.
    execute(
        source.dsn,
        "CREATE TABLE refunds (refund_id text PRIMARY KEY, order_id bigint, amount numeric(8,2))",
        "INSERT INTO refunds SELECT 'R' || g, g, g * 0.5 FROM generate_series(1, 60) g",
        "UPDATE orders SET note = 'refunded' WHERE id <= 60",
        "DELETE FROM refunds WHERE refund_id = 'R7'",
    )
    source.wait_caught_up()
    stopped = project.cdcsync("run", str(project.pipeline_file), "--available-now", check=False)
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    assert f"read topic {source.topic('public.refunds')} (partition" in stopped.stderr
    assert "cdcsync init" in stopped.stderr and "Traceback" not in stopped.stderr

    ran = evolving.cdcsync("run", str(evolving.pipeline_file), "--available-now")
    assert f"topic {source.topic('public.refunds')} is a new source table" in ran.stderr
    assert_targets_equal_sources(source, postgres_dsn, "auto", [*TABLES, "refunds"])
    assert_clickhouse_equals_sources(source, clickhouse_database)
    assert "up to date" in evolving.cdcsync("init", str(evolving.pipeline_file)).stdout  # run wrote what init would

    written = project.cdcsync("init", str(project.pipeline_file))
    added = migrations.list_migration_files(project.root / "migrations", "routed", "postgres")[1:]
    assert [path.name for path in added] == [f"0002_add_sink_mirror_{source.name}_public_refunds.sql"], written.stdout
    assert 'PRIMARY KEY ("refund_id")' in added[0].read_text()
    project.cdcsync("migrate", str(project.pipeline_file))
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_targets_equal_sources(source, postgres_dsn, source.name, [*TABLES, "refunds"])
