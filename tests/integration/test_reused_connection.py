"""Connections kept for the next micro-batch (:func:`cdcsync.db.postgres.reused_connection`), against a real
Postgres: reused while they answer, replaced (unseen by the caller) when the server ended them, never kept after
the caller failed."""

from __future__ import annotations

import psycopg
import pytest

from cdcsync.db.postgres import reused_connection

pytestmark = pytest.mark.integration


def _backend(dsn: str) -> int:
    with reused_connection(dsn) as conn:
        return conn.info.backend_pid


def test_the_next_caller_gets_the_same_session(postgres_dsn: str) -> None:
    first = _backend(postgres_dsn)
    assert _backend(postgres_dsn) == first
    with reused_connection(postgres_dsn) as conn, reused_connection(postgres_dsn) as other:
        assert conn.info.backend_pid != other.info.backend_pid  # two at once: two sessions
    with reused_connection(postgres_dsn) as conn, conn.transaction():
        conn.execute("CREATE TEMP TABLE t ON COMMIT DROP AS SELECT 1 AS x")
    with reused_connection(postgres_dsn) as conn, conn.transaction():  # what a batch leaves is gone
        conn.execute("CREATE TEMP TABLE t ON COMMIT DROP AS SELECT 1 AS x")


def test_a_session_the_server_ended_is_replaced_before_the_caller_sees_it(postgres_dsn: str) -> None:
    ended = _backend(postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (ended,)).fetchone() == (True,)
    with reused_connection(postgres_dsn) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        assert conn.info.backend_pid != ended


def test_a_session_whose_caller_failed_is_not_kept(postgres_dsn: str) -> None:
    with pytest.raises(psycopg.errors.UndefinedTable), reused_connection(postgres_dsn) as conn:
        failed = conn.info.backend_pid
        conn.execute("SELECT * FROM no_such_table")
    assert conn.closed
    assert _backend(postgres_dsn) != failed
