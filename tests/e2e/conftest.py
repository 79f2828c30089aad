"""End-to-end helpers: run the real ``cdcsync`` command against the session's Kafka and Postgres."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdcsync.core import names
from cdcsync.devstack.workload import ORDERS_COLUMNS
from tests.conftest import run_env

RUN_TIMEOUT_S = 600


@dataclass
class Project:
    """A pipeline in a temporary directory, wired to the test's own database, topic and state dir.

    Like a deployment, it is set up by the owner (``init``/``migrate`` as the test's superuser, the DBA) and run by
    a login in the writer role: after :meth:`prepare`, every other command connects as ``E2E_WRITER_LOGIN``, so a
    run that needs more than the writer's grants fails the test.
    """

    root: Path
    pipeline_file: Path
    env: dict[str, str]
    owner_dsn: str = ""

    def _env_for(self, command: str) -> dict[str, str]:
        if command in OWNER_COMMANDS and self.owner_dsn:
            return {**self.env, "CDCSYNC__POSTGRES__DSN": self.owner_dsn}
        return self.env

    def cdcsync(
        self, *args: str, timeout: float = RUN_TIMEOUT_S, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "cdcsync", *args],
            cwd=self.root,
            env=self._env_for(args[0]),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"cdcsync {' '.join(args)} exited {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
            )
        return result

    def start(self, *args: str) -> subprocess.Popen[str]:
        """Start ``cdcsync`` in a session of its own, so the test can kill it and its JVM together."""
        return subprocess.Popen(
            [sys.executable, "-m", "cdcsync", *args],
            cwd=self.root,
            env=self._env_for(args[0]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def prepare(self, *, as_writer: bool = True) -> None:
        """Render and apply the migrations as the owner, as a user would; then run as the writer unless told not to
        (``schema_evolution: auto`` applies migrations from ``run``, which needs the owner)."""
        self.cdcsync("init", str(self.pipeline_file))
        self.cdcsync("migrate", str(self.pipeline_file))
        self.owner_dsn = self.owner_dsn or self.env["CDCSYNC__POSTGRES__DSN"]
        self.env["CDCSYNC__POSTGRES__DSN"] = writer_dsn(self.owner_dsn) if as_writer else self.owner_dsn


OWNER_COMMANDS = frozenset({"init", "migrate"})
"""What a DBA runs; everything else (``run``, ``status``, ``rewind``, ``reset``, ``dead-letters``) runs as the writer."""

E2E_WRITER_LOGIN = "cdcsync_e2e_writer"
E2E_WRITER_PASSWORD = "cdcsync-e2e-writer"  # a test server's login, for servers that check passwords (containers)


def writer_dsn(owner_dsn: str) -> str:
    """The DSN of a login in the migrations' writer role (created once per server, roles being cluster-wide; two
    xdist workers may race to create it, so either error of the loser is taken as "it exists")."""
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "DO $$ BEGIN CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {};"
                " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            ).format(
                sql.Identifier(E2E_WRITER_LOGIN), sql.Literal(E2E_WRITER_PASSWORD), sql.Identifier(names.WRITER_ROLE)
            )
        )
    return make_conninfo(owner_dsn, user=E2E_WRITER_LOGIN, password=E2E_WRITER_PASSWORD)


def orders_pipeline(topic: str, *, max_offsets_per_trigger: int | None = None, **source_extra: Any) -> dict[str, Any]:
    source: dict[str, Any] = {
        "type": "kafka",
        "topic": topic,
        "primary_key": "id",
        "columns": dict(ORDERS_COLUMNS),
        **source_extra,
    }
    if max_offsets_per_trigger:
        source["max_offsets_per_trigger"] = max_offsets_per_trigger
    return {
        "name": "e2e",
        "sources": {"orders": source},
        "sinks": {
            "mirror": {
                "type": "postgres",
                "from": "orders",
                "schema": "app",
                "table": "Orders Mirror",
                "delete_mode": "hard",
            },
            "audit": {"type": "postgres", "from": "orders", "schema": "app", "table": "order", "delete_mode": "soft"},
        },
    }


@pytest.fixture()
def make_project(tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str) -> Callable[[dict[str, Any]], Project]:
    def make(pipeline: dict[str, Any]) -> Project:
        pipeline_file = tmp_path / "pipeline.yaml"
        pipeline_file.write_text(yaml.safe_dump(pipeline, sort_keys=False))
        env = run_env(
            postgres__dsn=postgres_dsn,
            kafka__bootstrap_servers=kafka_bootstrap,
            state_dir=tmp_path / "state",
            migrations_dir=tmp_path / "migrations",
        )
        return Project(tmp_path, pipeline_file, env)

    return make


def mirror_rows(dsn: str, schema: str, table: str, columns: list[str]) -> dict[int, dict[str, Any]]:
    import psycopg
    from psycopg import sql

    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(schema, table)
    )
    with psycopg.connect(dsn) as conn:
        return {row[0]: dict(zip(columns, row, strict=True)) for row in conn.execute(query)}


def ledger_batches(dsn: str, pipeline: str) -> dict[str, list[int]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT sink, batch_id FROM cdcsync.batch_ledger WHERE pipeline = %s ORDER BY sink, batch_id", (pipeline,)
        ).fetchall()
    batches: dict[str, list[int]] = {}
    for sink, batch_id in rows:
        batches.setdefault(sink, []).append(batch_id)
    return batches


def assert_each_batch_once(dsn: str, pipeline: str, sinks: Iterable[str]) -> dict[str, list[int]]:
    """The batch ledger holds batches 0..n-1 of every sink, each once: nothing replayed twice, nothing skipped."""
    batches = ledger_batches(dsn, pipeline)
    assert set(batches) == set(sinks)
    for sink, ids in batches.items():
        assert ids == list(range(len(ids))), f"sink {sink}: ledger batch ids {ids} are not 0..n-1, each once"
    return batches


def sigkill_mid_stream(
    project: Project,
    dsn: str,
    pipeline: str,
    *,
    after_batches: int,
    sink: str | None = None,
    timeout_s: float = 300.0,
) -> dict[str, list[int]]:
    """Start ``cdcsync run --available-now`` (the real CLI), let the ledger reach ``after_batches`` batches (of
    ``sink``; of all sinks together when None), wait a random moment more (so the kill may land anywhere in the next
    batch: decoding, merging, committing), then SIGKILL the CLI and its JVM together. Returns the ledger as the kill
    left it."""
    process = project.start("run", str(project.pipeline_file), "--available-now")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        ledger = ledger_batches(dsn, pipeline)
        if sum(len(ids) for name, ids in ledger.items() if sink in (None, name)) >= after_batches:
            break
        time.sleep(0.2)
    if process.poll() is not None:
        _stdout, stderr = process.communicate()
        raise AssertionError(
            f"the run ended (exit {process.returncode}) before it could be killed; make the workload larger if it "
            f"succeeded:\n{stderr[-4000:]}"
        )
    time.sleep(random.uniform(0.0, 2.0))
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    return ledger_batches(dsn, pipeline)
