"""``cdcsync init`` for a ``topic_pattern`` source against a real Kafka: it lists the matching topics, reads each
one's columns and key from its newest JsonConverter messages, and renders a table per topic; a topic that appears
later gets the next migration, for its table alone. ``migrate`` creates the tables with their own keys."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from typer.testing import CliRunner

from cdcsync import migrations
from cdcsync.cli import app
from cdcsync.devstack.workload import ensure_topic

pytestmark = pytest.mark.integration


def field(name: str, kind: str, optional: bool = True) -> dict[str, Any]:
    return {"type": kind, "optional": optional, "field": name}


def produce(bootstrap: str, topic: str, key_fields: list[dict[str, Any]], row_fields: list[dict[str, Any]]) -> None:
    """Two JsonConverter change events (schemas enabled) with ``row_fields``, keyed by ``key_fields``."""
    from confluent_kafka import Producer

    ensure_topic(bootstrap, topic, 1)
    envelope = {
        "type": "struct",
        "name": f"{topic}.Envelope",
        "fields": [
            {"type": "struct", "fields": row_fields, "optional": True, "field": "before"},
            {"type": "struct", "fields": row_fields, "optional": True, "field": "after"},
            {"type": "struct", "fields": [field("lsn", "int64")], "field": "source"},
            field("op", "string", optional=False),
        ],
    }
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in (1, 2):
        row = {f["field"]: n for f in row_fields}
        key = {f["field"]: n for f in key_fields}
        producer.produce(
            topic,
            key=json.dumps({"schema": {"type": "struct", "fields": key_fields}, "payload": key}).encode(),
            value=json.dumps(
                {"schema": envelope, "payload": {"before": None, "after": row, "source": {"lsn": n}, "op": "c"}}
            ).encode(),
        )
    assert producer.flush(30) == 0


@pytest.fixture()
def project(
    tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, str]:
    monkeypatch.setenv("CDCSYNC__POSTGRES__DSN", postgres_dsn)
    monkeypatch.setenv("CDCSYNC__KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("CDCSYNC__MIGRATIONS_DIR", str(tmp_path / "migrations"))
    monkeypatch.setenv("CDCSYNC__STATE_DIR", str(tmp_path / "state"))
    prefix = f"route_{uuid.uuid4().hex[:8]}"
    schema = f"r_{prefix[-8:]}"
    doc = {
        "name": "routes",
        "sources": {"cdc": {"type": "kafka", "topic_pattern": prefix + r"\.public\..*"}},
        "sinks": {"mirror": {"type": "postgres", "from": "cdc", "schema": schema, "table": "{schema}_{table}"}},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, prefix


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def primary_keys(dsn: str, schema: str) -> dict[str, list[str]]:
    """Table -> its primary key columns, in key order, for every table of ``schema``."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname, a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, position) ON true "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
            "WHERE i.indisprimary AND n.nspname = %s ORDER BY c.relname, k.position",
            (schema,),
        ).fetchall()
    keys: dict[str, list[str]] = {}
    for table, column in rows:
        keys.setdefault(table, []).append(column)
    return keys


def test_init_renders_a_table_per_matching_topic_and_later_only_the_new_one(
    project: tuple[Path, str], kafka_bootstrap: str, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, prefix = project
    schema = yaml.safe_load(path.read_text())["sinks"]["mirror"]["schema"]
    produce(
        kafka_bootstrap,
        f"{prefix}.public.orders",
        [field("id", "int64", False)],
        [field("id", "int64", False), field("amount", "double")],
    )
    produce(
        kafka_bootstrap,
        f"{prefix}.public.lines",
        [field("order_id", "int64", False), field("line", "int32", False)],
        [field("order_id", "int64", False), field("line", "int32", False), field("qty", "int16")],
    )
    produce(kafka_bootstrap, f"{prefix}.audit.log", [field("id", "int64", False)], [field("id", "int64", False)])

    code, out, err = invoke("init", str(path))
    assert code == 0, err
    [first] = migrations.list_migration_files(path.parent / "migrations", "routes", "postgres")
    state = migrations.read_migration(first).state
    assert state is not None
    assert set(state["sinks"]) == {f"mirror[{prefix}.public.lines]", f"mirror[{prefix}.public.orders]"}
    assert state["sinks"][f"mirror[{prefix}.public.lines]"]["columns"] == [
        {"name": "order_id", "type": "bigint"},
        {"name": "line", "type": "integer"},
        {"name": "qty", "type": "smallint"},
    ]
    code, _, err = invoke("migrate", str(path))
    assert code == 0, err
    assert primary_keys(postgres_dsn, schema) == {"public_lines": ["order_id", "line"], "public_orders": ["id"]}

    # status reports each table's topic and sink
    from cdcsync.config.load import load_pipeline
    from cdcsync.config.settings import load_settings
    from cdcsync.runtime.status import pipeline_status

    settings = load_settings()
    report = pipeline_status(load_pipeline(path, migrations.recorded_lookup(settings.migrations_dir)), settings)
    assert {(row.source, row.topic, row.lag) for row in report.partitions} == {
        ("cdc", f"{prefix}.public.lines", 2),
        ("cdc", f"{prefix}.public.orders", 2),
    }
    assert {sink.target for sink in report.sinks} == {f"{schema}.public_lines", f"{schema}.public_orders"}

    # validate works offline from the recorded tables
    monkeypatch.setenv("CDCSYNC__KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    code, out, err = invoke("validate", str(path))
    assert code == 0 and "pipeline 'routes', 1 source(s), 1 sink(s), 2 routed table(s)" in out, (out, err)
    monkeypatch.setenv("CDCSYNC__KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)

    # A topic that appears later: the next migration creates its table alone.
    produce(
        kafka_bootstrap,
        f"{prefix}.public.refunds",
        [field("refund_id", "string", False)],
        [field("refund_id", "string", False), field("note", "string")],
    )
    code, out, err = invoke("init", str(path))
    assert code == 0, err
    files = migrations.list_migration_files(path.parent / "migrations", "routes", "postgres")
    assert [f.name for f in files][1:] == [f"0002_add_sink_mirror_{prefix}_public_refunds.sql"]
    body = migrations.read_migration(files[1]).body
    assert f'"{schema}"."public_refunds"' in body and "public_orders" not in body and "public_lines" not in body
    code, _, err = invoke("migrate", str(path))
    assert code == 0, err
    assert primary_keys(postgres_dsn, schema)["public_refunds"] == ["refund_id"]
    code, out, err = invoke("init", str(path))
    assert code == 0 and "up to date" in out, (out, err)
