"""The kafka sink through the real ``cdcsync`` command: a pipeline mirrors a Debezium topic into Postgres and
writes two kafka sinks (JSON with schemas, Avro through the registry); it is SIGKILLed once after its first
ledgered batch and run again; a second pipeline then reads both topics as its sources into two more mirrors.

All three mirrors must equal the source (versions included: the events carry the upstream position), and a
``read_committed`` consumer must see each change exactly once in each topic, each delete followed by a tombstone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from cdcsync.devstack import workload
from cdcsync.sinks.kafka_envelope import OP_HEADER
from tests.conftest import read_topic, run_env
from tests.e2e.conftest import Project, assert_each_batch_once, mirror_rows, orders_pipeline, sigkill_mid_stream

pytestmark = pytest.mark.e2e

COLUMNS = [*workload.ORDERS_COLUMNS, "_cdc_version"]


def test_kafka_sink_feeds_a_second_pipeline_exactly_once_through_a_kill(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    schema_registry_url: str,
    topic_name: str,
) -> None:
    # About 18 micro-batches of 500 messages: the kill (after the first batch, plus up to 2 s) must come well before
    # the end even on a fast machine (with 2,000 changes, 5 batches, a run once landed 4 before its kill).
    load = workload.generate(8_000, 1_600, seed=47, wrapped=True, tombstones=True)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    per_batch = 500
    batches_needed = -(-len(load.events) // per_batch)
    out_json, out_avro = f"{topic_name}.out_json", f"{topic_name}.out_avro"
    upstream = orders_pipeline(topic_name, max_offsets_per_trigger=per_batch)
    upstream["name"] = "up"
    upstream["sinks"] = {
        "mirror": {"type": "postgres", "from": "orders", "schema": "up", "table": "orders", "delete_mode": "hard"},
        "to_json": {"type": "kafka", "from": "orders", "topic": out_json, "topic_partitions": 3},
        "to_avro": {"type": "kafka", "from": "orders", "topic": out_avro, "data_format": "avro"},
    }
    project = make_project(upstream)
    project.env["CDCSYNC__SCHEMA_REGISTRY__URL"] = schema_registry_url
    project.prepare()

    killed_at = sigkill_mid_stream(project, postgres_dsn, "up", after_batches=3)
    assert len(killed_at.get("mirror", [])) < batches_needed, "the kill came after the stream was drained"
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_each_batch_once(postgres_dsn, "up", upstream["sinks"])
    status = project.cdcsync("status", str(project.pipeline_file)).stdout
    to_json = next(line for line in status.splitlines() if line.lstrip("│ ").startswith("to_json"))
    assert "kafka topic" in to_json and f"{len(load.events):,}" in to_json  # tombstones read are rows too
    mirror = mirror_rows(postgres_dsn, "up", "orders", COLUMNS)
    assert {k: {c: v for c, v in row.items() if c != "_cdc_version"} for k, row in mirror.items()} == load.expected

    # Each change once for a read_committed consumer, keyed like Debezium, op in the header, tombstones after deletes.
    changes = load.counts["c"] + load.counts["u"] + load.counts["d"]
    messages = read_topic(kafka_bootstrap, out_json)
    events = [(m, json.loads(m.value())["payload"]) for m in messages if m.value() is not None]
    assert len(events) == changes
    assert len({(e["source"]["sequence"], m.key()) for m, e in events}) == changes, "a change appears twice"
    assert all(dict(m.headers())[OP_HEADER].decode() == e["op"] for m, e in events)
    assert all(json.loads(m.key())["payload"] == {"id": (e["after"] or e["before"])["id"]} for m, e in events)
    # A tombstone follows each delete event of its key; one the source read after a delete that landed in an
    # earlier batch is passed on too (it may be all that a compacted topic says), so never fewer than deletes.
    assert len(messages) - len(events) >= load.counts["d"]
    last_event: dict[tuple[int, bytes], str] = {}
    for m in messages:
        if m.value() is None:
            assert last_event.get((m.partition(), m.key())) == "d", "a tombstone of a key that was not deleted"
        else:
            last_event[(m.partition(), m.key())] = json.loads(m.value())["payload"]["op"]
    avro_messages = read_topic(kafka_bootstrap, out_avro)
    assert len(avro_messages) == len(messages) and all(m.value() is None or m.value()[0] == 0 for m in avro_messages)

    # A second cdcsync pipeline reads both topics as Debezium sources.
    root = project.root / "downstream"
    root.mkdir()
    downstream = {
        "name": "down",
        "sources": {
            "from_json": {"type": "kafka", "topic": out_json, "primary_key": "id", "columns": workload.ORDERS_COLUMNS},
            "from_avro": {
                "type": "kafka",
                "topic": out_avro,
                "format": "avro",
                "primary_key": "id",
                "columns": workload.ORDERS_COLUMNS,
            },
        },
        "sinks": {
            "json_mirror": {"type": "postgres", "from": "from_json", "schema": "down", "table": "orders_json"},
            "avro_mirror": {"type": "postgres", "from": "from_avro", "schema": "down", "table": "orders_avro"},
        },
    }
    (root / "pipeline.yaml").write_text(yaml.safe_dump(downstream, sort_keys=False))
    env = run_env(
        postgres__dsn=postgres_dsn,
        kafka__bootstrap_servers=kafka_bootstrap,
        schema_registry__url=schema_registry_url,
        state_dir=root / "state",
        migrations_dir=root / "migrations",
    )
    second = Project(root, root / "pipeline.yaml", env)
    second.prepare()
    second.cdcsync("run", str(second.pipeline_file), "--available-now")
    assert mirror_rows(postgres_dsn, "down", "orders_json", COLUMNS) == mirror
    assert mirror_rows(postgres_dsn, "down", "orders_avro", COLUMNS) == mirror
