"""Kafka -> Spark -> Postgres mirrors, end to end, with the real ``cdcsync`` command.

The workload generator knows the state the source table ends in; the mirrors must equal it exactly.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cdcsync.devstack import workload
from tests.e2e.conftest import (
    Project,
    assert_each_batch_once,
    ledger_batches,
    mirror_rows,
    orders_pipeline,
    sigkill_mid_stream,
)

COLUMNS = list(workload.ORDERS_COLUMNS)
SINKS = ("mirror", "audit")


def assert_hard_mirror_equals(dsn: str, expected: dict[int, dict[str, Any]]) -> None:
    actual = mirror_rows(dsn, "app", "Orders Mirror", COLUMNS)
    assert actual.keys() == expected.keys(), (
        f"{len(actual.keys() - expected.keys())} unexpected keys, {len(expected.keys() - actual.keys())} missing"
    )
    wrong = [key for key in expected if actual[key] != expected[key]]
    assert not wrong, f"{len(wrong)} rows differ, e.g. {actual[wrong[0]]} != {expected[wrong[0]]}"


def assert_soft_mirror_matches(dsn: str, expected: dict[int, dict[str, Any]]) -> None:
    rows = mirror_rows(dsn, "app", "order", [*COLUMNS, "_cdc_deleted"])
    live = {key: {c: row[c] for c in COLUMNS} for key, row in rows.items() if not row["_cdc_deleted"]}
    assert live == expected
    assert all(row["_cdc_deleted"] for key, row in rows.items() if key not in expected)


def test_changes_dead_letters_and_stale_replays(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topic_name: str
) -> None:
    load = workload.generate(50_000, 5_000, seed=11, wrapped=False)
    malformed = workload.malformed_events(wrapped=False)
    events = load.events[:20_000] + malformed + load.events[20_000:]
    workload.produce(kafka_bootstrap, topic_name, events)
    project = make_project(orders_pipeline(topic_name, max_offsets_per_trigger=15_000, on_decode_error="dlq"))
    project.prepare()

    # Spark's Kafka reader reads the first run, the executors' own read the second (sources.kafka_fetch): the
    # readers take over from each other at any batch, and both land every change exactly once.
    project.env["CDCSYNC__KAFKA__READER"] = "spark"
    first = project.cdcsync("--debug", "run", str(project.pipeline_file), "--available-now")
    assert "sink mirror" in first.stdout
    assert "Spark's Kafka reader reads the source's messages: kafka.reader is 'spark'" in first.stderr
    del project.env["CDCSYNC__KAFKA__READER"]

    assert_hard_mirror_equals(postgres_dsn, load.expected)
    assert_soft_mirror_matches(postgres_dsn, load.expected)
    with psycopg.connect(postgres_dsn) as conn:
        dead = conn.execute(
            'SELECT "offset", value, reason FROM cdcsync.dead_letters WHERE pipeline = %s ORDER BY "offset"', ("e2e",)
        ).fetchall()
    assert len(dead) == len(malformed)
    assert {bytes(row[1]) for row in dead} == {event.value for event in malformed}
    assert all(row[2] for row in dead)
    batches_before = assert_each_batch_once(postgres_dsn, "e2e", SINKS)
    assert len(batches_before["mirror"]) >= 4  # 55k messages in batches of 15k

    # Older versions of keys re-sent after the newer ones: the mirrors must not move.
    workload.produce(kafka_bootstrap, topic_name, workload.stale_replays(load, 500, seed=3))
    second = project.cdcsync("--debug", "run", str(project.pipeline_file), "--available-now")
    assert "Spark's Kafka reader reads" not in second.stderr
    assert_hard_mirror_equals(postgres_dsn, load.expected)
    assert_soft_mirror_matches(postgres_dsn, load.expected)
    batches_after = assert_each_batch_once(postgres_dsn, "e2e", SINKS)
    assert len(batches_after["mirror"]) > len(batches_before["mirror"])

    status = project.cdcsync("status", str(project.pipeline_file)).stdout
    assert status.count(f"{topic_name}/") == 4  # one line per partition
    assert f"{len(load.expected):,}" in status  # rows in the hard-delete mirror
    lags = [line.split("│")[-2].strip() for line in status.splitlines() if f"{topic_name}/" in line]
    assert lags == ["0"] * 4


# `make test` covers this sink through tests/faults/test_run_killed.py (mirror, aggregation and ClickHouse in one
# workload, 5 kills); this single-sink variant runs in `make soak`.
@pytest.mark.soak
def test_sigkill_mid_stream_then_restart(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topic_name: str
) -> None:
    load = workload.generate(50_000, 5_000, seed=23, wrapped=True)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    project = make_project(orders_pipeline(topic_name, max_offsets_per_trigger=4_000))
    project.prepare()

    killed_at = sigkill_mid_stream(project, postgres_dsn, "e2e", after_batches=3)
    assert sum(len(ids) for ids in killed_at.values()) < 2 * 14, "the kill came after the stream was drained"

    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_hard_mirror_equals(postgres_dsn, load.expected)
    assert_soft_mirror_matches(postgres_dsn, load.expected)
    batches = assert_each_batch_once(postgres_dsn, "e2e", SINKS)
    assert len(batches["mirror"]) >= len(killed_at.get("mirror", []))


# `make test` proves this through tests/faults/test_two_runners.py (a streaming run SIGTERMed after a batch landed exits
# 0, then the next run drains the topic: the mirrors equal the final state and the ledger holds every batch once) and
# tests/e2e/test_operations.py (the bounded stop of a stuck batch); this variant runs in `make soak`.
@pytest.mark.soak
def test_sigterm_finishes_the_batch_and_exits_cleanly(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topic_name: str
) -> None:
    load = workload.generate(20_000, 2_000, seed=5)
    workload.produce(kafka_bootstrap, topic_name, load.events)
    project = make_project(orders_pipeline(topic_name, max_offsets_per_trigger=2_000))
    project.prepare()

    process = project.start("run", str(project.pipeline_file))  # streaming, not --available-now
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ledger_batches(postgres_dsn, "e2e"):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-3000:]
    assert_each_batch_once(postgres_dsn, "e2e", SINKS)

    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_hard_mirror_equals(postgres_dsn, load.expected)


def test_on_decode_error_fail_stops_and_names_the_message(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topic_name: str
) -> None:
    load = workload.generate(200, 50, seed=1, wrapped=True)
    workload.produce(kafka_bootstrap, topic_name, load.events + workload.malformed_events(wrapped=True)[1:2])
    project = make_project(orders_pipeline(topic_name, on_decode_error="fail"))
    project.prepare()
    result = project.cdcsync("run", str(project.pipeline_file), "--available-now", check=False)
    assert result.returncode == 1, result.stderr[-3000:]  # a runtime failure: the data, not the configuration
    assert f"{topic_name}/" in result.stderr and "could not be decoded" in result.stderr
    assert "Traceback" not in result.stderr
    assert ledger_batches(postgres_dsn, "e2e") == {}
