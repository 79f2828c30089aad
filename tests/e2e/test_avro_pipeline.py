"""Avro end to end with the real ``cdcsync`` command: bad messages in a stream of Debezium's Avro wire format.

A message whose writer schema id the registry does not know, and one whose Avro body was cut short, must land
in ``cdcsync.dead_letters`` at their own topic/partition/offset while the rest of the stream arrives; under
``on_decode_error: fail`` the run must stop with exit 1 naming where the message is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cdcsync.devstack import workload
from tests.e2e.conftest import Project, ledger_batches, mirror_rows

pytestmark = pytest.mark.e2e

UNKNOWN_SCHEMA_ID = 2_000_000_000


def _avro_project(
    make_project: Callable[[dict[str, Any]], Project], registry_url: str, name: str, topic: str, **source: Any
) -> Project:
    project = make_project(
        {
            "name": name,
            "sources": {
                "orders": {
                    "type": "kafka",
                    "topic": topic,
                    "format": "avro",
                    "primary_key": "id",
                    "columns": dict(workload.ORDERS_COLUMNS),
                    **source,
                }
            },
            "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": name, "table": "orders"}},
        }
    )
    project.env["CDCSYNC__SCHEMA_REGISTRY__URL"] = registry_url
    return project


def _message_at(bootstrap: str, topic: str, partition: int, offset: int) -> bytes | None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cdcsync-test-read", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        message = consumer.poll(30)
        assert message is not None and message.error() is None, f"nothing at {topic}/{partition}@{offset}"
        return message.value()  # type: ignore[no-any-return]
    finally:
        consumer.close()


def test_unknown_schema_ids_and_truncated_bodies_are_dead_letters_or_stop_the_run(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    schema_registry_url: str,
    topic_name: str,
) -> None:
    load = workload.generate(600, 150, seed=13)
    events = workload.to_avro(load.events, *workload.register_avro_schemas(schema_registry_url, topic_name))
    sample = next(event for event in events if event.value is not None)
    assert sample.value is not None
    unknown_id = b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + sample.value[5:]
    truncated = sample.value[: len(sample.value) // 2]
    bad = [
        workload.ChangeEvent(key=sample.key, value=value, id=sample.id, op="malformed")
        for value in (unknown_id, truncated)
    ]
    workload.produce(kafka_bootstrap, topic_name, events[:300] + bad + events[300:])

    project = _avro_project(make_project, schema_registry_url, "avro_dlq", topic_name, on_decode_error="dlq")
    project.prepare()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    columns = list(workload.ORDERS_COLUMNS)
    assert mirror_rows(postgres_dsn, "avro_dlq", "orders", columns) == load.expected
    with psycopg.connect(postgres_dsn) as conn:
        dead = conn.execute(
            'SELECT topic, "partition", "offset", value, reason FROM cdcsync.dead_letters WHERE pipeline = %s',
            ("avro_dlq",),
        ).fetchall()
    assert sorted(bytes(row[3]) for row in dead) == sorted([unknown_id, truncated])
    reasons = {bytes(row[3]): row[4] for row in dead}
    assert f"writer schema id {UNKNOWN_SCHEMA_ID} is not in the schema registry" in reasons[unknown_id]
    assert reasons[truncated]
    for topic, partition, offset, value, _reason in dead:  # each dead letter names where its message is
        assert topic == topic_name
        assert _message_at(kafka_bootstrap, topic, partition, offset) == bytes(value)
    status = project.cdcsync("status", str(project.pipeline_file)).stdout
    assert "dead letters: 2 message(s)" in status and "1 key(s)" in status, status  # both carry one key

    failing = _avro_project(make_project, schema_registry_url, "avro_fail", topic_name, on_decode_error="fail")
    failing.prepare()
    result = failing.cdcsync("run", str(failing.pipeline_file), "--available-now", check=False)
    assert result.returncode == 1, result.stderr[-3000:]
    named = [f"{topic}/{partition}@{offset}" for topic, partition, offset, _value, _reason in dead]
    assert any(where in result.stderr for where in named), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert ledger_batches(postgres_dsn, "avro_fail") == {}
