"""Commit order with real Debezium: a DEFERRABLE primary key lets a transaction that began first re-insert a key
that a later-beginning transaction deletes, so the re-insert has the lower LSN but the later commit; and an ad-hoc
incremental snapshot through the signal table must repair a mirror gone stale, after a truncate. One CLI run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from tests.conftest import DebeziumSource
from tests.e2e.conftest import Project

COLUMNS = {"id": "bigint", "name": "text"}
SIGNALS = "public.dbz_signal"


def rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT id, name FROM {schema}.items ORDER BY id").fetchall()


def mirror_version(dsn: str, key: int) -> int:
    with psycopg.connect(dsn) as conn:
        found = conn.execute('SELECT "_cdc_version" FROM app.items WHERE id = %s', (key,)).fetchone()
    assert found is not None
    return int(found[0])


def test_commit_order_and_an_adhoc_snapshot_repair_the_mirror(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, debezium_source: DebeziumSource
) -> None:
    source = debezium_source
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.items (id bigint, name text, PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED)")
        conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")  # a deferrable key cannot identify the row
        conn.execute(f"CREATE TABLE {SIGNALS} (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data text)")
        conn.execute("INSERT INTO items SELECT g, 'snapshot' FROM generate_series(1, 5) g")
    source.capture("public.items", SIGNALS, overrides={"signal.data.collection": SIGNALS})
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE items")  # a truncate watermark in the mirror, below everything that follows
        conn.execute("INSERT INTO items SELECT g, 'streamed' FROM generate_series(1, 6) g")
    with psycopg.connect(source.dsn) as first, psycopg.connect(source.dsn, autocommit=True) as second:
        first.execute("INSERT INTO items VALUES (1, 're-inserted')")  # allowed until commit: the key is deferred
        second.execute("DELETE FROM items WHERE id = 1")  # a higher LSN, committed first
        first.commit()  # the re-insert commits last: id 1 exists
    source.wait_caught_up()

    project = make_project(
        {
            "name": "order",
            "sources": {"items": {"type": "kafka", "topic": source.topic("public.items"), "columns": COLUMNS}},
            "sinks": {"mirror": {"type": "postgres", "from": "items", "schema": "app", "table": "items"}},
        }
    )
    project.prepare()
    # A mirror gone stale (by hand, say): a wrong value and a wrongly deleted key, each at a version above every
    # change Debezium has streamed so far (their commit positions are below the WAL's current end).
    with psycopg.connect(source.dsn) as conn:
        wal_end = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert wal_end is not None
    stale_version = int(wal_end[0]) << 64
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute("INSERT INTO app.items VALUES (2, 'stale', %s, now())", (stale_version,))
        conn.execute("INSERT INTO cdcsync.order__mirror__tombstones VALUES (3, %s)", (stale_version,))
    # The repair: an ad-hoc incremental snapshot through Debezium's signal table.
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {SIGNALS} VALUES ('adhoc-1', 'execute-snapshot', %s)",
            # Not key 1: the snapshot would repair it too, and hide a wrong order of the interleaved transactions.
            (
                '{"data-collections": ["public.items"], "type": "incremental", '
                '"additional-conditions": [{"data-collection": "public.items", "filter": "id > 1"}]}',
            ),
        )
        deadline = time.monotonic() + 90
        while not conn.execute(f"SELECT 1 FROM {SIGNALS} WHERE type = 'snapshot-window-close'").fetchone():
            assert time.monotonic() < deadline, "Debezium did not run the incremental snapshot"
            time.sleep(0.5)
    source.wait_caught_up()  # the chunk is emitted when its close-window row streams by

    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert rows(postgres_dsn, "app") == rows(source.dsn, "public")
    assert (1, "re-inserted") in rows(postgres_dsn, "app")
    assert mirror_version(postgres_dsn, 2) > stale_version
