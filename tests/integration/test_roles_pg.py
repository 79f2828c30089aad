"""The role model of the migrations against a real Postgres, without Spark: a login in the writer role lands
batches (COPY into the stage, TRUNCATE, merge, ledger), takes the pipeline's lock and resets the pipeline, and
can neither create, alter nor drop a table; a pipeline written before the role model is upgraded to it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg.conninfo import make_conninfo

from cdcsync import migrations
from cdcsync.config.settings import Settings
from cdcsync.core import names
from cdcsync.core.errors import PipelineLocked
from cdcsync.migrations import POSTGRES
from cdcsync.runtime.lock import PipelineLock
from cdcsync.runtime.reset import plan_reset, reset
from cdcsync.sinks.postgres import PostgresUpsertSink
from tests.integration.test_postgres_sink import SCHEMA, change, pipeline


def _migrate(dsn: str, migrations_dir: Path) -> list[str]:
    definition = pipeline("hard")
    written = migrations.init(POSTGRES, definition, migrations_dir)
    with psycopg.connect(dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, definition.name, migrations_dir)
    return [path.name for path in written]


@pytest.fixture()
def login_in(postgres_dsn: str) -> Iterator[Callable[[str], str]]:
    """Makes a login role in a group role (after the migrations created it); returns a DSN for it."""
    made: list[str] = []

    def make(group: str) -> str:
        name = f"cdcsync_test_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE ROLE "{name}" LOGIN PASSWORD \'not-used-with-trust\' IN ROLE "{group}"')
        made.append(name)
        return make_conninfo(postgres_dsn, user=name)

    yield make
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for name in made:
            conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def _land(sink: PostgresUpsertSink, batch_id: int, rows: list[dict[str, Any]]) -> int | None:
    key = sink.ledger_key(batch_id, "cp")
    assert sink.prepare(key)
    staged = sink.stage_writer(batch_id).stage(pa.Table.from_pylist(rows, schema=SCHEMA))
    return sink.merge(key, staged)


def _refused(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


def test_the_writer_lands_batches_resets_and_cannot_create_or_drop_tables(
    postgres_dsn: str, tmp_path: Path, login_in: Callable[[str], str]
) -> None:
    assert _migrate(postgres_dsn, tmp_path) == ["0001_init.sql"]
    writer = login_in(names.WRITER_ROLE)
    definition = pipeline("hard")
    sink = PostgresUpsertSink(definition, "m", definition.sinks["m"], writer)

    assert _land(sink, 0, [change("c", 1, 10, "a"), change("c", 2, 11, "b")]) == 2
    assert _land(sink, 1, [change("u", 1, 12, "c"), change("d", 2, 13)]) == 2  # the stage is truncated between
    with psycopg.connect(writer) as conn:
        assert conn.execute('SELECT id, "Name" FROM "My App"."select"').fetchall() == [(1, "c")]
        assert not conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
        owners = conn.execute(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname IN ('My App', 'cdcsync')"
        ).fetchall()
    assert owners == [(names.OWNER_ROLE,)]

    for statement in (
        'CREATE TABLE "My App"."mine" (i int)',
        'CREATE TABLE "cdcsync"."mine" (i int)',
        'CREATE TABLE "public"."mine" (i int)',
        'CREATE SCHEMA "mine"',
        'DROP TABLE "My App"."select"',
        'DROP TABLE "cdcsync"."batch_ledger"',
        'ALTER TABLE "My App"."select" ADD COLUMN "x" int',
        'TRUNCATE "My App"."select"',
        'DELETE FROM "cdcsync"."schema_migrations"',
    ):
        _refused(writer, statement)

    settings = Settings(postgres={"dsn": writer}, state_dir=tmp_path / "state")
    plan = plan_reset(definition, settings)
    with PipelineLock(postgres_dsn, definition.name) as held:
        held.acquire()
        with pytest.raises(PipelineLocked):
            reset(plan, settings)
    checkpoint = settings.checkpoint_dir(definition.name, "s")
    checkpoint.mkdir(parents=True)
    assert reset(plan, settings).ledger_rows_removed == 2  # as the writer, holding the lock itself
    assert not checkpoint.exists()
    with psycopg.connect(writer) as conn:
        assert conn.execute("SELECT count(*) FROM cdcsync.batch_ledger").fetchone() == (0,)


def test_a_pipeline_written_before_the_roles_is_handed_to_them(
    postgres_dsn: str, tmp_path: Path, login_in: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    desired = POSTGRES.desired_state

    def without_roles(definition: Any) -> dict[str, Any]:
        state = desired(definition)
        state.pop("roles")
        return state

    monkeypatch.setattr(POSTGRES, "desired_state", without_roles)
    assert _migrate(postgres_dsn, tmp_path) == ["0001_init.sql"]
    monkeypatch.undo()
    assert "cdcsync_owner" not in (tmp_path / "sinktest/postgres/0001_init.sql").read_text()

    assert _migrate(postgres_dsn, tmp_path) == ["0002_grant_roles.sql"]
    writer = login_in(names.WRITER_ROLE)
    definition = pipeline("hard")
    sink = PostgresUpsertSink(definition, "m", definition.sinks["m"], writer)
    assert _land(sink, 0, [change("c", 1, 10, "a")]) == 1
    _refused(writer, 'DROP TABLE "My App"."select"')
    with psycopg.connect(postgres_dsn) as conn:
        owners = conn.execute("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'My App'").fetchall()
    assert owners == [(names.OWNER_ROLE,)]
    assert _migrate(postgres_dsn, tmp_path) == []  # up to date
