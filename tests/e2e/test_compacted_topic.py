"""A compacted topic, compacted by the real broker, read by a lagging pipeline: the deleted rows must go.

Debezium follows each delete with a tombstone. Kafka's log cleaner keeps only the newest record of each key, so once
it has run over a deleted key, the delete event is gone and only the tombstone says the row was deleted (until
``delete.retention.ms``). A pipeline that had landed the rows, then lagged while the source deleted them and the
cleaner ran, reads tombstones alone: each must delete its key in every kind of target (a Postgres mirror, an
aggregate's landing table and groups, ClickHouse), and a key re-inserted after its delete must stay.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from cdcsync.devstack import workload
from tests.conftest import ClickHouseDatabase
from tests.e2e.conftest import Project, mirror_rows

COMPACTION_WAIT_S = 180
TOPIC_CONFIG = {  # the cleaner may run on every segment but the active one at once, and keeps tombstones a day
    "cleanup.policy": "compact",
    "segment.ms": "200",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "86400000",
}


class Source:
    """The source table ``items(id, grp, qty)`` and the Debezium JSON changes (no schemas) it emits."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.lsn = 1_000

    def change(self, op: str, key: int, qty: int | None = None) -> list[workload.ChangeEvent]:
        self.lsn += 10
        row = {"id": key, "grp": f"g{key % 3}", "qty": qty}
        before, after = ({"id": key, "grp": None, "qty": None}, None) if op == "d" else (None, row)
        value = {"op": op, "before": before, "after": after, "source": {"lsn": self.lsn, "ts_ms": 1_700_000_000_000}}
        message_key = json.dumps({"id": key}).encode()
        events = [workload.ChangeEvent(message_key, json.dumps(value).encode(), key, op, self.lsn)]
        if op == "d":
            del self.rows[key]
            events.append(workload.ChangeEvent(message_key, None, key, None, self.lsn))  # the tombstone
        else:
            self.rows[key] = row
        return events


def _create_compacted_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, config=TOPIC_CONFIG)])[topic].result(
        30
    )


def _messages(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every (key, value) the topic holds now, from its start."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}", "log_level": 0})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        found: list[tuple[bytes | None, bytes | None]] = []
        while True:
            message = consumer.poll(10)
            assert message is not None, f"{topic}: no message before offset {high}"
            found.append((message.key(), message.value()))
            if message.offset() >= high - 1:
                return found
    finally:
        consumer.close()


def _wait_for_compaction(bootstrap: str, topic: str, deleted: set[int]) -> None:
    """Until the cleaner removed every delete event (bounded): only tombstones then say those keys are gone.
    The active segment is never cleaned, so a message after ``segment.ms`` rolls it first."""
    time.sleep(0.5)
    roll = workload.ChangeEvent(json.dumps({"id": 999_999}).encode(), None, 999_999, None)  # a key never stored
    workload.produce(bootstrap, topic, [roll], partitions=1)
    deadline = time.monotonic() + COMPACTION_WAIT_S
    while True:
        messages = _messages(bootstrap, topic)
        deletes = [value for _key, value in messages if value is not None and b'"op": "d"' in value]
        tombstones = {json.loads(key)["id"] for key, value in messages if value is None and key is not None}
        if not deletes and deleted <= tombstones:
            return
        assert time.monotonic() < deadline, f"the log cleaner left {len(deletes)} delete events after the wait"
        time.sleep(2)


def test_a_lagging_pipeline_deletes_the_rows_whose_delete_events_compaction_removed(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
    clickhouse_database: ClickHouseDatabase,
) -> None:
    _create_compacted_topic(kafka_bootstrap, topic_name)
    source = Source()
    inserts = [event for key in range(1, 41) for event in source.change("c", key, qty=key)]
    workload.produce(kafka_bootstrap, topic_name, inserts, partitions=1)
    name = f"compact_{uuid.uuid4().hex[:8]}"  # ClickHouse's migration ledger is shared by the test session
    project = make_project(
        {
            "name": name,
            "sources": {
                "items": {
                    "type": "kafka",
                    "topic": topic_name,
                    "primary_key": "id",
                    "columns": {"id": "bigint", "grp": "text", "qty": "bigint"},
                }
            },
            "sinks": {
                "mirror": {"type": "postgres", "from": "items", "schema": "app", "table": "items"},
                "by_group": {
                    "type": "postgres_aggregate",
                    "from": "items",
                    "schema": "app",
                    "landing_table": "items_state",
                    "agg_table": "qty_by_group",
                    "group_by": {"grp": {"type": "text"}},
                    "aggregate": {"items": {"fn": "count"}, "qty": {"from": "qty", "fn": "sum"}},
                },
                "items_ch": {
                    "type": "clickhouse",
                    "from": "items",
                    "database": clickhouse_database.database,
                    "table": "items",
                },
            },
        }
    )
    project.env["CDCSYNC__CLICKHOUSE__URL"] = clickhouse_database.url
    project.prepare()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert len(mirror_rows(postgres_dsn, "app", "items", ["id"])) == 40

    # The pipeline lags: rows are updated and deleted, some re-inserted, and the cleaner runs meanwhile.
    later = [event for key in range(1, 21) for op in ("u", "d") for event in source.change(op, key, qty=100 + key)]
    later += [event for key in range(21, 26) for op in ("d", "c") for event in source.change(op, key, qty=500)]
    workload.produce(kafka_bootstrap, topic_name, later, partitions=1)
    _wait_for_compaction(kafka_bootstrap, topic_name, deleted=set(range(1, 21)))

    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert mirror_rows(postgres_dsn, "app", "items", ["id", "grp", "qty"]) == source.rows
    groups: dict[str, tuple[int, int]] = {}
    for row in source.rows.values():
        count, total = groups.get(row["grp"], (0, 0))
        groups[row["grp"]] = (count + 1, total + row["qty"])
    with psycopg.connect(postgres_dsn) as conn:
        aggregated = conn.execute("SELECT grp, items, qty FROM app.qty_by_group WHERE items > 0").fetchall()
    assert {grp: (int(items), int(qty)) for grp, items, qty in aggregated} == groups
    client = clickhouse_database.client()
    in_clickhouse = client.query("SELECT id, grp, qty FROM items FINAL WHERE NOT _is_deleted").result_rows
    assert {row[0]: dict(zip(("id", "grp", "qty"), row, strict=True)) for row in in_clickhouse} == source.rows
