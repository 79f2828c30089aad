"""What the benchmarks share: services to run against, a fresh database, a Spark session, the machine line."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from typing import TYPE_CHECKING, Any

from cdcsync.devstack import DevStackConfig, apicurio, down, up

if TYPE_CHECKING:
    from cdcsync.config.pipeline import Pipeline
    from cdcsync.config.settings import Settings


@dataclass(frozen=True)
class BenchServices:
    admin_dsn: str
    """The server's maintenance database; each benchmark creates databases of its own."""
    bootstrap: str
    clickhouse_url: str = ""
    """ClickHouse HTTP interface (clickhouse-connect DSN); empty when services were given without one."""
    schema_registry_url: str = ""
    """A Confluent-compatible schema registry; empty when services were given without one."""


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--postgres-dsn", help="use this server (maintenance database) instead of a dev stack")
    parser.add_argument("--bootstrap", help="use this Kafka instead of a dev stack")
    parser.add_argument("--clickhouse-url", help="with --postgres-dsn and --bootstrap: this ClickHouse")
    parser.add_argument("--schema-registry-url", help="with --postgres-dsn and --bootstrap: this schema registry")


@contextlib.contextmanager
def bench_services(args: argparse.Namespace, root: Path) -> Iterator[BenchServices]:
    """The services named on the command line, else a dev stack of the benchmark's own (own ports, own state)."""
    if args.postgres_dsn and args.bootstrap:
        yield BenchServices(
            args.postgres_dsn,
            args.bootstrap,
            getattr(args, "clickhouse_url", None) or "",
            getattr(args, "schema_registry_url", None) or "",
        )
        return
    stack = DevStackConfig(
        state_dir=root / "stack",
        postgres_port=55461,
        kafka_port=29392,
        kafka_controller_port=29393,
        clickhouse_port=28391,
        schema_registry_port=28381,
    )
    print("starting a dev stack for the benchmark …", flush=True)
    up(stack)
    try:
        yield BenchServices(
            f"postgresql://cdcsync@127.0.0.1:{stack.postgres_port}/cdcsync",
            f"127.0.0.1:{stack.kafka_port}",
            f"http://default@127.0.0.1:{stack.clickhouse_port}",
            apicurio.url(stack),
        )
    finally:
        down(stack)


def fresh_database(admin_dsn: str, prefix: str) -> str:
    """Create an empty database and return its DSN."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(admin_dsn, dbname=name)


def machine_line() -> str:
    return (
        f"machine: {platform.machine()}, {os.cpu_count() or 0} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def prepare_pipeline(
    pipeline: Pipeline, root: Path, dsn: str, bootstrap: str, schema_registry_url: str | None = None
) -> Settings:
    """Settings for one benchmark pipeline (own state and migrations), with its migrations applied to ``dsn``."""
    import psycopg

    from cdcsync import migrations
    from cdcsync.config.settings import load_settings
    from cdcsync.migrations import POSTGRES

    settings = load_settings(
        postgres__dsn=dsn,
        kafka__bootstrap_servers=bootstrap,
        state_dir=root / pipeline.name / "state",
        migrations_dir=root / pipeline.name / "migrations",
        schema_registry__url=schema_registry_url,
    )
    migrations.init(POSTGRES, pipeline, settings.migrations_dir)
    with psycopg.connect(dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, settings.migrations_dir)
    return settings


def timed_run(pipeline: Pipeline, settings: Settings, spark: Any, source: str = "orders") -> tuple[float, int]:
    """Run the pipeline to catch-up: (seconds from its first micro-batch to catch-up, micro-batches)."""
    from cdcsync.runtime.stream import PipelineRunner

    stats = PipelineRunner(pipeline, settings, available_now=True).run(spark).sources[source]
    assert stats.first_batch_at is not None and stats.last_batch_done_at is not None
    return stats.last_batch_done_at - stats.first_batch_at, stats.batches
