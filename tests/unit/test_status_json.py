"""``cdcsync status --json``: the same facts as the tables, in a shape scripts can rely on."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from cdcsync.runtime.lock import LockHolder
from cdcsync.runtime.status import PartitionStatus, PipelineStatus, SinkStatus


def test_status_as_json() -> None:
    at = datetime(2026, 11, 26, 14, 0, tzinfo=UTC)
    status = PipelineStatus(
        partitions=[PartitionStatus("orders", "shop.orders", 0, 90, 100)],
        sinks=[SinkStatus("mirror", "app.orders", 7, at, 42), SinkStatus("new", "app.new", None, None, 0)],
        dead_letters=3,
        dead_letter_keys=2,
        running=LockHolder(backend_pid=11, pid=4242, host="worker-1", since=at, client_addr=None),
    )
    document = json.loads(json.dumps(status.to_json("shop")))
    assert document == {
        "pipeline": "shop",
        "partitions": [
            {"source": "orders", "topic": "shop.orders", "partition": 0, "processed_up_to": 90, "end_offset": 100,
             "lag": 10}
        ],
        "sinks": [
            {"sink": "mirror", "target": "app.orders", "last_batch": 7, "committed_at": "2026-11-26T14:00:00+00:00",
             "rows": 42},
            {"sink": "new", "target": "app.new", "last_batch": None, "committed_at": None, "rows": 0},
        ],
        "bounded": [],
        "dead_letters": {"messages": 3, "keys": 2},
        "running": {"pid": 4242, "host": "worker-1", "since": "2026-11-26T14:00:00+00:00", "backend_pid": 11,
                    "client_addr": None},
    }  # fmt: skip
    assert PipelineStatus([], [], 0).to_json("shop")["running"] is None
