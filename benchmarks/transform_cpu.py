"""CPU seconds by process of the transform path against the direct one, back to back in one Spark session:
``python benchmarks/transform_cpu.py --postgres-dsn DSN --bootstrap HOST:PORT [--changes N --keys K]
[--order direct,transform,transform/cached,...] [--cgroup NAME]`` (as root, with the cgroup v1 ``cpuacct``
controller; the services are running ones: a shared dev stack).

``make bench-lookup`` times its three pipelines (:mod:`benchmarks.lookup`) by the wall clock, which on a shared
machine says as much about the neighbours as about cdcsync. This harness runs the same pipelines, in the order
given (ABBA: the JIT and the machine's load drift over a session), each ``--available-now`` into a fresh database
and checked row by row, and prints per run the CPU seconds, scaled to 1M changes, of the driver JVM (``/proc``),
the driver Python (this process), the Python workers (the rest of the benchmark's cgroup) and their sum, as
:mod:`benchmarks.cpu_split` counts them; Postgres and the broker are not counted.

A variant ending in ``/cached`` runs the transform path as it was before session 11: every batch decoded into
Spark's cache before its transforms and staging read it, even when one staging pass is all that reads it
(:func:`cdcsync.engine.graph._one_pass` answers no).

Prints its figures; asserts only correctness.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks import cpu_split
from benchmarks.common import (
    delete_topics,
    drop_database,
    fresh_database,
    machine_line,
    mirror_equals,
    prepare_pipeline,
    timed_run,
)
from benchmarks.lookup import CUSTOMERS, LOOKUP_SQL, TRANSFORM_SQL, bench_pipeline, fill_members, members_rows

SQL = {"direct": None, "transform": TRANSFORM_SQL, "lookup": LOOKUP_SQL}
DEFAULT_ORDER = (
    "direct,transform/cached,transform,lookup/cached,lookup,lookup,lookup/cached,transform,transform/cached,direct"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--lookup-keys", type=int, default=1_000_000)
    parser.add_argument("--order", default=DEFAULT_ORDER, help="comma-separated runs: direct|transform|lookup[/cached]")
    parser.add_argument("--postgres-dsn", required=True, help="a running Postgres (maintenance database)")
    parser.add_argument("--bootstrap", required=True, help="a running Kafka")
    parser.add_argument("--cgroup", default="cdcsync-transform-cpu", help="the cpuacct cgroup to count in")
    args = parser.parse_args()
    order = args.order.split(",")
    for label in order:
        if label.removesuffix("/cached") not in SQL:
            parser.error(f"--order: unknown run {label!r}")
    cpu_split.CGROUP_ROOT = cpu_split.CGROUPS / args.cgroup
    cpu_split._enter("pipeline")
    run(args, order)


def _one_run(label: str, topic: str, args: argparse.Namespace, root: Path, spark: Any, name: str) -> dict[str, Any]:
    """One pipeline to catch-up into a fresh database, checked; its wall and CPU figures."""
    from cdcsync.engine import graph

    kind = label.removesuffix("/cached")
    pipeline = bench_pipeline(name, topic, SQL[kind])
    dsn = fresh_database(args.postgres_dsn, "tcpu")
    try:
        settings = prepare_pipeline(pipeline, root, dsn, args.bootstrap)
        if kind != "direct":
            fill_members(dsn, args.lookup_keys)
        one_pass = graph._one_pass
        if label.endswith("/cached"):
            graph._one_pass = lambda *_: False  # type: ignore[assignment]
        jvm = cpu_split._driver_jvm()
        before = cpu_split._usage("pipeline")
        jvm_before, driver_before = cpu_split._process_cpu(jvm), cpu_split._process_cpu(os.getpid())
        try:
            seconds, batches = timed_run(pipeline, settings, spark)
        finally:
            graph._one_pass = one_pass  # type: ignore[assignment]
        scale = 1e6 / args.changes
        total = (cpu_split._usage("pipeline") - before) * scale
        jvm_s = (cpu_split._process_cpu(jvm) - jvm_before) * scale
        driver_s = (cpu_split._process_cpu(os.getpid()) - driver_before) * scale
        expected = args.expected if kind != "lookup" else members_rows(args.expected, args.lookup_keys)
        assert mirror_equals(dsn, args.columns, expected), f"{label}: the mirror does not hold the expected rows"
    finally:
        drop_database(args.postgres_dsn, dsn)
    return {
        "seconds": seconds,
        "batches": batches,
        "total": total,
        "jvm": jvm_s,
        "workers": total - jvm_s - driver_s,
        "driver": driver_s,
    }


def run(args: argparse.Namespace, order: list[str]) -> None:
    import tempfile

    from cdcsync.config.settings import load_settings
    from cdcsync.devstack import workload
    from cdcsync.runtime.spark import build_spark_session

    load = workload.generate(args.changes, args.keys, seed=1, customers=CUSTOMERS)
    args.expected, args.columns = load.expected, dict(workload.ORDERS_COLUMNS)
    warm = workload.generate(50_000, 5_000, seed=2)  # runs first, so that no timed run pays the JVM's warm-up
    warm_args = argparse.Namespace(**{**vars(args), "changes": warm.changes, "expected": warm.expected})
    topic = f"tcpu.public.orders_{uuid.uuid4().hex[:8]}"
    warm_topic = f"{topic}_warmup"
    try:
        workload.produce(args.bootstrap, topic, load.events, partitions=4)
        workload.produce(args.bootstrap, warm_topic, warm.events, partitions=4)
        root = Path(tempfile.mkdtemp(prefix="cdcsync-transform-cpu-"))
        spark = build_spark_session(load_settings(kafka__bootstrap_servers=args.bootstrap), "transform-cpu")
        print(machine_line())
        print(f"{load.changes:,} changes over {args.keys:,} keys; dynamic table of {args.lookup_keys:,} keys")
        print("run                  wall (s)  changes/s  batches | CPU s per 1M: total     JVM  workers  driver  load")
        try:
            for label in ("direct", "transform"):  # both paths: the JIT compiles each one's code
                warmed = _one_run(label, warm_topic, warm_args, root, spark, f"tcpu_warm_{label}")
                print(f"{f'warm-up ({label})':20} {warmed['seconds']:8.1f}", flush=True)
            for n, label in enumerate(order, start=1):
                r = _one_run(label, topic, args, root, spark, f"tcpu_{n}")
                print(
                    f"{label:20} {r['seconds']:8.1f} {load.changes / r['seconds']:10,.0f} {r['batches']:8} |"
                    f" {r['total']:19.1f} {r['jvm']:7.1f} {r['workers']:8.1f} {r['driver']:7.1f}"
                    f" {os.getloadavg()[0]:5.1f}",
                    flush=True,
                )
        finally:
            spark.stop()
    finally:
        delete_topics(args.bootstrap, [topic, warm_topic])
    print("every mirror verified equal to its expected rows")


if __name__ == "__main__":
    main()
