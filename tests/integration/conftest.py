"""Fixtures for tests against a real Postgres.

Temporary: reads the server from ``CDCSYNC_TEST_POSTGRES_DSN`` (any database the role may CREATE DATABASE from)
and skips when it is unset. The session-wide service start will move into the top-level ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

DSN_ENV = "CDCSYNC_TEST_POSTGRES_DSN"


@pytest.fixture
def postgres_dsn() -> Iterator[str]:
    """DSN of a fresh, empty database ``t_<random>``, dropped after the test."""
    server_dsn = os.environ.get(DSN_ENV)
    if not server_dsn:
        pytest.skip(f"set {DSN_ENV} to run tests against Postgres")
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
