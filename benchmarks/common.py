"""What the benchmarks share: services to run against, a fresh database, a Spark session, the machine line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
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


def key_value(text: str) -> tuple[str, str]:
    """An argparse ``type`` for ``KEY=VALUE`` (the value may hold ``=`` itself, as JVM options do)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def add_spark_conf_argument(parser: argparse.ArgumentParser) -> None:
    """``--spark-conf KEY=VALUE`` (repeatable): Spark settings for a benchmark's ``cdcsync`` runs, to compare a
    setting against the defaults back to back; pass ``dict(args.spark_conf)`` to :func:`cli_env`."""
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=key_value,
        help="a Spark setting for the runs (spark.conf, over cdcsync's defaults), e.g. spark.driver.memory=1g "
        "or spark.driver.extraJavaOptions='-XX:+UseSerialGC'; repeatable",
    )


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
        postgres_port=25461,
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
    start, end, batches = timed_window(pipeline, settings, spark, source)
    return end - start, batches


def timed_window(
    pipeline: Pipeline, settings: Settings, spark: Any, source: str = "orders"
) -> tuple[float, float, int]:
    """Run the pipeline to catch-up: (its first micro-batch's start, catch-up, micro-batches), in
    ``time.monotonic()`` seconds, the clock :class:`MachineCpu` samples on."""
    from cdcsync.runtime.stream import PipelineRunner

    stats = PipelineRunner(pipeline, settings, available_now=True).run(spark).sources[source]
    assert stats.first_batch_at is not None and stats.last_batch_done_at is not None
    return stats.first_batch_at, stats.last_batch_done_at, stats.batches


@dataclass(frozen=True)
class CpuSample:
    at: float
    """``time.monotonic()`` seconds."""
    busy: float
    """Core-seconds the machine has spent busy (``/proc/stat``: all but idle and iowait) since boot."""
    idle: float


class MachineCpu:
    """The whole machine's busy and idle core-seconds over a window, from ``/proc/stat`` sampled on a thread.

    Why: where Kafka, Postgres and Spark share the cores, a run's wall time is the CPU it needs spread over the
    cores plus the time it leaves a core idle, such as a merge that runs alone after the last batch is staged.
    Busy and idle core-seconds, and how many cores were busy slice by slice, say which of the two a difference
    between two runs comes from (docs/benchmarks.md, session 23).
    """

    def __init__(self, interval: float = 0.1) -> None:
        import threading

        self.interval = interval
        self.samples: list[CpuSample] = []
        self._ticks = os.sysconf("SC_CLK_TCK")  # /proc/stat's unit, per second
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="machine-cpu", daemon=True)

    def __enter__(self) -> MachineCpu:
        self._sample()  # the first before anything the block runs, the last after (``__exit__``)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        with open("/proc/stat") as stat:
            jiffies = [int(field) for field in stat.readline().split()[1:]]
        idle = jiffies[3] + jiffies[4]  # idle, iowait
        self.samples.append(CpuSample(time.monotonic(), (sum(jiffies) - idle) / self._ticks, idle / self._ticks))

    def window(self, start: float, end: float) -> tuple[float, float]:
        """(busy, idle) core-seconds between ``start`` and ``end``."""
        first, last = self._at(start), self._at(end)
        return last.busy - first.busy, last.idle - first.idle

    def cores_busy(self, start: float, end: float, step: float = 0.5) -> list[float]:
        """How many cores were busy on average in each ``step`` seconds from ``start`` (the last slice may be
        shorter)."""
        edges = [start + i * step for i in range(int((end - start) / step) + 1)]
        if edges[-1] < end - step / 10:
            edges.append(end)
        busy = [self._at(edge).busy for edge in edges]
        return [(b1 - b0) / (t1 - t0) for b0, b1, t0, t1 in zip(busy, busy[1:], edges, edges[1:], strict=False)]

    def _at(self, moment: float) -> CpuSample:
        """The counters at ``moment``, interpolated between the samples around it."""
        samples = self.samples
        if not samples or not samples[0].at <= moment <= samples[-1].at:
            raise ValueError(f"no CPU samples around {moment:.3f} (sampled {len(samples)} times)")
        after = next(i for i, sample in enumerate(samples) if sample.at >= moment)
        if samples[after].at == moment or after == 0:
            return samples[after]
        a, b = samples[after - 1], samples[after]
        share = (moment - a.at) / (b.at - a.at)
        return CpuSample(moment, a.busy + share * (b.busy - a.busy), a.idle + share * (b.idle - a.idle))


# The real command as a subprocess (``cdcsync init|migrate|run``): what latency.py and memory.py time or watch.

MIRROR_SCHEMA, MIRROR_TABLE = "app", "orders"


def cli_env(root: Path, dsn: str, bootstrap: str, spark_conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment with the run's own settings (and none of the caller's ``CDCSYNC__`` ones), ``spark_conf``
    as the run's ``spark.conf`` (one JSON variable, as the tests pass theirs: the keys keep their case)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCSYNC__")}
    env.update(
        CDCSYNC__POSTGRES__DSN=dsn,
        CDCSYNC__KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        CDCSYNC__STATE_DIR=str(root / "state"),
        CDCSYNC__MIGRATIONS_DIR=str(root / "migrations"),
    )
    if spark_conf:
        env["CDCSYNC__SPARK__CONF"] = json.dumps(dict(spark_conf))
    return env


def write_mirror_pipeline(
    root: Path, name: str, topic: str, columns: dict[str, str], source_options: dict[str, Any] | None = None
) -> Path:
    """A one-source, one-mirror pipeline file (``app.orders``) for ``cdcsync`` to run, with its migrations applied
    by :func:`init_and_migrate`."""
    import yaml

    source = {"type": "kafka", "topic": topic, "primary_key": "id", "columns": dict(columns), **(source_options or {})}
    pipeline = {
        "name": name,
        "sources": {"orders": source},
        "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": MIRROR_SCHEMA, "table": MIRROR_TABLE}},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    return path


def init_and_migrate(pipeline_file: Path, env: dict[str, str]) -> None:
    """``cdcsync init`` and ``cdcsync migrate``: their output only if one fails."""
    for command in ("init", "migrate"):
        done = subprocess.run(
            [sys.executable, "-m", "cdcsync", command, str(pipeline_file)], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"cdcsync {command} exited {done.returncode}: {done.stdout}{done.stderr}")


@contextlib.contextmanager
def cdcsync_run(
    pipeline_file: Path, env: dict[str, str], log: Any, *options: str, debug: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    """``cdcsync run`` (with ``options``; ``debug``: ``cdcsync --debug run``) in a session of its own; SIGTERM if it
    is still running on the way out (it finishes its batch), SIGKILL of the whole session if that hangs."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cdcsync", *(["--debug"] if debug else []), "run", *options, str(pipeline_file)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def mirror_equals(dsn: str, columns: dict[str, str], expected: dict[int, dict[str, Any]]) -> bool:
    """Whether the mirror of :func:`write_mirror_pipeline` holds exactly ``expected`` (id -> row)."""
    import psycopg
    from psycopg import sql

    names = list(columns)
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(map(sql.Identifier, names)), sql.Identifier(MIRROR_SCHEMA, MIRROR_TABLE)
    )
    with psycopg.connect(dsn) as conn:
        rows = {r[0]: dict(zip(names, r, strict=True)) for r in conn.execute(query)}
    return rows == expected


class Scratch:
    """The topics and databases a benchmark makes on the services it runs against, removed on its way out.

    Why: against running services (``--postgres-dsn``, ``--bootstrap``) a 1M-change run would leave about half a
    gigabyte of topic and some hundreds of megabytes of databases behind, and a long-lived development machine
    fills up. A benchmark that starts a dev stack of its own removes the whole stack anyway.
    """

    def __init__(self, services: BenchServices) -> None:
        self.admin_dsn = services.admin_dsn
        self.bootstrap = services.bootstrap
        self._topics: list[str] = []
        self._databases: list[str] = []

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *_: object) -> None:
        from psycopg.conninfo import conninfo_to_dict

        for dsn in self._databases:
            try:
                drop_database(self.admin_dsn, dsn)
            except Exception as error:  # named, not the DSN: it may hold a password
                print(f"warning: database {conninfo_to_dict(dsn)['dbname']} not dropped: {error}", flush=True)
        delete_topics(self.bootstrap, self._topics)

    def topic(self, prefix: str = "bench.public.orders") -> str:
        """A fresh topic's name, deleted on the way out (the benchmark's producer creates it)."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self._topics.append(name)
        return name

    def database(self, prefix: str = "bench") -> str:
        """A fresh database's DSN (:func:`fresh_database`), dropped on the way out."""
        dsn = fresh_database(self.admin_dsn, prefix)
        self._databases.append(dsn)
        return dsn


def drop_database(admin_dsn: str, dsn: str) -> None:
    """Drop a database :func:`fresh_database` made (on shared services a large one would stay behind)."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    name = str(conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def delete_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> None:
    """Delete a benchmark's topic (millions of changes are gigabytes on a shared broker's disk)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the result: its end cancels the request
    admin.delete_topics([topic], operation_timeout=timeout)[topic].result(timeout)


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """:func:`delete_topic` for each, on a benchmark's way out: one that cannot be deleted (never created, the
    producer having failed first) is named, not raised."""
    for topic in topics:
        try:
            delete_topic(bootstrap, topic)
        except Exception as error:
            print(f"warning: topic {topic} not deleted: {error}", flush=True)
