"""Debezium's unchanged-TOAST placeholders never become data, with the real connector (issue 12, item 3).

A table of large values (text, jsonb, text[], uuid[], bigint[], hstore: each stored out of line, so an update that leaves
it alone reaches Kafka as Debezium's placeholder of its type) gets updates of a small column only and primary-key
changes that leave the large values untouched. One ``cdcsync run --available-now`` lands it in a Postgres mirror,
through a SQL transform (filtering on the small column, declared ``untoasted_columns``) into a second mirror, and
into ClickHouse; each must equal the source. The topic is read back first, to prove every placeholder was sent.

The topic has one partition, so that a key change's delete and create are read by the same task: ClickHouse sinks
pair them only there (docs/clickhouse.md); Postgres sinks pair them across partitions too (tested in
tests/integration/test_postgres_sink.py).
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdcsync.config.toast import PLACEHOLDER_UUID
from cdcsync.config.types import hstore_text
from tests.conftest import ClickHouseDatabase, DebeziumSource
from tests.e2e.conftest import Project
from tests.e2e.test_debezium_types import changed_rows

pytestmark = pytest.mark.e2e

TABLE = "docs"
LARGE = {"body": "text", "doc": "jsonb", "tags": "text[]", "uids": "uuid[]", "nums": "bigint[]", "attrs": "hstore"}
COLUMNS = {"id": "bigint", "title": "text", **LARGE}
PLACEHOLDER = "__debezium_unavailable_value"
PLACEHOLDERS: dict[str, Any] = {
    "body": PLACEHOLDER,
    "doc": PLACEHOLDER,
    "tags": [PLACEHOLDER],
    "uids": [PLACEHOLDER_UUID],
    "nums": list(PLACEHOLDER.encode()),
    "attrs": json.dumps({PLACEHOLDER: PLACEHOLDER}, separators=(",", ":")),  # hstore.handling.mode=json, the default
}
"""What Debezium 3.5 sends per column for an unchanged TOASTed value (cdcsync.config.toast)."""


def large_values(rng: random.Random) -> list[Any]:
    """Values well over 2 kB even compressed (random), so Postgres stores them out of line."""
    return [
        rng.randbytes(6000).hex(),
        json.dumps({"blob": rng.randbytes(4000).hex(), "n": rng.randint(0, 9)}),
        [rng.randbytes(40).hex() for _ in range(150)],
        [str(uuid.UUID(bytes=rng.randbytes(16))) for _ in range(400)],
        [rng.getrandbits(63) for _ in range(700)],
        hstore_text({f"k{i}": rng.randbytes(20).hex() for i in range(150)}),
    ]


def workload(dsn: str) -> None:
    """Inserts, then updates of ``title`` alone and key changes that leave every large value untouched."""
    rng = random.Random(12)
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert = sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s, %s, %s::hstore)").format(sql.Identifier(TABLE))
        for key in range(1, 7):
            conn.execute(insert, [key, f"t{key}", *large_values(rng)])
        title = sql.SQL("UPDATE {} SET title = %s WHERE id = %s").format(sql.Identifier(TABLE))
        move = sql.SQL("UPDATE {} SET id = %s, title = %s WHERE id = %s").format(sql.Identifier(TABLE))
        conn.execute(title, ("renamed", 1))
        conn.execute(title, ("skip", 2))  # the transform drops it: its mirror must delete the row
        conn.execute(move, (10, "moved", 3))
        conn.execute(title, ("moved again", 10))  # the new key changes again, its large values still untouched
        with conn.transaction():  # a key change and an update of the new key in one transaction
            conn.execute(move, (11, "moved", 4))
            conn.execute(title, ("moved, then renamed", 11))
        conn.execute(sql.SQL("UPDATE {} SET body = 'small now' WHERE id = 5").format(sql.Identifier(TABLE)))
        conn.execute(title, ("after body", 5))


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([NewTopic(topic, 1, 1)]).values()
    future.result(timeout=30)


def source_rows(dsn: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        cursor = conn.execute(
            sql.SQL(
                "SELECT id, title, body, doc::text, tags, uids::text[], nums, hstore_to_json(attrs)::text FROM {}"
            ).format(sql.Identifier(TABLE))
        )
        return {row[0]: dict(zip(COLUMNS, row, strict=True)) for row in cursor}


def postgres_rows(dsn: str, table: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        cursor = conn.execute(
            sql.SQL(
                "SELECT id, title, body, doc::text, tags, uids::text[], nums, hstore_to_json(attrs)::text FROM {}"
            ).format(sql.Identifier("app", table))
        )
        return {row[0]: dict(zip(COLUMNS, row, strict=True)) for row in cursor}


def clickhouse_rows(database: ClickHouseDatabase) -> dict[int, dict[str, Any]]:
    result = database.client().query(
        f"SELECT {', '.join(COLUMNS)} FROM {TABLE} FINAL WHERE NOT _is_deleted", query_formats={"UUID": "string"}
    )
    return {row[0]: dict(zip(COLUMNS, row, strict=True)) for row in result.result_rows}


def normalised(rows: dict[int, dict[str, Any]], dsn: str) -> dict[int, dict[str, Any]]:
    """jsonb compared as parsed JSON (ClickHouse keeps the text Debezium sent, Postgres its own rendering), hstore
    as the JSON Postgres makes of it (ClickHouse keeps the hstore text in the order Debezium sent the pairs)."""
    with psycopg.connect(dsn) as conn:
        for row in rows.values():
            if not row["attrs"].startswith("{"):  # hstore text: as Postgres reads it
                (row["attrs"],) = conn.execute("SELECT hstore_to_json(%s::hstore)::text", (row["attrs"],)).fetchone()
    return {key: {**row, "doc": json.loads(row["doc"]), "attrs": json.loads(row["attrs"])} for key, row in rows.items()}


def test_toasted_values_follow_updates_and_key_changes_into_every_sink(
    debezium_source: DebeziumSource,
    make_project: Any,
    postgres_dsn: str,
    kafka_bootstrap: str,
    clickhouse_database: ClickHouseDatabase,
) -> None:
    ddl = sql.SQL(", ").join(sql.SQL("{} " + pg_type).format(sql.Identifier(n)) for n, pg_type in COLUMNS.items())
    for dsn in (debezium_source.dsn, postgres_dsn):  # the source's type, and the mirrors'
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS hstore")
    with psycopg.connect(debezium_source.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE public.{} ({}, PRIMARY KEY (id))").format(sql.Identifier(TABLE), ddl))
    topic = debezium_source.topic(f"public.{TABLE}")
    create_topic(kafka_bootstrap, topic)
    debezium_source.capture(f"public.{TABLE}")
    workload(debezium_source.dsn)
    debezium_source.wait_caught_up()
    sent = {
        name
        for row in changed_rows(kafka_bootstrap, topic, None)
        for name, placeholder in PLACEHOLDERS.items()
        if row.get(name) == placeholder
    }
    assert sent == set(LARGE), "every large column must have reached Kafka as a placeholder at least once"

    project: Project = make_project(
        {
            "name": f"toast_{uuid.uuid4().hex[:8]}",  # ClickHouse's migration ledger is shared by the session
            "sources": {
                TABLE: {
                    "type": "kafka",
                    "topic": topic,
                    "primary_key": "id",
                    "columns": COLUMNS,
                    "on_decode_error": "fail",
                    "untoasted_columns": ["title"],  # so the transform may filter on it
                }
            },
            "transforms": {
                "kept": {"type": "sql", "primary_key": "id", "sql": f"SELECT * FROM {TABLE} WHERE title <> 'skip'"}
            },
            "sinks": {
                "mirror": {"type": "postgres", "from": TABLE, "schema": "app", "table": TABLE},
                "kept_mirror": {"type": "postgres", "from": "kept", "schema": "app", "table": "kept"},
                "ch": {"type": "clickhouse", "from": TABLE, "database": clickhouse_database.database, "table": TABLE},
            },
        }
    )
    project.env["CDCSYNC__CLICKHOUSE__URL"] = clickhouse_database.url
    project.prepare()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")

    expected = source_rows(debezium_source.dsn)
    assert set(expected) == {1, 2, 5, 6, 10, 11}
    assert postgres_rows(postgres_dsn, TABLE) == expected
    assert postgres_rows(postgres_dsn, "kept") == {k: v for k, v in expected.items() if v["title"] != "skip"}
    assert normalised(clickhouse_rows(clickhouse_database), postgres_dsn) == normalised(expected, postgres_dsn)
