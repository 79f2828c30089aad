"""SQL transforms and dynamic lookup tables, end to end with the real ``cdcsync`` command, Kafka and Postgres.

The expected targets are computed from the produced events with a small model of the semantics in docs/transforms.md:
a change whose transform rejects it becomes a delete of its key, and ``dynamic_table_check`` sees the table as
it was when the change was processed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cdcsync.devstack import workload
from cdcsync.runtime.checkpoint import committed_offsets
from tests.e2e.conftest import Project, ledger_batches, mirror_rows

pytestmark = pytest.mark.e2e

COLUMNS = list(workload.ORDERS_COLUMNS)


def _source(topic: str, **extra: Any) -> dict[str, Any]:
    return {"type": "kafka", "topic": topic, "primary_key": "id", "columns": dict(workload.ORDERS_COLUMNS), **extra}


def _change(event: workload.ChangeEvent) -> tuple[str, dict[str, Any] | None]:
    payload = json.loads(event.value or b"null")
    return payload["op"], payload["after"]


def _wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if process.poll() is not None:
            _out, err = process.communicate()
            raise AssertionError(f"cdcsync run exited {process.returncode} while waiting for {what}:\n{err[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _processed(project: Project, topic: str) -> int:
    """Messages of ``topic`` in the batches the running pipeline has committed (read as ``cdcsync status`` does)."""
    checkpoint = project.root / "state" / "checkpoints" / "e2e" / "orders"
    return sum(committed_offsets(checkpoint).get(topic, {}).values())


def test_lookup_filter_follows_edits_made_while_running(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topic_name: str
) -> None:
    load = workload.generate(6_000, 1_500, seed=41, customers=60)
    events = [event for event in load.events if event.value is not None]
    phases = [events[:2_000], events[2_000:4_000], events[4_000:]]
    project = make_project(
        {
            "name": "e2e",
            "sources": {"orders": _source(topic_name, max_offsets_per_trigger=700)},
            "transforms": {
                "vip_customers": {
                    "type": "dynamic_table",
                    "backend_type": "postgres",
                    "backend_entity_name": "vip_customers",
                    "schema": "crm",
                    "key_column": "customer_id",
                    "key_type": "bigint",
                },
                "vip_orders": {
                    "type": "sql",
                    "sql": "SELECT * FROM orders WHERE dynamic_table_check('vip_customers', customer_id)",
                    "primary_key": "id",
                },
            },
            "sinks": {"vip_mirror": {"type": "postgres", "from": "vip_orders", "schema": "app", "table": "vip_orders"}},
        }
    )
    project.prepare()

    def edit(statement: str) -> set[int]:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(statement)  # plain SQL by "someone else"
            return {row[0] for row in conn.execute("SELECT customer_id FROM crm.vip_customers")}

    vip_sets = [edit("INSERT INTO crm.vip_customers (customer_id) SELECT generate_series(1, 20)")]
    live: dict[int, tuple[int, int]] = {}  # id -> (phase, customer) of its newest change, deletes dropped

    def expected_ids() -> set[int]:
        return {key for key, (phase, customer) in live.items() if customer in vip_sets[phase]}

    def mirror_ids() -> set[int]:
        return set(mirror_rows(postgres_dsn, "app", "vip_orders", ["id"]))

    process = project.start("run", str(project.pipeline_file))  # streaming: the edits land while it runs
    try:
        for phase, chunk in enumerate(phases):
            if phase == 1:
                edit("DELETE FROM crm.vip_customers WHERE customer_id <= 8")
                vip_sets.append(edit("INSERT INTO crm.vip_customers (customer_id) SELECT generate_series(40, 55)"))
            elif phase == 2:
                vip_sets.append(
                    edit("UPDATE crm.vip_customers SET customer_id = customer_id + 1000 WHERE customer_id < 45")
                )
            workload.produce(kafka_bootstrap, topic_name, chunk)
            for event in chunk:
                op, after = _change(event)
                if op == "d":
                    live.pop(event.id, None)
                else:
                    assert after is not None
                    live[event.id] = (phase, after["customer_id"])
            want, produced = expected_ids(), sum(len(c) for c in phases[: phase + 1])
            _wait_for(
                lambda w=want, n=produced: _processed(project, topic_name) == n and mirror_ids() == w,
                f"phase {phase}",
                process,
            )
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=120)
    assert process.returncode == 0
    assert len({frozenset(vip) for vip in vip_sets}) == 3, "each phase ran with another VIP set"

    # Rows are the source's final rows, not just the right keys.
    rows = mirror_rows(postgres_dsn, "app", "vip_orders", COLUMNS)
    assert rows == {key: load.expected[key] for key in expected_ids()}
    assert 0 < len(rows) < len(load.expected)


def test_dedup_passes_each_customer_once_across_a_sigkill(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
) -> None:
    load = workload.generate(2_400, 2_400, seed=7, customers=300, mix=workload.OpMix(1, 0, 0), tombstones=False)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    project = make_project(
        {
            "name": "e2e",
            "sources": {"orders": _source(topic_name, max_offsets_per_trigger=300)},
            "transforms": {
                "seen_customers": {
                    "type": "dynamic_table",
                    "backend_type": "postgres",
                    "backend_entity_name": "seen_customers",
                    "sql": "SELECT customer_id FROM orders",
                },
                "first_orders": {
                    "type": "sql",
                    "sql": "SELECT * FROM orders WHERE NOT dynamic_table_check('seen_customers', customer_id)",
                    "primary_key": "id",
                },
            },
            "sinks": {
                "first_order": {"type": "postgres", "from": "first_orders", "schema": "app", "table": "first_order"}
            },
        }
    )
    project.prepare()

    process = project.start("run", str(project.pipeline_file), "--available-now")
    _wait_for(lambda: len(ledger_batches(postgres_dsn, "e2e").get("first_order", [])) >= 2, "two batches", process)
    time.sleep(random.uniform(0.0, 1.5))
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    killed_at = ledger_batches(postgres_dsn, "e2e").get("first_order", [])
    assert len(killed_at) < 8, "the kill came after the stream was drained"
    project.cdcsync("run", str(project.pipeline_file), "--available-now")

    customers_of = {key: row["customer_id"] for key, row in load.expected.items()}
    rows = mirror_rows(postgres_dsn, "app", "first_order", COLUMNS)
    passed = [row["customer_id"] for row in rows.values()]
    assert sorted(passed) == sorted(set(customers_of.values())), "each customer must pass exactly once"
    assert all(rows[key] == load.expected[key] for key in rows)
    with psycopg.connect(postgres_dsn) as conn:
        seen = {row[0] for row in conn.execute("SELECT customer_id FROM public.seen_customers")}
    assert seen == set(customers_of.values())
    for sink, ids in ledger_batches(postgres_dsn, "e2e").items():
        assert ids == list(range(len(ids))), f"{sink}: ledger batch ids {ids} are not 0..n-1, each once"
