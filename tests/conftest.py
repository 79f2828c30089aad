"""Shared fixtures: real services for integration and end-to-end tests, started once per test session.

Where the services come from:

* default: the dev stack (``cdcsync.devstack``: embedded Postgres and a KRaft Kafka broker on the local JVM),
  started in a temporary state directory on ports of its own, so a developer's running ``cdcsync dev up`` is
  never touched;
* ``CDCSYNC_TEST_STACK=containers``: the same services from pinned images through testcontainers (needs Docker);
* ``CDCSYNC_TEST_POSTGRES_DSN`` / ``CDCSYNC_TEST_KAFKA_BOOTSTRAP``: services you already run.

Tests are marked by directory (``unit``, ``integration``, ``e2e``) so ``pytest -m unit`` needs no services.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).parent
POSTGRES_IMAGE = "postgres:16.4-alpine"
KAFKA_IMAGE = "confluentinc/cp-kafka:7.7.1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).relative_to(TESTS_DIR).parts[0]
        if tier in ("unit", "integration", "e2e") and not any(item.iter_markers(name=tier)):
            item.add_marker(getattr(pytest.mark, tier))


@dataclass(frozen=True)
class Services:
    postgres_dsn: str
    """DSN of the server's maintenance database; tests get their own database from ``postgres_dsn``."""
    bootstrap_servers: str


def _dev_stack(tmp_root: Path) -> Iterator[Services]:
    from cdcsync.devstack import DevStackConfig, down, up

    config = DevStackConfig(state_dir=tmp_root, postgres_port=55441, kafka_port=29192, kafka_controller_port=29193)
    up(config)
    try:
        yield Services(
            postgres_dsn=f"postgresql://cdcsync@127.0.0.1:{config.postgres_port}/cdcsync",
            bootstrap_servers=f"127.0.0.1:{config.kafka_port}",
        )
    finally:
        down(config)


def _containers() -> Iterator[Services]:
    from testcontainers.community.kafka import KafkaContainer
    from testcontainers.community.postgres import PostgresContainer

    postgres = PostgresContainer(POSTGRES_IMAGE, username="cdcsync", password="cdcsync", dbname="cdcsync", driver=None)
    postgres.with_command("postgres -c wal_level=logical")
    kafka = KafkaContainer(KAFKA_IMAGE).with_kraft()
    with postgres, kafka:
        yield Services(postgres_dsn=postgres.get_connection_url(), bootstrap_servers=kafka.get_bootstrap_server())


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    given_dsn = os.environ.get("CDCSYNC_TEST_POSTGRES_DSN")
    given_kafka = os.environ.get("CDCSYNC_TEST_KAFKA_BOOTSTRAP")
    if given_dsn and given_kafka:
        yield Services(given_dsn, given_kafka)
    elif os.environ.get("CDCSYNC_TEST_STACK") == "containers":
        yield from _containers()
    else:
        # Not under pytest's basetemp: a second pytest session rotates old basetemps away, and must not delete
        # the data directory of a Postgres this session is still using.
        state_dir = Path(tempfile.mkdtemp(prefix="cdcsync-test-stack-"))
        try:
            yield from _dev_stack(state_dir)
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture()
def postgres_dsn(services: Services) -> Iterator[str]:
    """A fresh, empty database per test, dropped afterwards."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(services.postgres_dsn, dbname=name)
    finally:
        with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture()
def kafka_bootstrap(services: Services) -> str:
    return services.bootstrap_servers


@pytest.fixture()
def topic_name() -> str:
    """A topic name of its own per test, so tests never see each other's messages."""
    return f"test.public.orders_{uuid.uuid4().hex[:10]}"


def run_env(**settings: Any) -> dict[str, str]:
    """Environment for a ``cdcsync`` subprocess: the test's services through ``CDCSYNC__`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCSYNC__")}
    env["COLUMNS"] = "200"  # Rich tables on a pipe: wide enough that no cell wraps
    for key, value in settings.items():
        env[f"CDCSYNC__{key.upper()}"] = str(value)
    return env
