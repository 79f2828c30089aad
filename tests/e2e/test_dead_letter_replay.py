"""``cdcsync dead-letters replay`` end to end: a wrong configuration dead-letters changes, the user fixes it, the
replay lands them, and the mirrors equal the source; a replay killed half-way and run again applies each dead
letter to each sink once.

The wrong configuration is a real one: ``time_precision_mode: connect`` for a connector that writes ``time(6)``
in microseconds (Debezium's default, ``adaptive``), JSON without schemas. Every change whose ``at`` is set is
then out of range and dead-lettered; the changes with ``at`` NULL land, some of them newer than a dead letter of
the same key. The replay must apply the dead letters by version: the newer changes already landed must win.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import yaml

from cdcsync.devstack import workload
from tests.e2e.conftest import Project, mirror_rows

COLUMNS = ["id", "note", "at"]


def _changes(seed: int, keys: int, count: int) -> tuple[list[workload.ChangeEvent], dict[int, dict[str, Any]]]:
    """Debezium-shaped JSON changes without schemas (with a tombstone after each delete); the source's end state."""
    rng = random.Random(seed)
    state: dict[int, dict[str, Any]] = {}
    events = []
    for n in range(count):
        key = rng.randint(1, keys)
        micros = rng.choice([None, rng.randrange(120_000_000, 86_400_000_000)])
        row = {"id": key, "note": f"n{n}", "at": micros}
        if key not in state:
            op, before, after = "c", None, row
        elif rng.random() < 0.25:
            op, before, after = "d", {"id": key, "note": None, "at": None}, None
        else:
            op, before, after = "u", None, row
        lsn = 1_000 + 10 * n
        value = {"op": op, "before": before, "after": after, "source": {"lsn": lsn, "ts_ms": 1_700_000_000_000 + n}}
        message_key = json.dumps({"id": key}).encode()
        events.append(workload.ChangeEvent(message_key, json.dumps(value).encode(), key, op, lsn))
        if op == "d":
            events.append(workload.ChangeEvent(message_key, None, key, None, lsn))
            del state[key]
        else:
            at = None if micros is None else _time(micros)
            state[key] = {"id": key, "note": row["note"], "at": at}
    return events, state


def _time(micros: int) -> dt.time:
    seconds, micro = divmod(micros, 1_000_000)
    return dt.time(seconds // 3600, seconds // 60 % 60, seconds % 60, micro)


def _pipeline(topic: str, time_precision_mode: str) -> dict[str, Any]:
    return {
        "name": "replay",
        "sources": {
            "events": {
                "type": "kafka",
                "topic": topic,
                "primary_key": "id",
                "columns": {"id": "bigint", "note": "text", "at": "time"},
                "on_decode_error": "dlq",
                "time_precision_mode": time_precision_mode,
            }
        },
        "sinks": {
            "mirror": {"type": "postgres", "from": "events", "schema": "app", "table": "events"},
            "audit": {"type": "postgres", "from": "events", "schema": "app", "table": "audit", "delete_mode": "soft"},
        },
    }


def _dead_letters(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            'SELECT "offset", reason FROM cdcsync.dead_letters WHERE pipeline = %s ORDER BY "offset"', ("replay",)
        ).fetchall()
    return [(row[0], row[1]) for row in rows]


def _replay_ledger(dsn: str) -> dict[str, int]:
    """Ledger rows of replays, per sink."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT sink, count(*) FROM cdcsync.batch_ledger WHERE checkpoint_id LIKE 'dead-letters/%' GROUP BY sink"
        ).fetchall()
    return {sink: int(count) for sink, count in rows}


def test_replay_after_the_configuration_is_fixed_makes_the_mirrors_equal_the_source(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topic_name: str
) -> None:
    events, expected = _changes(seed=7, keys=60, count=600)
    malformed = workload.ChangeEvent(b'{"id": 999999}', b"not json at all", 999_999, "malformed")
    workload.produce(kafka_bootstrap, topic_name, [*events[:300], malformed, *events[300:]])
    project = make_project(_pipeline(topic_name, "connect"))  # the connector writes time(6) in microseconds
    project.prepare()

    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    dead = _dead_letters(postgres_dsn)
    assert len(dead) > 50, "the wrong time_precision_mode dead-letters every change with a time"
    assert mirror_rows(postgres_dsn, "app", "events", COLUMNS) != expected  # forked from the source
    listed = project.cdcsync("dead-letters", "list", str(project.pipeline_file)).stdout
    assert f"{len(dead)} dead letter(s)" in listed and f"{topic_name}/" in listed

    project.pipeline_file.write_text(yaml.safe_dump(_pipeline(topic_name, "adaptive"), sort_keys=False))
    # The first replay is SIGKILLed once a sink has merged (mid-replay, or just after); the second finishes it.
    killed = project.start("dead-letters", "replay", str(project.pipeline_file))
    deadline = time.monotonic() + 300
    while killed.poll() is None and not _replay_ledger(postgres_dsn) and time.monotonic() < deadline:
        time.sleep(0.1)
    if killed.poll() is None:
        os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert _replay_ledger(postgres_dsn), "the first replay merged nothing before it was killed"
    replayed = project.cdcsync("dead-letters", "replay", str(project.pipeline_file)).stdout
    assert "1 still failing" in replayed, replayed

    assert mirror_rows(postgres_dsn, "app", "events", COLUMNS) == expected
    audit = mirror_rows(postgres_dsn, "app", "audit", [*COLUMNS, "_cdc_deleted"])
    assert {k: {c: r[c] for c in COLUMNS} for k, r in audit.items() if not r["_cdc_deleted"]} == expected
    (left,) = _dead_letters(postgres_dsn)  # the message no configuration decodes stays, with its reason
    assert "not JSON" in left[1], left
    assert _replay_ledger(postgres_dsn) == {"mirror": 1, "audit": 1}  # each sink merged the dead letters once

    again = project.cdcsync("dead-letters", "replay", str(project.pipeline_file)).stdout
    assert "source events: 0 dead letter(s) applied and removed, 1 still failing" in again
