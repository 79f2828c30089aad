"""Real Debezium as the producer: plain SQL on a source table, the Debezium Postgres connector publishes it,
``cdcsync run --available-now`` mirrors it, and the mirror must equal the source table row for row, value for
value. The differential test over every Debezium type, in several connector modes, is
``tests/e2e/test_debezium_types.py``; this file keeps the workload shapes (snapshot races, key changes, TOAST of
text/bytea/jsonb, truncate ordering) on a small table.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from tests.conftest import DebeziumSource
from tests.e2e.conftest import Project

TABLE = "accounts"
COLUMNS = {
    "id": "bigint",
    "name": "text",
    "amount": "numeric(12,2)",
    "updated_at": "timestamptz",
    "active": "boolean",
}
CREATE_TABLE = f"CREATE TABLE public.{TABLE} ({', '.join(f'{n} {t}' for n, t in COLUMNS.items())}, PRIMARY KEY (id))"
NAMES = ["alice", "Bob O'Hara", "", "zoë ✓", 'quote "x"', "line\nbreak", "tab\tsep", "back\\slash", None]


def pipeline(topic: str) -> dict[str, Any]:
    return {
        "name": "dbz",
        "sources": {
            TABLE: {"type": "kafka", "topic": topic, "format": "json", "primary_key": "id", "columns": dict(COLUMNS)},
        },
        "sinks": {
            "mirror": {"type": "postgres", "from": TABLE, "schema": "app", "table": TABLE, "delete_mode": "hard"},
        },
    }


class Workload:
    """Random inserts, updates (some to NULL, some of the primary key) and deletes, in transactions of 1-5
    statements, against the live table. Seeded, so a failure reproduces."""

    def __init__(self, dsn: str, seed: int) -> None:
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.next_id = 1
        self.keys: set[int] = set()
        with psycopg.connect(dsn) as conn:
            self.keys = {row[0] for row in conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(TABLE)))}
        self.next_id = max(self.keys, default=0) + 1

    def values(self) -> tuple[Any, ...]:
        rng = self.rng
        amount = None if rng.random() < 0.15 else Decimal(rng.randint(-99_999_999, 99_999_999)) / 100
        base = datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=rng.randint(0, 3 * 365 * 86400))
        offset = timezone(timedelta(minutes=rng.choice([-480, -90, 0, 60, 330, 765])))
        stamp = (
            None if rng.random() < 0.15 else (base + timedelta(microseconds=rng.randint(0, 999_999))).astimezone(offset)
        )
        active = None if rng.random() < 0.15 else rng.random() < 0.5
        return rng.choice(NAMES), amount, stamp, active

    def insert(self, conn: psycopg.Connection[Any]) -> None:
        key = self.next_id
        self.next_id += 1
        conn.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, %s, %s, %s)", (key, *self.values()))
        self.keys.add(key)

    def update(self, conn: psycopg.Connection[Any]) -> None:
        key = self.rng.choice(sorted(self.keys))
        column = self.rng.choice(["name", "amount", "updated_at", "active", "all"])
        name, amount, stamp, active = self.values()
        if column == "all":
            conn.execute(
                f"UPDATE {TABLE} SET name = %s, amount = %s, updated_at = %s, active = %s WHERE id = %s",
                (name, amount, stamp, active, key),
            )
        else:
            value = {"name": name, "amount": amount, "updated_at": stamp, "active": active}[column]
            conn.execute(
                sql.SQL("UPDATE {} SET {} = %s WHERE id = %s").format(sql.Identifier(TABLE), sql.Identifier(column)),
                (value, key),
            )

    def change_key(self, conn: psycopg.Connection[Any]) -> None:
        """Debezium publishes this as a delete of the old key, its tombstone and a create of the new one."""
        old, new = self.rng.choice(sorted(self.keys)), self.next_id
        self.next_id += 1
        conn.execute(f"UPDATE {TABLE} SET id = %s, amount = coalesce(amount, 0) + 1 WHERE id = %s", (new, old))
        self.keys.discard(old)
        self.keys.add(new)

    def delete(self, conn: psycopg.Connection[Any]) -> None:
        key = self.rng.choice(sorted(self.keys))
        conn.execute(f"DELETE FROM {TABLE} WHERE id = %s", (key,))
        self.keys.discard(key)

    def run(self, transactions: int) -> None:
        with psycopg.connect(self.dsn) as conn:
            for _ in range(transactions):
                with conn.transaction():
                    for _ in range(self.rng.randint(1, 5)):
                        roll = self.rng.random()
                        if not self.keys or roll < 0.35:
                            self.insert(conn)
                        elif roll < 0.7:
                            self.update(conn)
                        elif roll < 0.8:
                            self.change_key(conn)
                        else:
                            self.delete(conn)


def table_rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT {} FROM {} ORDER BY id").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in COLUMNS), sql.Identifier(schema, TABLE)
    )
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def assert_mirror_equals_source(source_dsn: str, target_dsn: str) -> None:
    source, mirror = table_rows(source_dsn, "public"), table_rows(target_dsn, "app")
    source_keys, mirror_keys = {row[0] for row in source}, {row[0] for row in mirror}
    assert source_keys == mirror_keys, (
        f"keys missing from the mirror: {sorted(source_keys - mirror_keys)[:10]}, "
        f"extra in the mirror: {sorted(mirror_keys - source_keys)[:10]}"
    )
    differ = [(s, m) for s, m in zip(source, mirror, strict=True) if s != m]
    assert not differ, f"{len(differ)} rows differ, e.g. source {differ[0][0]} != mirror {differ[0][1]}"


def test_debezium_changes_mirror_the_source(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, debezium_source: DebeziumSource
) -> None:
    source = debezium_source
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute(CREATE_TABLE)
    workload = Workload(source.dsn, seed=7)
    workload.run(10)  # already there when the connector starts: published as snapshot reads
    source.capture(f"public.{TABLE}")
    workload.run(120)
    with psycopg.connect(source.dsn, autocommit=True) as conn:  # the edge cases, for certain
        conn.execute(
            f"UPDATE {TABLE} SET name = NULL, amount = NULL, updated_at = NULL, active = NULL WHERE id = %s",
            (min(workload.keys),),
        )
        conn.execute(f"UPDATE {TABLE} SET id = -id WHERE id = %s", (max(workload.keys),))
    source.wait_caught_up()

    project = make_project(pipeline(source.topic(f"public.{TABLE}")))
    project.prepare()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_mirror_equals_source(source.dsn, postgres_dsn)
    assert len(table_rows(postgres_dsn, "app")) > 20

    # More changes, a second run from the checkpoint: still equal.
    workload = Workload(source.dsn, seed=8)
    workload.run(80)
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE} ORDER BY id LIMIT 3)")
        conn.execute(f"UPDATE {TABLE} SET id = id + 1000000 WHERE id < 0")
    source.wait_caught_up()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_mirror_equals_source(source.dsn, postgres_dsn)


DOCS_COLUMNS = {"id": "bigint", "title": "text", "body": "text", "blob": "bytea", "meta": "jsonb"}


def _docs_rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT {} FROM {} ORDER BY id").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in DOCS_COLUMNS), sql.Identifier(schema, "docs")
    )
    with psycopg.connect(dsn) as conn:
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in conn.execute(query)]


def test_first_change_after_the_snapshot_toasted_values_and_truncates_follow_the_source(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, debezium_source: DebeziumSource
) -> None:
    """Two tables of one source database, a connector each, one pipeline (two runs for three claims, to keep ``make
    test`` lean).

    Debezium stamps snapshot reads with the snapshot's LSN, which the next streamed change may share: the streamed
    change must win (snapshot versions rank below streamed ones). An update that leaves a large (TOASTed) text,
    bytea or jsonb value alone arrives with Debezium's placeholder instead of the value: the mirror must keep what
    it has. A TRUNCATE empties the mirror in order with the changes around it."""
    source, rng = debezium_source, random.Random(5)

    def big() -> tuple[str, bytes, str]:  # incompressible enough to be stored out of line
        return rng.randbytes(6000).hex(), rng.randbytes(9000), '{"payload": "' + rng.randbytes(6000).hex() + '"}'

    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute(CREATE_TABLE)
        conn.execute(f"INSERT INTO {TABLE} (id, name) SELECT g, 'before' FROM generate_series(1, 5) g")
        conn.execute("CREATE TABLE public.docs (id bigint PRIMARY KEY, title text, body text, blob bytea, meta jsonb)")
        for key in range(1, 7):
            conn.execute("INSERT INTO docs VALUES (%s, %s, %s, %s, %s)", (key, f"v1-{key}", *big()))
    # The slot exists once the task runs; the snapshot runs on in the background. A delete right now is the first
    # WAL record after the snapshot point, unless something else in the cluster wrote WAL first.
    source.capture(f"public.{TABLE}", wait_snapshot=False)
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {TABLE} WHERE id = 1")
    # Debezium skips truncates by default
    source.capture("public.docs", overrides={"skipped.operations": "none"}, connector="docs")
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute("UPDATE docs SET title = 'v2-' || id")  # body, blob and meta arrive as the placeholder
        conn.execute("UPDATE docs SET body = %s WHERE id = 2", (big()[0],))
        with conn.transaction():  # a value set, then left alone, in one micro-batch
            conn.execute("UPDATE docs SET meta = %s WHERE id = 3", (big()[2],))
            conn.execute("UPDATE docs SET title = 'v3' WHERE id = 3")
        conn.execute("INSERT INTO docs VALUES (7, 'new', %s, %s, %s)", big())
    source.wait_caught_up()

    spec = pipeline(source.topic(f"public.{TABLE}"))
    spec["sources"]["docs"] = {"type": "kafka", "topic": source.topic("public.docs", "docs"), "columns": DOCS_COLUMNS}
    spec["sinks"]["docs"] = {"type": "postgres", "from": "docs", "schema": "app", "table": "docs", "primary_key": "id"}
    project = make_project(spec)
    project.prepare()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_mirror_equals_source(source.dsn, postgres_dsn)
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM app.docs WHERE body LIKE '%unavailable%'").fetchone() == (0,)
    assert _docs_rows(postgres_dsn, "app") == _docs_rows(source.dsn, "public")

    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute("UPDATE docs SET title = 'before truncate' WHERE id = 1")
        conn.execute("TRUNCATE docs")
        conn.execute("INSERT INTO docs VALUES (8, 'after truncate', %s, %s, %s)", big())
        conn.execute("UPDATE docs SET title = 'after, changed' WHERE id = 8")
    source.wait_caught_up()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert [row[:2] for row in _docs_rows(postgres_dsn, "app")] == [(8, "after, changed")]
    assert _docs_rows(postgres_dsn, "app") == _docs_rows(source.dsn, "public")
    assert_mirror_equals_source(source.dsn, postgres_dsn)
