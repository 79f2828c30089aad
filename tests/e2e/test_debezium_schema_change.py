"""Issue 3, Deliver 7 and 8 with the real Debezium connector: pipelines that declare no columns (``cdcsync init``
reads them from the topic), a source table that gains columns mid-stream, and mirrors that must end equal to the
source with nothing lost. One source table and its topic, read by two pipelines (one Debezium capture, to keep
``make test`` lean):

* ``schema_evolution: stop`` (the default): ``run`` stops with exit 2 naming the new columns and their types;
  ``init`` writes the next migration (``ALTER TABLE … ADD COLUMN``), ``migrate`` applies it, and the next ``run``
  replays the batch that hit the change.
* ``schema_evolution: auto``: ``run`` writes and applies that migration itself and carries on, a second change in
  the same batch included; a later ``init`` has nothing to write.

Equality is checked as ``EXCEPT`` both ways over every column rendered as text by Postgres.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import yaml
from psycopg import sql

from cdcsync import migrations
from tests.conftest import DebeziumSource
from tests.e2e.conftest import Project

TABLE = "items"


def pipeline(topic: str, name: str = "evolve", schema: str = "app", **source: Any) -> dict[str, Any]:
    return {
        "name": name,
        "sources": {TABLE: {"type": "kafka", "topic": topic, "format": "json", "on_decode_error": "fail", **source}},
        "sinks": {"mirror": {"type": "postgres", "from": TABLE, "schema": schema, "table": TABLE}},
    }


def rows_as_text(dsn: str, schema: str) -> set[tuple[Any, ...]]:
    """Every row, every column (in name order, so both tables compare alike) rendered as text by Postgres."""
    with psycopg.connect(dsn) as conn:
        columns = [
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "AND column_name NOT LIKE '\\_cdc\\_%%' ORDER BY column_name",
                (schema, TABLE),
            )
        ]
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns),
            sql.Identifier(schema, TABLE),
        )
        return {tuple(zip(columns, row, strict=True)) for row in conn.execute(query)}


def assert_mirror_equals_source(source_dsn: str, target_dsn: str, schema: str = "app") -> None:
    source, mirror = rows_as_text(source_dsn, "public"), rows_as_text(target_dsn, schema)
    assert source, "the source table is empty: nothing was compared"
    assert not source - mirror and not mirror - source, (
        f"source EXCEPT mirror: {sorted(source - mirror)[:3]}; mirror EXCEPT source: {sorted(mirror - source)[:3]}"
    )


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def start_source(source: DebeziumSource) -> None:
    execute(
        source.dsn,
        f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, name text, amount numeric(10,2))",
        f"INSERT INTO {TABLE} SELECT g, 'item ' || g, g * 1.25 FROM generate_series(1, 30) g",
    )
    source.capture(f"public.{TABLE}")
    execute(source.dsn, f"UPDATE {TABLE} SET amount = amount + 1 WHERE id % 3 = 0", f"DELETE FROM {TABLE} WHERE id = 7")
    source.wait_caught_up()


def test_new_source_columns_stop_the_run_until_init_and_migrate_or_evolve_under_auto(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, debezium_source: DebeziumSource
) -> None:
    source = debezium_source
    start_source(source)
    topic = source.topic(f"public.{TABLE}")
    project = make_project(pipeline(topic))
    project.prepare()  # no columns declared: init reads them (and the key) from the topic
    text = migrations.list_migration_files(project.root / "migrations", "evolve", "postgres")[0].read_text()
    assert '"amount" numeric(10,2)' in text and 'PRIMARY KEY ("id")' in text
    # The same topic under schema_evolution: auto, into a schema of its own; its first run comes after the change.
    evolving = Project(project.root, project.root / "auto.yaml", dict(project.env), project.owner_dsn)
    evolving.pipeline_file.write_text(yaml.safe_dump(pipeline(topic, "evolve_auto", "auto", schema_evolution="auto")))
    evolving.prepare(as_writer=False)  # run applies the new columns' migration: the owner's work
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_mirror_equals_source(source.dsn, postgres_dsn)

    execute(
        source.dsn,
        f"ALTER TABLE {TABLE} ADD COLUMN note text, ADD COLUMN qty integer",
        f"UPDATE {TABLE} SET note = 'noted ' || id, qty = id * 2 WHERE id % 2 = 0",
        f"INSERT INTO {TABLE} VALUES (100, 'new', 9.99, 'fresh', 5), (101, 'bare', NULL, NULL, NULL)",
        f"DELETE FROM {TABLE} WHERE id = 3",
        f"UPDATE {TABLE} SET name = 'renamed' WHERE id = 5",
        f"ALTER TABLE {TABLE} ADD COLUMN tags text[]",  # a second change in the same batch
        f"INSERT INTO {TABLE} VALUES (200, 'two', 2.00, 'both', 7, '{{a,b}}')",
        f"UPDATE {TABLE} SET tags = '{{x}}', amount = NULL WHERE id BETWEEN 10 AND 15",
    )
    source.wait_caught_up()
    stopped = project.cdcsync("run", str(project.pipeline_file), "--available-now", check=False)
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    assert f"the schema of topic {topic} changed at partition" in stopped.stderr
    assert '"note" text' in stopped.stderr and '"qty" integer' in stopped.stderr
    assert "cdcsync init" in stopped.stderr and "Traceback" not in stopped.stderr

    ran = evolving.cdcsync("run", str(evolving.pipeline_file), "--available-now")
    assert "schema_evolution auto" in ran.stderr
    assert_mirror_equals_source(source.dsn, postgres_dsn, "auto")
    files = [
        path.name for path in migrations.list_migration_files(project.root / "migrations", "evolve_auto", "postgres")
    ]
    assert files[0] == "0001_init.sql" and len(files) >= 2 and all("add_columns" in f for f in files[1:])
    again = evolving.cdcsync("init", str(evolving.pipeline_file))
    assert "up to date" in again.stdout  # run recorded exactly what init would write

    written = project.cdcsync("init", str(project.pipeline_file))
    added = migrations.list_migration_files(project.root / "migrations", "evolve", "postgres")[-1]
    assert added.name == "0002_add_columns_mirror.sql", written.stdout
    assert 'ADD COLUMN IF NOT EXISTS "note" text' in added.read_text()
    assert 'ADD COLUMN IF NOT EXISTS "qty" integer' in added.read_text()
    project.cdcsync("migrate", str(project.pipeline_file))
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_mirror_equals_source(source.dsn, postgres_dsn)
