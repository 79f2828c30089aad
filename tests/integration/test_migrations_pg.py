"""Migrations against a real Postgres: apply, ledger, pending / altered detection, ``check_ready``."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.core.errors import MigrationError
from cdcsync.migrations import POSTGRES

pytestmark = pytest.mark.integration


def weird_raw() -> dict[str, Any]:
    return {
        "name": "shop",
        "sources": {
            "orders": {
                "type": "kafka",
                "topic": "shop.public.orders",
                "primary_key": ["order", 'we"ird'],
                "columns": {"order": "bigint", 'we"ird': "text", "select": "numeric(12,2)", "User Table": "jsonb"},
            }
        },
        "sinks": {
            "mirror": {"type": "postgres", "from": "orders", "schema": "User Table", "table": 'we"ird'},
            "Soft One": {
                "type": "postgres",
                "from": "orders",
                "schema": "order",
                "table": "select",
                "delete_mode": "soft",
            },
        },
    }


def pipeline(raw: dict[str, Any]) -> Pipeline:
    return validate_pipeline_dict(copy.deepcopy(raw))


@pytest.fixture
def conn(postgres_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres_dsn) as connection:
        yield connection


def columns_of(conn: psycopg.Connection[Any], schema: str, table: str) -> list[tuple[str, str, str]]:
    rows = conn.execute(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, table),
    ).fetchall()
    conn.commit()
    return [(r[0], r[1], r[2]) for r in rows]


def states(statuses: list[migrations.MigrationStatus]) -> list[tuple[str, str]]:
    return [(s.filename, s.state) for s in statuses]


def test_fresh_database_has_everything_pending(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    migrations.init(POSTGRES, pipeline(weird_raw()), tmp_path)
    assert states(migrations.status(POSTGRES, conn, "shop", tmp_path)) == [("0001_init.sql", "pending")]
    with pytest.raises(MigrationError) as caught:
        migrations.check_ready(POSTGRES, conn, "shop", tmp_path, pipeline_file="shop.yaml")
    path = str(tmp_path / "shop" / "postgres" / "0001_init.sql")
    assert path in str(caught.value)
    assert caught.value.hint is not None
    assert "cdcsync migrate shop.yaml" in caught.value.hint and f"-f {path}" in caught.value.hint


def test_no_migrations_at_all(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    with pytest.raises(MigrationError) as caught:
        migrations.check_ready(POSTGRES, conn, "shop", tmp_path)
    assert "has no migrations" in str(caught.value)
    assert caught.value.hint is not None and "cdcsync init" in caught.value.hint


def test_apply_creates_the_quoted_tables(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    migrations.init(POSTGRES, pipeline(weird_raw()), tmp_path)
    applied = migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)
    assert states(applied) == [("0001_init.sql", "applied")]
    assert applied[0].applied_at is not None

    assert columns_of(conn, "User Table", 'we"ird') == [
        ("order", "bigint", "NO"),
        ('we"ird', "text", "NO"),
        ("select", "numeric", "YES"),
        ("User Table", "jsonb", "YES"),
        ("_cdc_version", "numeric", "NO"),
        ("_cdc_ts", "timestamp with time zone", "YES"),
    ]
    assert [c[0] for c in columns_of(conn, "order", "select")][-1] == "_cdc_deleted"
    assert [c[0] for c in columns_of(conn, "cdcsync", "shop__mirror__stage")] == [
        "_batch_id",
        "order",
        'we"ird',
        "select",
        "User Table",
        "_cdc_op",
        "_cdc_version",
        "_cdc_ts",
    ]
    assert [c[0] for c in columns_of(conn, "cdcsync", "shop__mirror__tombstones")] == [
        "order",
        'we"ird',
        "_cdc_version",
    ]
    assert columns_of(conn, "cdcsync", "shop__Soft One__tombstones") == []
    for table in ("schema_migrations", "batch_ledger", "dead_letters"):
        assert columns_of(conn, "cdcsync", table), table

    row = conn.execute(
        "SELECT c.relpersistence, obj_description(c.oid, 'pg_class') FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'cdcsync' AND c.relname = %s",
        ("shop__mirror__stage",),
    ).fetchone()
    assert row is not None and row[0] == "u", "the staging table is UNLOGGED"
    comment = conn.execute("""SELECT obj_description('"User Table"."we""ird"'::regclass, 'pg_class')""").fetchone()
    assert comment is not None and "pipeline 'shop', sink 'mirror'" in comment[0]
    pk = conn.execute(
        """SELECT array_agg(a.attname ORDER BY array_position(i.indkey, a.attnum)) FROM pg_index i
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
           WHERE i.indrelid = '"User Table"."we""ird"'::regclass AND i.indisprimary"""
    ).fetchone()
    assert pk is not None and pk[0] == ["order", 'we"ird']
    conn.commit()

    assert states(migrations.status(POSTGRES, conn, "shop", tmp_path)) == [("0001_init.sql", "applied")]
    assert states(migrations.check_ready(POSTGRES, conn, "shop", tmp_path, pipeline=pipeline(weird_raw()))) == [
        ("0001_init.sql", "applied")
    ]
    assert migrations.apply_pending(POSTGRES, conn, "shop", tmp_path) == [], "nothing left to apply"


def test_second_init_after_adding_a_sink(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    raw = weird_raw()
    migrations.init(POSTGRES, pipeline(raw), tmp_path)
    migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)

    raw["sinks"]["copy"] = {"type": "postgres", "from": "orders", "schema": "app", "table": "Copy"}
    with pytest.raises(MigrationError, match="changed since its last migration"):
        migrations.check_ready(POSTGRES, conn, "shop", tmp_path, pipeline=pipeline(raw))
    written = migrations.init(POSTGRES, pipeline(raw), tmp_path).written
    assert [m.filename for m in written] == ["0002_add_sink_copy.sql"]
    assert states(migrations.status(POSTGRES, conn, "shop", tmp_path)) == [
        ("0001_init.sql", "applied"),
        ("0002_add_sink_copy.sql", "pending"),
    ]
    with pytest.raises(MigrationError) as caught:
        migrations.check_ready(POSTGRES, conn, "shop", tmp_path, pipeline=pipeline(raw))
    assert str(written[0].path) in str(caught.value) and "not been applied" in str(caught.value)

    assert states(migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)) == [("0002_add_sink_copy.sql", "applied")]
    assert columns_of(conn, "app", "Copy")
    migrations.check_ready(POSTGRES, conn, "shop", tmp_path, pipeline=pipeline(raw))


def test_added_column_migrates_mirror_and_stage(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    raw = weird_raw()
    migrations.init(POSTGRES, pipeline(raw), tmp_path)
    migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)
    raw["sources"]["orders"]["columns"]["Added Col"] = "timestamptz"
    written = migrations.init(POSTGRES, pipeline(raw), tmp_path).written
    # one file per sink, sorted by sink id ('Soft One' < 'mirror')
    assert [m.filename for m in written] == ["0002_add_columns_soft_one.sql", "0003_add_columns_mirror.sql"]
    assert len(migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)) == 2
    assert ("Added Col", "timestamp with time zone", "YES") in columns_of(conn, "User Table", 'we"ird')
    assert "Added Col" in [c[0] for c in columns_of(conn, "cdcsync", "shop__Soft One__stage")]


def test_altered_applied_file_is_reported(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    migrations.init(POSTGRES, pipeline(weird_raw()), tmp_path)
    migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)
    path = tmp_path / "shop" / "postgres" / "0001_init.sql"
    path.write_text(path.read_text().replace('"select" numeric(12,2)', '"select" numeric(14,2)', 1))

    (item,) = migrations.status(POSTGRES, conn, "shop", tmp_path)
    assert item.state == "altered" and item.applied_checksum != item.checksum
    with pytest.raises(MigrationError) as caught:
        migrations.check_ready(POSTGRES, conn, "shop", tmp_path)
    assert str(path) in str(caught.value) and "altered" in str(caught.value)
    assert caught.value.user_error
    with pytest.raises(MigrationError, match="altered"):
        migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)


def test_file_applied_with_psql_records_itself(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    (planned,) = migrations.init(POSTGRES, pipeline(weird_raw()), tmp_path).written
    with conn.transaction():  # what `psql --single-transaction -f FILE` does
        conn.execute(planned.path.read_text())
    assert states(migrations.status(POSTGRES, conn, "shop", tmp_path)) == [("0001_init.sql", "applied")]
    migrations.check_ready(POSTGRES, conn, "shop", tmp_path)


def test_failing_migration_rolls_back_and_names_the_file(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    migrations.init(POSTGRES, pipeline(weird_raw()), tmp_path)
    broken = tmp_path / "shop" / "postgres" / "0002_broken.sql"
    broken.write_text("CREATE TABLE public.half_done (id int);\nCREATE TABLE oops (;\n")
    with pytest.raises(MigrationError) as caught:
        migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)
    assert str(broken) in str(caught.value) and "42601" in str(caught.value)
    assert states(migrations.status(POSTGRES, conn, "shop", tmp_path)) == [
        ("0001_init.sql", "applied"),
        ("0002_broken.sql", "pending"),
    ]
    assert columns_of(conn, "public", "half_done") == [], "the failed file's transaction was rolled back"
    broken.write_text("CREATE TABLE public.half_done (id int);\n")
    assert states(migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)) == [("0002_broken.sql", "applied")]
    migrations.check_ready(POSTGRES, conn, "shop", tmp_path)


def test_autocommit_connection_works_too(postgres_dsn: str, tmp_path: Path) -> None:
    migrations.init(POSTGRES, pipeline(weird_raw()), tmp_path)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        assert len(migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)) == 1
        migrations.check_ready(POSTGRES, conn, "shop", tmp_path)


def test_bigint_versions_are_widened_in_place_and_run_refuses_until_then(
    conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """A database migrated when ``_cdc_version`` was a bigint (snapshot reads stored below zero): ``run`` names the
    command, ``init`` writes the upgrade, and applying it keeps every stored version (so their order) intact."""
    raw = {
        "name": "shop",
        "sources": {"orders": {"type": "kafka", "topic": "t", "primary_key": "id", "columns": {"id": "bigint"}}},
        "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}},
    }
    migrations.init(POSTGRES, pipeline(raw), tmp_path)
    first = tmp_path / "shop" / "postgres" / "0001_init.sql"
    text = first.read_text()
    state_line = next(line for line in text.splitlines() if line.startswith(migrations.STATE_PREFIX))
    old_state = migrations.parse_migration(text).state
    assert old_state is not None
    old_state["internal_version"] = 4
    del old_state["sinks"]["mirror"]["version_type"]
    old_text = text.replace(state_line, migrations.state_line(old_state)).replace("numeric(38,0)", "bigint")
    first.write_text(old_text)
    migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)
    old_versions = [-(2**62) + 5000, -(2**62) + 9000, 4990, 2**62 - 1]  # two snapshot reads, two changes
    for key, version in enumerate(old_versions):
        conn.execute('INSERT INTO app.orders (id, "_cdc_version") VALUES (%s, %s)', (key, version))
    conn.execute("INSERT INTO cdcsync.truncations (pipeline, sink, version) VALUES ('shop', 'mirror', 4990)")
    conn.commit()
    assert ("_cdc_version", "bigint", "NO") in columns_of(conn, "app", "orders")

    with pytest.raises(MigrationError) as refused:
        migrations.check_ready(POSTGRES, conn, "shop", tmp_path, pipeline_file="shop.yaml", pipeline=pipeline(raw))
    assert "_cdc_version" in str(refused.value) and "numeric(38,0)" in str(refused.value)
    assert refused.value.hint is not None and "cdcsync init shop.yaml" in refused.value.hint

    written = [m.filename for m in migrations.init(POSTGRES, pipeline(raw), tmp_path).written]
    assert written == ["0002_upgrade_internal_tables.sql", "0003_upgrade_versions_mirror.sql"]
    migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)
    migrations.check_ready(POSTGRES, conn, "shop", tmp_path, pipeline=pipeline(raw))
    for schema, table in (
        ("app", "orders"),
        ("cdcsync", "shop__mirror__stage"),
        ("cdcsync", "shop__mirror__tombstones"),
    ):
        assert ("_cdc_version", "numeric", "NO") in columns_of(conn, schema, table)
    stored = conn.execute('SELECT "_cdc_version" FROM app.orders ORDER BY id').fetchall()
    watermark = conn.execute("SELECT version FROM cdcsync.truncations WHERE sink = 'mirror'").fetchone()
    conn.commit()
    assert [int(v) for (v,) in stored] == old_versions and watermark is not None and int(watermark[0]) == 4990
    # Every change decoded from now on ranks above them: its commit position is above 2**64.
    assert max(old_versions) < 1 << 64
