"""The schema registry is away for longer than the retry budget (moved here from the Avro end-to-end tests).

Executors retry the registry for ``schema_registry.retry_timeout_s``, then fail the batch as a service outage (not
a dead letter); the driver retries the batch inside its retry budget, then the run exits 1 naming the registry and
the budget it spent, with nothing dead-lettered, merged or ledgered. With the registry back the next run lands
every change."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from cdcsync.devstack import workload
from tests.e2e.conftest import Project, ledger_batches, mirror_rows
from tests.e2e.test_avro_pipeline import _avro_project
from tests.faults.harness import Figures, record
from tests.ports import free_port


def test_a_registry_outage_past_the_budget_stops_the_run_and_dead_letters_nothing(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    schema_registry_url: str,
    topic_name: str,
) -> None:
    load = workload.generate(400, 100, seed=17)
    events = workload.to_avro(load.events, *workload.register_avro_schemas(schema_registry_url, topic_name))
    workload.produce(kafka_bootstrap, topic_name, events)
    away = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"  # nobody listens there

    project = _avro_project(make_project, away, "avro_outage", topic_name, on_decode_error="dlq")
    project.env["CDCSYNC__SCHEMA_REGISTRY__RETRY_TIMEOUT_S"] = "1"
    project.env["CDCSYNC__RETRY__BUDGET_S"] = "4"
    project.prepare()
    result = project.cdcsync("run", str(project.pipeline_file), "--available-now", check=False)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "unreachable" in result.stderr and away in result.stderr, result.stderr[-3000:]
    assert "gave up after" in result.stderr and "retry budget 4s" in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("retrying with backoff") == 1, result.stderr[-3000:]  # once, not per attempt
    assert "Traceback" not in result.stderr
    with psycopg.connect(postgres_dsn) as conn:
        dead = conn.execute("SELECT count(*) FROM cdcsync.dead_letters WHERE pipeline = 'avro_outage'").fetchone()
    assert dead == (0,)
    assert ledger_batches(postgres_dsn, "avro_outage") == {}

    project.env["CDCSYNC__SCHEMA_REGISTRY__URL"] = schema_registry_url  # the registry is back
    back_at = time.monotonic()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    recovered = time.monotonic() - back_at
    mirror = mirror_rows(postgres_dsn, "avro_outage", "orders", list(workload.ORDERS_COLUMNS))
    lost = len(mirror.keys() ^ load.expected.keys()) + sum(
        mirror[key] != row for key, row in load.expected.items() if key in mirror
    )
    batches = ledger_batches(postgres_dsn, "avro_outage")["mirror"]
    twice = len(batches) - len(set(batches))
    record(Figures("schema registry down past the retry budget", 1, load.changes, lost, twice, recovered))
    assert (lost, twice) == (0, 0)
