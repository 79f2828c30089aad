"""``cdcsync init`` reads source columns from real services: the newest JsonConverter messages of a real Kafka
topic, and the latest schema of a subject in the (dev stack's Apicurio) schema registry. ``validate`` then works offline
from what ``init`` recorded, and ``migrate`` creates exactly the typed columns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from typer.testing import CliRunner

from cdcsync import migrations
from cdcsync.cli import app
from cdcsync.config.types import parse_pg_type
from cdcsync.devstack import workload
from tests.integration.test_apicurio_registry import KEY_SCHEMA, ROW_FIELDS, client, envelope


def pipeline(topic: str, **source: Any) -> dict[str, Any]:
    return {
        "name": "intro",
        "sources": {"orders": {"type": "kafka", "topic": topic, **source}},
        "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}},
    }


@pytest.fixture()
def project(
    tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, schema_registry_url: str, monkeypatch: pytest.MonkeyPatch
) -> Path:
    monkeypatch.setenv("CDCSYNC__POSTGRES__DSN", postgres_dsn)
    monkeypatch.setenv("CDCSYNC__KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("CDCSYNC__SCHEMA_REGISTRY__URL", schema_registry_url)
    monkeypatch.setenv("CDCSYNC__MIGRATIONS_DIR", str(tmp_path / "migrations"))
    monkeypatch.setenv("CDCSYNC__STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "pipeline.yaml"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def table_columns(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT column_name, format_type(atttypid, atttypmod) FROM information_schema.columns c "
            "JOIN pg_attribute a ON a.attrelid = 'app.orders'::regclass AND a.attname = c.column_name "
            "WHERE table_schema = 'app' AND table_name = 'orders' ORDER BY ordinal_position"
        ).fetchall()
    return {name: type_text for name, type_text in rows if not name.startswith("_cdc_")}


def test_init_types_the_columns_from_the_newest_json_messages(
    project: Path, topic_name: str, kafka_bootstrap: str, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload.produce(kafka_bootstrap, topic_name, workload.generate(40, 10, seed=3, wrapped=True).events)
    project.write_text(yaml.safe_dump(pipeline(topic_name, columns={"status": "varchar(20)"})))
    code, out, err = invoke("init", str(project))
    assert code == 0, err
    [first] = migrations.list_migration_files(project.parent / "migrations", "intro", "postgres")
    state = migrations.read_migration(first).state
    assert state is not None
    assert state["sources"]["orders"] == {
        "topic": topic_name,
        "columns": [{"name": n, "type": parse_pg_type(t).sql} for n, t in workload.ORDERS_COLUMNS.items()],
        "primary_key": ["id"],  # from the message key's schema
    }
    # validate and migrate read the recorded columns: no Kafka needed any more.
    monkeypatch.setenv("CDCSYNC__KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    code, out, err = invoke("validate", str(project))
    assert code == 0 and "ok" in out, err
    code, _, err = invoke("migrate", str(project))
    assert code == 0, err
    assert table_columns(postgres_dsn) == {
        "id": "bigint",
        "customer_id": "bigint",
        "amount": "numeric(12,2)",
        "status": "character varying(20)",  # the declared type overrides the schema's text
        "Note": "text",
        "updated_at": "timestamp with time zone",
    }
    code, out, _ = invoke("init", str(project))  # offline: keeps the recorded columns, writes nothing
    assert code == 0 and "up to date" in out


def test_bare_json_messages_are_reported_and_declared_columns_still_work(
    project: Path, topic_name: str, kafka_bootstrap: str
) -> None:
    workload.produce(kafka_bootstrap, topic_name, workload.generate(5, 5, seed=1, wrapped=False).events)
    project.write_text(yaml.safe_dump(pipeline(topic_name)))
    code, _, err = invoke("init", str(project))
    assert code == 2
    assert "sources.orders.columns: cannot be read: the newest messages of topic" in err
    assert "no schema wrapper" in err and "declare them here" in err and "Traceback" not in err
    project.write_text(yaml.safe_dump(pipeline(topic_name, primary_key="id", columns=workload.ORDERS_COLUMNS)))
    code, _, err = invoke("init", str(project))
    assert code == 0 and "using the declared columns" in err


def test_a_missing_topic_says_so(project: Path, topic_name: str) -> None:
    project.write_text(yaml.safe_dump(pipeline(topic_name)))
    code, _, err = invoke("init", str(project))
    assert code == 2 and f"topic {topic_name} does not exist" in err, err


def test_init_types_the_columns_from_the_registry(project: Path, topic_name: str, schema_registry_url: str) -> None:
    registry = client(schema_registry_url)
    registry.register_schema(f"{topic_name}-value", _avro(envelope(ROW_FIELDS)))
    registry.register_schema(f"{topic_name}-key", _avro(KEY_SCHEMA))
    project.write_text(yaml.safe_dump(pipeline(topic_name, format="avro")))
    code, _, err = invoke("init", str(project))
    assert code == 0, err
    text = migrations.list_migration_files(project.parent / "migrations", "intro", "postgres")[0].read_text()
    for column in ('"id" bigint', '"amount" numeric(12,2)', '"day" date', '"at" timestamp without time zone'):
        assert column in text
    assert 'PRIMARY KEY ("id")' in text

    # The registry's newest version has a new column: the next init writes only the migration adding it.
    grown = [*ROW_FIELDS, {"name": "qty", "type": ["null", {"type": "int", "connect.type": "int16"}], "default": None}]
    registry.register_schema(f"{topic_name}-value", _avro(envelope(grown)))
    code, _, err = invoke("init", str(project))
    assert code == 0, err
    second = migrations.list_migration_files(project.parent / "migrations", "intro", "postgres")[-1]
    assert second.name == "0002_add_columns_mirror.sql"
    assert 'ADD COLUMN IF NOT EXISTS "qty" smallint' in second.read_text()


def test_an_unknown_subject_is_reported(project: Path, topic_name: str) -> None:
    project.write_text(yaml.safe_dump(pipeline(topic_name, format="avro")))
    code, _, err = invoke("init", str(project))
    assert code == 2 and f"has no subject '{topic_name}-value'" in err, err


def test_a_registry_url_without_its_api_path_is_named_not_taken_for_a_missing_subject(
    project: Path, topic_name: str, schema_registry_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apicurio's root answers 404 to every subject; init must not read that as "nothing published yet"."""
    monkeypatch.setenv("CDCSYNC__SCHEMA_REGISTRY__URL", schema_registry_url.split("/apis/")[0])
    project.write_text(yaml.safe_dump(pipeline(topic_name, format="avro")))
    code, _, err = invoke("init", str(project))
    assert code == 2 and "could not be read" in err and "CDCSYNC__SCHEMA_REGISTRY__URL" in err, err
    assert "has no subject" not in err


def _avro(schema: dict[str, Any]) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps(schema), "AVRO")
