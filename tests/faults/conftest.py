"""Fault injection: the real ``cdcsync`` command while something around it fails.

Two kinds of services:

* the session's shared ones (``tests/conftest.py``), for faults that touch only cdcsync itself (its process
  killed, its checkpoint directory full) and for the services a test does not fault;
* :class:`FaultStack`: private instances, started on first use on ports of their own (3xxxx) in a temporary
  directory, for the services a test kills or stops. Faulting the shared ones would break every other test of the
  session and of anyone sharing the machine.

The figures each fault test records (:mod:`tests.faults.harness`) are printed as one table at the end of the
session: ``make faults`` shows it, ``docs/operations.md`` keeps it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdcsync.devstack.common import DevStackConfig
from cdcsync.devstack.service import Service
from tests.conftest import FIGURES_PROPERTY, ClickHouseDatabase
from tests.e2e.conftest import Project, make_project
from tests.faults.harness import FIGURES, FaultWorkload, prepare_workload

__all__ = ["make_project"]

FAULT_PORTS = {
    "postgres_port": 26541,
    "kafka_port": 26592,
    "kafka_controller_port": 26593,
    "clickhouse_port": 26523,
    "schema_registry_port": 26581,
}
"""Ports of the private services: used by nobody else on the machine (the shared stack is on 1xxxx/5xxxx, the
test session's own on 25xxx/28xxx/29xxx). Below the kernel's ephemeral range (32768-60999 by default): a port in it
may be the local end of any outgoing connection when the service (re)starts, and a broker restarted on 35592 once
failed in CI with "Address already in use"."""


class FaultStack:
    """Private dev-stack services that tests may kill, stop and start again."""

    def __init__(self, root: Path) -> None:
        self.config = DevStackConfig(state_dir=root, startup_timeout_s=180.0, **FAULT_PORTS)
        self._services: dict[str, Service] = {}

    def service(self, name: str) -> Service:
        """The service, started and ready (started on first use only)."""
        from cdcsync.devstack import stack

        if name not in self._services:
            (kind,) = [kind for kind in stack.SERVICES if kind(self.config).name == name]
            self._services[name] = kind(self.config)
        service = self._services[name]
        service.start()
        service.wait_ready()
        return service

    def kill(self, name: str) -> float:
        """SIGKILL the service's process group (a crash: no shutdown of any kind); returns when it is gone."""
        service = self._services[name]
        pid = service.pid()
        assert pid is not None, f"{name} is not running"
        os.killpg(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while service.pid() is not None:
            time.sleep(0.05)
        return killed_at

    def stop(self, name: str) -> None:
        self._services[name].stop()

    def restart(self, name: str) -> float:
        """Start the service again and wait until it answers; returns when it did."""
        service = self._services[name]
        service.start()
        service.wait_ready()
        return time.monotonic()

    def close(self) -> None:
        for service in reversed(list(self._services.values())):
            service.stop()


@pytest.fixture(scope="session")
def fault_stack() -> Iterator[FaultStack]:
    root = Path(tempfile.mkdtemp(prefix="cdcsync-fault-stack-"))
    stack = FaultStack(root)
    try:
        yield stack
    finally:
        stack.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def private_postgres_dsn(fault_stack: FaultStack) -> Iterator[str]:
    """A fresh database on the private Postgres (which the test may crash), dropped afterwards."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    admin = fault_stack.service("postgres").address
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(admin, dbname=name)
    finally:
        fault_stack.restart("postgres")  # a test that failed midway may have left it stopped
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture()
def fault_workload(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    clickhouse_database: ClickHouseDatabase,
    topic_name: str,
) -> Callable[..., FaultWorkload]:
    """Makes the seeded workload on the test's services (a module overrides ``postgres_dsn``, ``kafka_bootstrap``
    or ``clickhouse_database`` to put the one it faults on the private stack)."""

    def make(
        *,
        changes: int,
        seed: int,
        max_offsets: int,
        keys: int | None = None,
        clickhouse_sink: bool = True,
        transform: bool = False,
    ) -> FaultWorkload:
        return prepare_workload(
            make_project,
            postgres_dsn,
            kafka_bootstrap,
            clickhouse_database,
            topic_name,
            changes=changes,
            keys=keys or max(changes // 8, 500),
            seed=seed,
            max_offsets=max_offsets,
            clickhouse_sink=clickhouse_sink,
            transform=transform,
        )

    return make


@pytest.fixture(autouse=True)
def _report_figures(request: pytest.FixtureRequest) -> Iterator[None]:
    """The rows this test recorded travel with its teardown report: under xdist they are recorded in a worker, and
    the figures table is printed by the controller."""
    before = len(FIGURES)
    yield
    for row in FIGURES[before:]:
        request.node.user_properties.append((FIGURES_PROPERTY, dataclasses.asdict(row)))
