"""Lookup throughput: ``make bench-lookup`` (or ``python benchmarks/lookup.py [--changes N --lookup-keys M]``).

1. starts a dev stack of its own unless ``--postgres-dsn`` and ``--bootstrap`` point at running services;
2. produces N Debezium changes over K keys (about 30% inserts, 60% updates, 10% deletes) whose ``customer_id``
   is drawn from ``1..2M`` into a fresh topic;
3. runs, on the same topic and in one Spark session, each ``--available-now`` into a fresh database:
   * ``direct``: the source straight into a mirror (no transform: the single-pass path);
   * ``transform``: the same through ``SELECT * FROM orders`` (the transform path, without a check);
   * ``lookup``: through ``SELECT * FROM orders WHERE dynamic_table_check('members', customer_id)`` against a
     Postgres dynamic table holding M keys (the odd customer ids);
4. checks the lookup mirror holds exactly the expected rows whose customer is a member;
5. prints changes/s of each, the ratio of lookup to direct (the goal) and to transform: what the check costs.

Prints its figures; asserts only correctness.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.common import (
    Scratch,
    add_service_arguments,
    bench_services,
    machine_line,
    prepare_pipeline,
    timed_run,
)
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.config.settings import load_settings
from cdcsync.devstack import workload
from cdcsync.runtime.spark import build_spark_session

CUSTOMERS = 2_000_000
GOAL = 0.8
"""Issue 14's goal for lookup / direct: a check against a million keys costs at most a fifth of the throughput."""
TRANSFORM_SQL = "SELECT * FROM orders"
LOOKUP_SQL = "SELECT * FROM orders WHERE dynamic_table_check('members', customer_id)"
MIRROR = {"type": "postgres", "schema": "app", "table": "orders"}
MEMBERS = {
    "type": "dynamic_table",
    "backend_type": "postgres",
    "backend_entity_name": "members",
    "key_column": "customer_id",
    "key_type": "bigint",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--lookup-keys", type=int, default=1_000_000)
    add_service_arguments(parser)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="cdcsync-bench-") as tmp,
        bench_services(args, Path(tmp)) as services,
        Scratch(services) as scratch,
    ):
        run(args, Path(tmp), scratch)


def bench_pipeline(name: str, topic: str, transform_sql: str | None) -> Pipeline:
    source = {"type": "kafka", "topic": topic, "primary_key": "id", "columns": dict(workload.ORDERS_COLUMNS)}
    transforms: dict[str, Any] = {}
    if transform_sql is not None:
        transforms = {"members": MEMBERS, "selected": {"type": "sql", "sql": transform_sql, "primary_key": "id"}}
    sink = {**MIRROR, "from": "selected" if transforms else "orders"}
    return validate_pipeline_dict(
        {"name": name, "sources": {"orders": source}, "transforms": transforms, "sinks": {"mirror": sink}}
    )


def fill_members(dsn: str, lookup_keys: int) -> int:
    """Fill the dynamic table with ``lookup_keys`` customer ids (every n-th of ``1..CUSTOMERS``); how many it holds."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        step = max(CUSTOMERS // lookup_keys, 1)
        conn.execute("INSERT INTO public.members (customer_id) SELECT generate_series(1, %s, %s)", (CUSTOMERS, step))
        return int(conn.execute("SELECT count(*) FROM public.members").fetchone()[0])  # type: ignore[index]


def members_rows(expected: dict[int, dict[str, Any]], lookup_keys: int) -> dict[int, dict[str, Any]]:
    """The rows of ``expected`` whose customer :func:`fill_members` made a member: what the lookup mirror holds."""
    step = max(CUSTOMERS // lookup_keys, 1)
    return {key: row for key, row in expected.items() if (row["customer_id"] - 1) % step == 0}


def run(args: argparse.Namespace, root: Path, scratch: Scratch) -> None:
    import psycopg

    bootstrap = scratch.bootstrap
    topic = scratch.topic()
    load = workload.generate(args.changes, args.keys, seed=1, customers=CUSTOMERS)
    messages = workload.produce(bootstrap, topic, load.events, partitions=4)
    print(f"produced {load.changes:,} changes over {args.keys:,} keys ({messages:,} messages)", flush=True)
    pipelines = {
        "direct": bench_pipeline("bench_direct", topic, None),
        "transform": bench_pipeline("bench_transform", topic, TRANSFORM_SQL),
        "lookup": bench_pipeline("bench_lookup", topic, LOOKUP_SQL),
    }
    databases = {label: scratch.database() for label in pipelines}
    settings = {
        label: prepare_pipeline(pipeline, root, databases[label], bootstrap) for label, pipeline in pipelines.items()
    }
    for label in ("transform", "lookup"):  # both have the table; only the lookup pipeline checks it
        members = fill_members(databases[label], args.lookup_keys)
    # A short run first, so that no timed run pays the JVM's warm-up: a lookup against a small table, which runs
    # the transform path and the check's Python function too (its first batch would otherwise pay their JIT
    # compilation and the start of the Python workers that run it: about 1.7 s).
    warm_topic = scratch.topic("bench.public.warmup")
    workload.produce(bootstrap, warm_topic, workload.generate(50_000, 5_000, seed=2).events, partitions=4)
    warm_up = bench_pipeline("bench_warmup", warm_topic, LOOKUP_SQL)
    warm_database = scratch.database()
    warm_settings = prepare_pipeline(warm_up, root, warm_database, bootstrap)
    fill_members(warm_database, 1_000)

    t0 = time.perf_counter()
    spark = build_spark_session(load_settings(), "cdcsync-bench")
    print(f"spark session started in {time.perf_counter() - t0:.1f}s", flush=True)
    try:
        timed_run(warm_up, warm_settings, spark)
        results = {label: timed_run(pipeline, settings[label], spark) for label, pipeline in pipelines.items()}
    finally:
        spark.stop()

    names = list(workload.ORDERS_COLUMNS)
    quoted = ", ".join(f'"{c}"' for c in names)
    expected = members_rows(load.expected, args.lookup_keys)
    with psycopg.connect(databases["lookup"]) as conn:
        landed = {r[0]: dict(zip(names, r, strict=True)) for r in conn.execute(f"SELECT {quoted} FROM app.orders")}
    assert landed == expected, "the lookup mirror does not hold exactly the members' rows"

    print()
    print(machine_line())
    print(f"dynamic table keys:                   {members:10,}")
    print(f"rows in the lookup mirror:            {len(landed):10,} of {len(load.expected):,}")
    rates = {}
    for label, (seconds, batches) in results.items():
        rates[label] = load.changes / seconds
        print(f"{label:10s} {seconds:8.1f} s  {rates[label]:8,.0f} changes/s  ({batches} micro-batches)")
    print(f"lookup / direct throughput:           {rates['lookup'] / rates['direct']:10.2f}  (goal >= {GOAL:.2f})")
    print(f"lookup / transform throughput:        {rates['lookup'] / rates['transform']:10.2f}")
    print(f"transform / direct throughput:        {rates['transform'] / rates['direct']:10.2f}")
    print("lookup mirror verified equal to the expected rows of member customers")


if __name__ == "__main__":
    main()
