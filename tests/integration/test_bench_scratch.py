"""``benchmarks.common.Scratch`` against the real broker and Postgres: what a benchmark makes on the services it
runs against (its topics, its databases) is gone after it, also when the benchmark fails."""

from __future__ import annotations

import time

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg.conninfo import conninfo_to_dict

from benchmarks.common import BenchServices, Scratch
from cdcsync.devstack import workload
from tests.conftest import Services

pytestmark = pytest.mark.integration


def _databases(admin_dsn: str) -> set[str]:
    with psycopg.connect(admin_dsn) as conn:
        return {name for (name,) in conn.execute("SELECT datname FROM pg_database")}


def _topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def test_a_benchmarks_topics_and_databases_are_removed_on_its_way_out(services: Services) -> None:
    admin_dsn, bootstrap = services.postgres_dsn, services.bootstrap_servers
    made: list[tuple[str, str]] = []
    with (
        pytest.raises(RuntimeError, match="the benchmark failed"),
        Scratch(BenchServices(admin_dsn, bootstrap)) as scratch,
    ):
        topic = scratch.topic("bench.public.scratch_test")
        workload.produce(bootstrap, topic, workload.generate(10, 5, seed=3).events, partitions=1)
        dsn = scratch.database("scratch_test")
        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE TABLE t AS SELECT 1 AS one")
        made.append((topic, str(conninfo_to_dict(dsn)["dbname"])))
        assert topic in _topics(bootstrap)
        assert made[0][1] in _databases(admin_dsn)
        raise RuntimeError("the benchmark failed")
    topic, database = made[0]
    assert database not in _databases(admin_dsn)
    deadline = time.monotonic() + 30  # the deletion is done; the broker's metadata may take a moment to say so
    while topic in _topics(bootstrap) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert topic not in _topics(bootstrap)
