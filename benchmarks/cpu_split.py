"""CPU seconds per 1M changes, split by process: ``python benchmarks/cpu_split.py [--changes N --keys K]
[--wrapped | --avro --schema-registry-url URL] [--runs R] [--postgres-dsn DSN --bootstrap HOST:PORT]
[--cgroup NAME]`` (as root, on a Linux host with the cgroup v1 ``cpuacct`` controller).

On a shared machine wall-clock figures say more about the neighbours than about cdcsync; CPU seconds of the
processes that do the work say less about them. So this benchmark:

1. starts a Postgres server and a Kafka broker of its own (dev-stack services, ports 25495/29495, state under
   ``--state-dir``), each launched from inside a ``cpuacct`` cgroup of its own so that everything they run
   (Postgres backends included) is counted there;
2. moves itself into a third cgroup, so that the Spark driver JVM and the executors' Python workers it starts are
   counted there;
3. produces the changes of ``make bench`` (bare JSON, or ``--wrapped``: JsonConverter's schema+payload, or
   ``--avro``: AvroConverter's wire format, schemas registered in the registry at ``--schema-registry-url``) into a
   fresh 4-partition topic, starts one Spark session, then ``--runs`` times mirrors the topic into a fresh database
   ``--available-now`` and checks the mirror against the expected state;
4. prints, per run, the CPU seconds scaled to 1M changes of: the driver JVM (``/proc`` of that process), the driver
   Python (this process), the Python workers (the rest of the third cgroup), Postgres and the broker. The first
   run pays the JVM's warm-up (JIT) and the workers' imports; compare later runs.

The services are left running for the next invocation; ``--down`` stops them. With ``--postgres-dsn`` and
``--bootstrap`` it uses running services instead (another benchmark's, a shared dev stack) and counts only the
pipeline's own processes (Postgres and broker show ``-``); ``--cgroup`` names its cgroups, so that two
invocations at once do not count each other.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

CGROUPS = Path("/sys/fs/cgroup/cpuacct")
CGROUP_ROOT = CGROUPS / "cdcsync-cpu-split"
GROUPS = ("postgres", "kafka", "pipeline")
_TICK = os.sysconf("SC_CLK_TCK")


def _group(name: str) -> Path:
    path = CGROUP_ROOT / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _enter(name: str) -> None:
    (_group(name) / "cgroup.procs").write_text(str(os.getpid()))


def _usage(name: str) -> float:
    return int((_group(name) / "cpuacct.usage").read_text()) / 1e9


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime, all threads


def _driver_jvm() -> int:
    """The Spark driver JVM: the child of this process that runs SparkSubmit (spark-submit execs into it). Not just
    any Java child: a Kafka broker this benchmark started is one too."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        try:
            parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if parent == me and b"org.apache.spark.deploy.SparkSubmit" in command:
            return int(entry.name)
    raise RuntimeError("no Spark driver JVM among this process's children")


def main() -> None:
    global CGROUP_ROOT  # --cgroup
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=40_000)
    parser.add_argument("--wrapped", action="store_true", help="JsonConverter schema+payload messages")
    parser.add_argument("--avro", action="store_true", help="AvroConverter messages (needs --schema-registry-url)")
    parser.add_argument("--schema-registry-url", help="a running Confluent-compatible registry, for --avro")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--state-dir", type=Path, default=Path(tempfile.gettempdir()) / "cdcsync-cpu-split")
    parser.add_argument("--down", action="store_true", help="stop the services this benchmark started")
    parser.add_argument("--postgres-dsn", help="use this running Postgres (maintenance database); with --bootstrap")
    parser.add_argument("--bootstrap", help="use this running Kafka; with --postgres-dsn")
    parser.add_argument("--cgroup", default=CGROUP_ROOT.name, help="the cpuacct cgroup to count in")
    args = parser.parse_args()
    if args.avro and not args.schema_registry_url:
        parser.error("--avro needs --schema-registry-url")
    CGROUP_ROOT = CGROUPS / args.cgroup
    if args.postgres_dsn and args.bootstrap:
        _enter("pipeline")
        run(args, args.postgres_dsn, args.bootstrap, own_services=False)
        return

    from cdcsync.devstack.common import DevStackConfig
    from cdcsync.devstack.kafka import KafkaBroker
    from cdcsync.devstack.postgres import Postgres

    stack = DevStackConfig(state_dir=args.state_dir, postgres_port=25495, kafka_port=29495, kafka_controller_port=29496)
    if args.down:
        KafkaBroker(stack).stop()
        Postgres(stack).stop()
        return
    for group, kind in (("postgres", Postgres), ("kafka", KafkaBroker)):
        _enter(group)  # the service inherits the cgroup of the process that launches it
        service = kind(stack)
        service.start()
        service.wait_ready()
    _enter("pipeline")
    run(args, f"postgresql://cdcsync@127.0.0.1:{stack.postgres_port}/cdcsync", f"127.0.0.1:{stack.kafka_port}")


def run(args: argparse.Namespace, admin_dsn: str, bootstrap: str, own_services: bool = True) -> None:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    from benchmarks.common import fresh_database, machine_line, prepare_pipeline
    from cdcsync.config.load import validate_pipeline_dict
    from cdcsync.config.settings import load_settings
    from cdcsync.devstack import workload
    from cdcsync.runtime.spark import build_spark_session
    from cdcsync.runtime.stream import PipelineRunner

    load = workload.generate(args.changes, args.keys, seed=1, wrapped=args.wrapped)
    topic = f"cpu.public.orders_{uuid.uuid4().hex[:8]}"
    events = load.events
    if args.avro:
        events = workload.to_avro(events, *workload.register_avro_schemas(args.schema_registry_url, topic))
    workload.produce(bootstrap, topic, events, partitions=4)
    root = Path(tempfile.mkdtemp(prefix="cdcsync-cpu-split-"))
    spark = build_spark_session(load_settings(kafka__bootstrap_servers=bootstrap, state_dir=root / "spark"), "cpu")
    jvm = _driver_jvm()
    columns = list(load.columns)
    quoted = ", ".join(f'"{c}"' for c in columns)
    scale = 1e6 / args.changes
    print(machine_line())
    shape = "Avro" if args.avro else ("wrapped JSON" if args.wrapped else "bare JSON")
    print(f"{args.changes:,} changes over {args.keys:,} keys, {shape}")
    print("CPU s per 1M changes    total     JVM  workers  driver  postgres   kafka    wall (s)  load")
    try:
        for n in range(args.runs):
            dsn = fresh_database(admin_dsn, "cpu")
            source = {"type": "kafka", "topic": topic, "primary_key": "id", "columns": dict(load.columns)}
            if args.avro:
                source["format"] = "avro"
            pipeline = validate_pipeline_dict(
                {
                    "name": f"cpu_{n}",
                    "sources": {"orders": source},
                    "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}},
                }
            )
            settings = prepare_pipeline(pipeline, root, dsn, bootstrap, args.schema_registry_url)
            before = {group: _usage(group) for group in GROUPS}
            jvm_before, driver_before = _process_cpu(jvm), _process_cpu(os.getpid())
            started = time.perf_counter()
            PipelineRunner(pipeline, settings, available_now=True).run(spark)
            wall = time.perf_counter() - started
            used = {group: (_usage(group) - before[group]) * scale for group in GROUPS}
            if not own_services:
                used["postgres"] = used["kafka"] = float("nan")
            jvm_s = (_process_cpu(jvm) - jvm_before) * scale
            driver_s = (_process_cpu(os.getpid()) - driver_before) * scale
            with psycopg.connect(dsn) as conn:
                rows = {
                    r[0]: dict(zip(columns, r, strict=True)) for r in conn.execute(f"SELECT {quoted} FROM app.orders")
                }
            assert rows == load.expected, f"run {n}: the mirror does not equal the expected final state"
            if not own_services:  # leave nothing behind in services others use
                name = sql.Identifier(str(conninfo_to_dict(dsn)["dbname"]))
                with psycopg.connect(admin_dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(name))
            total = sum(value for value in used.values() if value == value)  # not the services not counted
            print(
                f"run {n}{' (warm-up)' if n == 0 else '':10}    {total:8.1f} {jvm_s:7.1f} "
                f"{used['pipeline'] - jvm_s - driver_s:8.1f} {driver_s:7.1f} {used['postgres']:9.1f} "
                f"{used['kafka']:7.1f} {wall:11.1f} {os.getloadavg()[0]:5.1f}",
                flush=True,
            )
    finally:
        spark.stop()
        if not own_services:
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.delete_topics([topic])[topic].result(30)
    print("every mirror verified equal to the expected final state")


if __name__ == "__main__":
    main()
