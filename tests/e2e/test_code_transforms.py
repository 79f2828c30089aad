"""``handler`` and ``script`` transforms through the real ``cdcsync`` command: a sandbox refusal from ``validate``,
then one run where a handler served by the test (failing now and then) enriches each change and a script chained
behind it filters and computes a column, into a Postgres mirror that must equal the expected rows exactly."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcsync.devstack import workload
from tests.e2e.conftest import Project, assert_each_batch_once, mirror_rows, orders_pipeline

pytestmark = pytest.mark.e2e

SCRIPT = """
def process(input):
    if input['status'] == 'refunded':
        return None
    gross = None if input['amount'] is None else (input['amount'] * Decimal('1.2')).quantize(Decimal('0.01'))
    return {'gross': gross, 'status': input['status'].upper()}
"""


def band(amount: Decimal | str | None) -> str | None:
    return None if amount is None else "big" if Decimal(amount) >= 500 else "small"


class FlakyEnricher(http.server.BaseHTTPRequestHandler):
    """Answers each batch with the band of each change's amount; every third request first fails (503 or 429)."""

    requests = 0
    lock = threading.Lock()
    rows_seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            type(self).requests += 1
            failing = self.requests % 3 == 0
            if not failing:
                self.rows_seen.extend(body)
        if failing:
            status, answer = (503 if self.requests % 2 else 429), {"error": "try later"}
        else:
            status, answer = 200, [{"amount_band": band(row["amount"])} for row in body]
        raw = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def enricher() -> Iterator[str]:
    FlakyEnricher.requests = 0
    FlakyEnricher.rows_seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyEnricher)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/enrich"
    server.shutdown()
    server.server_close()


def test_handler_then_script_into_a_mirror(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
    tmp_path: Path,
    enricher: str,
) -> None:
    load = workload.generate(800, 200, seed=16, tombstones=False)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    pipeline = orders_pipeline(topic_name, max_offsets_per_trigger=500)
    pipeline["transforms"] = {
        "enriched": {
            "type": "handler",
            "from": "orders",
            "url": enricher,
            "batch_size": 40,
            "concurrency": 3,
            "retry_budget_s": 30,
            "schema_overrides": {"amount_band": "text"},
        },
        "scored": {
            "type": "script",
            "from": "enriched",
            "language": "python",
            "script": SCRIPT,
            "schema_overrides": {"gross": "numeric(14,2)", "Note": None},
        },
    }
    pipeline["sinks"] = {
        "scored_mirror": {
            "type": "postgres",
            "from": "scored",
            "schema": "app",
            "table": "scored",
            "delete_mode": "hard",
        }
    }
    project = make_project(pipeline)

    bad = tmp_path / "bad.yaml"
    unsafe = json.loads(json.dumps(pipeline))
    unsafe["transforms"]["scored"]["script"] = "import os\ndef process(input):\n    return input.__dict__"
    bad.write_text(yaml.safe_dump(unsafe))
    refused = project.cdcsync("validate", str(bad), check=False)
    assert refused.returncode == 2, refused.stderr
    assert "transforms.scored.script: line 1: imports are not allowed" in refused.stderr
    assert "transforms.scored.script: line 3: attribute '.__dict__' is not allowed" in refused.stderr

    project.prepare()
    migrations = "\n".join(path.read_text() for path in (tmp_path / "migrations").rglob("*.sql"))
    assert '"amount_band" text' in migrations and '"gross" numeric(14,2)' in migrations
    assert '"Note"' not in migrations  # removed by the script's overrides
    project.cdcsync("run", str(project.pipeline_file), "--available-now")

    assert FlakyEnricher.requests > len(FlakyEnricher.rows_seen) / 40  # some requests failed and were retried
    assert {row["_cdc_op"] for row in FlakyEnricher.rows_seen} <= {"c", "u", "r"}  # deletes are not sent
    expected = {
        key: {
            "id": key,
            "amount": row["amount"],
            "status": row["status"].upper(),
            "amount_band": band(row["amount"]),
            "gross": None if row["amount"] is None else (row["amount"] * Decimal("1.2")).quantize(Decimal("0.01")),
        }
        for key, row in load.expected.items()
        if row["status"] != "refunded"
    }
    assert len(expected) < len(load.expected)  # the script dropped some keys
    mirrored = mirror_rows(postgres_dsn, "app", "scored", ["id", "amount", "status", "amount_band", "gross"])
    assert mirrored == expected
    assert_each_batch_once(postgres_dsn, "e2e", ["scored_mirror"])
