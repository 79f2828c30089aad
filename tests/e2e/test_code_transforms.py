"""``handler`` and ``script`` transforms through the real ``cdcsync`` command: a sandbox refusal from ``validate``,
then one run where a handler served by the test (failing now and then) enriches each change, a Python script
chained behind it filters and computes a column and a JavaScript one adds another, into a Postgres mirror that must
equal the expected rows exactly."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcsync.devstack import workload
from tests.e2e.conftest import Project, assert_each_batch_once, mirror_rows, orders_pipeline
from tests.json_server import JsonServer, serving

pytestmark = pytest.mark.e2e

SCRIPT = """
def process(input):
    if input['status'] == 'refunded':
        return None
    gross = None if input['amount'] is None else (input['amount'] * Decimal('1.2')).quantize(Decimal('0.01'))
    return {'gross': gross, 'status': input['status'].upper()}
"""


JAVASCRIPT = """
function process(input) {
  return {channel: input.amount_band === 'big' ? 'sales' : 'web'};
}
"""


def band(amount: Decimal | str | None) -> str | None:
    return None if amount is None else "big" if Decimal(amount) >= 500 else "small"


def flaky_enricher() -> Callable[[Any], tuple[int, Any]]:
    """Answers each batch with the band of each change's amount; every third request fails (503 or 429)."""
    requests = itertools.count(1)

    def answer(body: Any) -> tuple[int, Any]:
        number = next(requests)
        if number % 3 == 0:
            return (503 if number % 2 else 429), {"error": "try later"}
        return 200, [{"amount_band": band(row["amount"])} for row in body]

    return answer


@pytest.fixture
def enricher() -> Iterator[JsonServer]:
    with serving(flaky_enricher()) as server:
        yield server


def test_handler_then_script_into_a_mirror(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
    tmp_path: Path,
    enricher: JsonServer,
) -> None:
    load = workload.generate(800, 200, seed=16, tombstones=False)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    pipeline = orders_pipeline(topic_name, max_offsets_per_trigger=500)
    pipeline["transforms"] = {
        "enriched": {
            "type": "handler",
            "from": "orders",
            "url": enricher.url,
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
    pipeline["transforms"]["routed"] = {
        "type": "script",
        "from": "scored",
        "language": "javascript",
        "script": JAVASCRIPT,
        "schema_overrides": {"channel": "text"},
    }
    pipeline["sinks"] = {
        "scored_mirror": {
            "type": "postgres",
            "from": "routed",
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

    sent = [row for body in enricher.bodies for row in body]
    assert len(enricher.bodies) >= 3 and {row["_cdc_op"] for row in sent} <= {"c", "u", "r"}  # no deletes sent
    assert len(sent) > load.counts["c"] + load.counts["u"]  # each third request failed and was sent again
    expected = {
        key: {
            "id": key,
            "amount": row["amount"],
            "status": row["status"].upper(),
            "amount_band": band(row["amount"]),
            "gross": None if row["amount"] is None else (row["amount"] * Decimal("1.2")).quantize(Decimal("0.01")),
            "channel": "sales" if band(row["amount"]) == "big" else "web",
        }
        for key, row in load.expected.items()
        if row["status"] != "refunded"
    }
    assert len(expected) < len(load.expected)  # the script dropped some keys
    mirrored = mirror_rows(postgres_dsn, "app", "scored", ["id", "amount", "status", "amount_band", "gross", "channel"])
    assert mirrored == expected
    assert_each_batch_once(postgres_dsn, "e2e", ["scored_mirror"])
