"""The dev stack against the real thing: Postgres from the wheel, a KRaft Kafka broker on the local JVM, chDB.

Ports are picked free at run time so that a developer's own ``cdcsync dev up`` (default ports) keeps running.
The tests in this module share one stack and run in order; the last one takes it down.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdcsync.devstack import DevStackConfig, down, env_lines, status, up
from cdcsync.devstack.common import port_open, process_command_line
from tests.ports import free_ports

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStackConfig]:
    pg, broker, controller, clickhouse, registry = free_ports(5)
    config = DevStackConfig(
        state_dir=tmp_path_factory.mktemp("devstack-state"),
        postgres_port=pg,
        kafka_port=broker,
        kafka_controller_port=controller,
        clickhouse_port=clickhouse,
        schema_registry_port=registry,
    )
    try:
        yield config
    finally:
        down(config)


@pytest.fixture(scope="module")
def first_up(cfg: DevStackConfig) -> dict[str, int]:
    result = up(cfg)
    assert all(s.running for s in result.values()), result
    pids = {name: s.pid for name, s in result.items()}
    assert all(isinstance(pid, int) for pid in pids.values())
    return {name: pid for name, pid in pids.items() if pid is not None}


def test_postgres_is_logical_and_reachable(cfg: DevStackConfig, first_up: dict[str, int]) -> None:
    import psycopg

    dsn = f"postgresql://cdcsync@127.0.0.1:{cfg.postgres_port}/cdcsync"
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW wal_level").fetchone()
        assert row is not None and row[0] == "logical"
        slots = conn.execute("SHOW max_replication_slots").fetchone()
        senders = conn.execute("SHOW max_wal_senders").fetchone()
        assert slots is not None and int(slots[0]) >= 4
        assert senders is not None and int(senders[0]) >= 4
        user = conn.execute("SELECT current_user, current_database()").fetchone()
        assert user == ("cdcsync", "cdcsync")


def test_kafka_round_trip(cfg: DevStackConfig, first_up: dict[str, int]) -> None:
    from confluent_kafka import Consumer, Producer

    bootstrap = f"127.0.0.1:{cfg.kafka_port}"
    topic = f"devstack-smoke-{uuid.uuid4().hex[:8]}"
    payload = uuid.uuid4().hex.encode()

    producer = Producer({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 60
    delivered: list[object] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is None:
            delivered.append(msg)

    # The first produce to a new topic may race its auto-creation; retry until one is acknowledged.
    while not delivered and time.monotonic() < deadline:
        producer.produce(topic, key=b"k", value=payload, on_delivery=on_delivery)
        producer.flush(10)
    assert delivered, "no message was acknowledged by the broker"

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"devstack-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        received = None
        while received is None and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                received = msg
        assert received is not None, "the produced message was not consumed back"
        assert received.value() == payload
        assert received.key() == b"k"
    finally:
        consumer.close()


def test_clickhouse_answers_over_http(cfg: DevStackConfig, first_up: dict[str, int]) -> None:
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=f"http://default@127.0.0.1:{cfg.clickhouse_port}")
    assert client.ping()
    assert client.command("SELECT version()").startswith("2")
    client.command("CREATE TABLE IF NOT EXISTS default.kept (x UInt8) ENGINE = MergeTree ORDER BY x")
    client.close()


def test_schema_registry_is_apicurio_with_both_apis(cfg: DevStackConfig, first_up: dict[str, int]) -> None:
    import json
    import urllib.request

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    url = f"http://127.0.0.1:{cfg.schema_registry_port}/apis/ccompat/v7"
    schema = {"type": "record", "name": "Kept", "fields": [{"name": "x", "type": "int"}]}
    schema_id = SchemaRegistryClient({"url": url}).register_schema("kept-value", Schema(json.dumps(schema), "AVRO"))
    v2 = f"http://127.0.0.1:{cfg.schema_registry_port}/apis/registry/v2/ids/contentIds/{schema_id}"
    with urllib.request.urlopen(v2, timeout=10) as answer:
        assert json.loads(answer.read()) == schema


def test_up_is_idempotent(cfg: DevStackConfig, first_up: dict[str, int]) -> None:
    again = up(cfg)
    assert {name: s.pid for name, s in again.items()} == first_up
    assert not any(s.started for s in again.values())
    states = {name: s.state for name, s in status(cfg).items()}
    assert {"postgres", "kafka", "clickhouse"} <= states.keys()
    assert set(states.values()) == {"running"}, states


def test_env_lines(cfg: DevStackConfig) -> None:
    lines = env_lines(cfg)
    assert f"export CDCSYNC__POSTGRES__DSN=postgresql://cdcsync@127.0.0.1:{cfg.postgres_port}/cdcsync" in lines
    assert f"export CDCSYNC__KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:{cfg.kafka_port}" in lines
    assert f"export CDCSYNC__CLICKHOUSE__URL=http://default@127.0.0.1:{cfg.clickhouse_port}" in lines
    registry = f"http://127.0.0.1:{cfg.schema_registry_port}/apis/ccompat/v7"
    assert f"export CDCSYNC__SCHEMA_REGISTRY__URL={registry}" in lines


def test_down_stops_what_it_started(cfg: DevStackConfig, first_up: dict[str, int]) -> None:
    result = down(cfg)
    assert all(s.state == "stopped" for s in result.values())
    for name, pid in first_up.items():
        assert process_command_line(pid) is None, f"{name} (pid {pid}) is still running"
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert not cfg.pid_file(name).exists()
    assert not port_open(cfg.postgres_port)
    assert not port_open(cfg.kafka_port)
    assert not port_open(cfg.clickhouse_port)
    assert not port_open(cfg.schema_registry_port)
    assert {s.state for s in status(cfg).values()} == {"stopped"}
    # Nothing left to stop: a second down is a no-op, not an error.
    assert all(s.state == "stopped" for s in down(cfg).values())
    assert Path(cfg.root / "postgres" / "data" / "PG_VERSION").is_file()
    assert any((cfg.root / "clickhouse" / "data" / "metadata" / "default").glob("kept*"))
    assert (cfg.root / "schema-registry" / "data" / "registry.mv.db").is_file()
