"""webhook, print and blackhole sinks through the real ``cdcsync`` command, in one project: a webhook receiver that
fails now and then (503s, a request left past its timeout), and a SIGKILL of the run mid-stream.

Every change must reach the receiver at least once, none may be lost, and the idempotency keys must let the
receiver count each exactly once: a replayed part carries the same key and the same changes.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cdcsync.core.changes_json import OP_WORDS
from cdcsync.devstack import workload
from tests.e2e.conftest import Project, assert_each_batch_once, orders_pipeline, sigkill_mid_stream

pytestmark = pytest.mark.e2e

SECRET = "Bearer s3cret-do-not-log"


class FlakyReceiver:
    """A threaded local webhook receiver: every 7th request answers 503, the 4th answers only after the sink's
    timeout; every request is kept (idempotency key, headers, body), whatever it was answered."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.refused = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.requests.append((self.headers["Idempotency-Key"], dict(self.headers), body))
                    n = len(receiver.requests)
                if n == 4:
                    time.sleep(2.5)  # past timeout_s: the sink gives up on this answer and sends again
                status = 503 if n % 7 == 0 else 200
                if status != 200:
                    with receiver.lock:
                        receiver.refused += 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/orders"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[FlakyReceiver]:
    server = FlakyReceiver()
    yield server
    server.close()


def test_webhook_at_least_once_through_failures_and_a_kill_and_keys_count_it_once(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
    receiver: FlakyReceiver,
) -> None:
    # 18 micro-batches of 500 messages: the kill (after the second batch, plus up to 2 s) must come well before the
    # end even on a fast machine (3,000 changes needed only 6; test_kafka_sink_pipeline's 5 once saw 4 land first).
    load = workload.generate(9_000, 1_800, seed=31, wrapped=False, tombstones=False)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    per_batch = 500
    batches_needed = -(-len(load.events) // per_batch)
    pipeline = orders_pipeline(topic_name, max_offsets_per_trigger=per_batch)
    pipeline["sinks"] = {
        "hook": {
            "type": "webhook",
            "from": "orders",
            "url": receiver.url,
            "headers": {"Authorization": SECRET},
            "timeout_s": 1,
            "batch_size": 100,
        },
        "peek": {"type": "print", "from": "orders", "sample_every": 300},
        "discard": {"type": "blackhole", "from": "orders"},
    }
    project = make_project(pipeline)
    project.prepare()

    killed_at = sigkill_mid_stream(project, postgres_dsn, "e2e", after_batches=6)
    assert len(killed_at.get("hook", [])) < batches_needed, "the kill came after the stream was drained"
    sent_before_restart = len(receiver.requests)
    result = project.cdcsync("run", str(project.pipeline_file), "--available-now")

    # Replays are exact: a key seen twice carries the same changes.
    parts: dict[str, list[dict[str, Any]]] = {}
    for key, headers, body in receiver.requests:
        assert headers["Authorization"] == SECRET
        assert body["idempotency_key"] == key and key.startswith("e2e/hook/")
        assert parts.setdefault(key, body["changes"]) == body["changes"], f"part {key} changed on a replay"
    assert receiver.refused > 0 and len(receiver.requests) > len(parts), "no failure was injected"

    # Counted once by key, every message arrived exactly once: none lost.
    changes = [change for part in parts.values() for change in part]
    positions = [(c["_cdc_partition"], c["_cdc_offset"]) for c in changes]
    assert len(positions) == len(set(positions)) == len(load.events)
    newest: dict[int, dict[str, Any]] = {}
    for change in sorted(changes, key=lambda c: int(c["_cdc_version"])):
        newest[change["id"]] = change
    live = {key: change for key, change in newest.items() if change["_cdc_op"] != "d"}
    assert live.keys() == load.expected.keys()
    assert {k: (c["status"], c["amount"]) for k, c in live.items()} == {
        k: (row["status"], None if row["amount"] is None else str(row["amount"])) for k, row in load.expected.items()
    }
    assert len(receiver.requests) > sent_before_restart

    # print: sampled changes on the run's output (Spark forwards the executors' standard output to stderr).
    printed = [line.split(" ", 1) for line in result.stderr.splitlines() if line.split(" ", 1)[0] in OP_WORDS.values()]
    assert printed and all(json.loads(text)["_cdc_op"] in OP_WORDS for _, text in printed)
    assert SECRET.split()[1] not in result.stdout + result.stderr

    # blackhole and print: every batch once in the ledger, and the blackhole counted every change.
    assert_each_batch_once(postgres_dsn, "e2e", ["hook", "peek", "discard"])
    status = project.cdcsync("status", str(project.pipeline_file)).stdout
    discard = next(line for line in status.splitlines() if "discard" in line)
    assert f"{len(load.events):,}" in discard and "blackhole" in discard
    hook = next(line for line in status.splitlines() if line.lstrip("│ ").startswith("hook"))
    assert "/hooks/orders" in hook and f"{len(load.events):,}" in hook
