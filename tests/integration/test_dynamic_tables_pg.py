"""Dynamic tables on a real Postgres: the migration creates them, and every statement anyone runs on them (INSERT,
UPDATE, DELETE, TRUNCATE, from another session and another role) bumps their change counter."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.migrations import POSTGRES

pytestmark = pytest.mark.integration


def raw_pipeline(**tables: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "shop",
        "sources": {
            "orders": {
                "type": "kafka",
                "topic": "shop.public.orders",
                "primary_key": "id",
                "columns": {"id": "bigint", "customer_id": "bigint"},
            }
        },
        "transforms": {
            table_id: {"type": "dynamic_table", "backend_type": "postgres", "backend_entity_name": table_id, **table}
            for table_id, table in tables.items()
        },
        "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}},
    }


def pipeline(raw: dict[str, Any]) -> Pipeline:
    return validate_pipeline_dict(copy.deepcopy(raw))


def counter(conn: psycopg.Connection[Any], schema: str, table: str) -> int | None:
    row = conn.execute(
        "SELECT change_count FROM cdcsync.dynamic_table_changes WHERE table_schema = %s AND table_name = %s",
        (schema, table),
    ).fetchone()
    conn.commit()
    return None if row is None else int(row[0])


@pytest.fixture
def conn(postgres_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres_dsn) as connection:
        yield connection


VIP = {"backend_entity_name": 'VIP "customers"', "schema": "crm", "key_type": "bigint", "key_column": "customer id"}


def test_dynamic_table_is_created_and_counts_every_statement(
    conn: psycopg.Connection[Any], postgres_dsn: str, tmp_path: Path
) -> None:
    raw = raw_pipeline(vip=VIP, memo={"backend_type": "in_memory"})
    migrations.init(POSTGRES, pipeline(raw), tmp_path)
    assert [s.filename for s in migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)] == ["0001_init.sql"]

    columns = conn.execute(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = 'crm' AND table_name = %s ORDER BY ordinal_position",
        ('VIP "customers"',),
    ).fetchall()
    assert columns == [
        ("customer id", "bigint", "NO"),
        ("_cdc_pipeline", "text", "YES"),
        ("_cdc_checkpoint", "text", "YES"),
        ("_cdc_batch_id", "bigint", "YES"),
    ]
    pk = conn.execute(
        "SELECT array_agg(a.attname) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary",
        ('"crm"."VIP ""customers"""',),
    ).fetchone()
    assert pk is not None and pk[0] == ["customer id"]
    assert counter(conn, "crm", 'VIP "customers"') == 0, "seeded at creation"
    assert counter(conn, "public", "memo") is None, "in_memory tables have nothing in Postgres"

    # Another session, under a role that may edit the table but has no rights on cdcsync's own schema.
    role = f"editor_{uuid.uuid4().hex[:8]}"
    conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
    conn.execute(f'GRANT USAGE ON SCHEMA crm TO "{role}"')
    conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON "crm"."VIP ""customers""" TO "{role}"')
    conn.commit()
    try:
        with psycopg.connect(postgres_dsn, autocommit=True) as other:
            other.execute(f'SET ROLE "{role}"')
            table = '"crm"."VIP ""customers"""'
            steps = [
                (f'INSERT INTO {table} ("customer id") VALUES (1), (2), (3)', 1),
                (f'UPDATE {table} SET "customer id" = 4 WHERE "customer id" = 3', 2),
                (f'DELETE FROM {table} WHERE "customer id" = 1', 3),
                (f"TRUNCATE {table}", 4),
                (f'DELETE FROM {table} WHERE "customer id" = 42', 5),  # a statement, even if it changed no row
            ]
            for statement, expected in steps:
                other.execute(statement)
                assert counter(conn, "crm", 'VIP "customers"') == expected, statement
            with other.transaction():
                other.execute(f'INSERT INTO {table} ("customer id") VALUES (7)')
                other.execute(f'INSERT INTO {table} ("customer id") VALUES (8)')
            assert counter(conn, "crm", 'VIP "customers"') == 7
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                other.execute("UPDATE cdcsync.dynamic_table_changes SET change_count = 0")
            rows = other.execute(
                f'SELECT "customer id", _cdc_pipeline, _cdc_batch_id FROM {table} ORDER BY 1'
            ).fetchall()
            assert rows == [(7, None, None), (8, None, None)], "rows written by others have no bookkeeping"
    finally:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')
        conn.commit()


def test_a_dynamic_table_added_later_gets_its_own_migration(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    migrations.init(POSTGRES, pipeline(raw_pipeline()), tmp_path)
    migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)
    raw = raw_pipeline(seen={"sql": "SELECT customer_id FROM orders"})
    (written,) = migrations.init(POSTGRES, pipeline(raw), tmp_path).written
    assert written.filename == "0002_add_dynamic_table_seen.sql"
    assert [s.filename for s in migrations.apply_pending(POSTGRES, conn, "shop", tmp_path)] == [
        "0002_add_dynamic_table_seen.sql"
    ]
    migrations.check_ready(POSTGRES, conn, "shop", tmp_path, pipeline=pipeline(raw))
    assert counter(conn, "public", "seen") == 0
    conn.execute("INSERT INTO public.seen (customer_id) VALUES (10)")
    conn.commit()
    assert counter(conn, "public", "seen") == 1
