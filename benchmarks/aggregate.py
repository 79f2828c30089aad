"""Aggregation throughput: ``make bench-aggregate`` (or ``python benchmarks/aggregate.py [--changes N ...]``).

1. starts a dev stack of its own unless ``--postgres-dsn`` and ``--bootstrap`` point at running services;
2. produces N Debezium changes over K keys whose ``customer_id`` spreads them over G groups (about 30% inserts,
   60% updates, 10% of which move a row to another group, 10% deletes) into a fresh topic;
3. runs, on the same topic and in one Spark session, a plain upsert pipeline (``type: postgres``) and a
   ``postgres_aggregate`` pipeline with five aggregates (sum, count, avg, min, max) by ``customer_id``, each
   ``--available-now`` into a fresh database, and times each from its first micro-batch to catch-up;
4. checks the landing table equals the expected final state and the aggregation table equals a fresh
   ``SELECT ... GROUP BY`` over it;
5. prints changes/s of both and their ratio: what the triggers cost; then the whole machine's busy and idle
   core-seconds over each run and how many cores were busy every half second, which tell the CPU a run needed
   apart from the cores it left idle (the aggregate's last merges run alone).

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
    MachineCpu,
    Scratch,
    add_service_arguments,
    bench_services,
    machine_line,
    prepare_pipeline,
    timed_window,
)
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.config.settings import load_settings
from cdcsync.devstack import workload
from cdcsync.runtime.spark import build_spark_session

AGGREGATES = {
    "revenue": {"from": "amount", "fn": "sum"},
    "orders": {"fn": "count"},
    "avg_amount": {"from": "amount", "fn": "avg"},
    "smallest": {"from": "amount", "fn": "min"},
    "largest": {"from": "amount", "fn": "max"},
}
AGGREGATION_TABLE = "SELECT customer_id, revenue, orders, avg_amount, smallest, largest FROM app.revenue"
FRESH_GROUP_BY = """
    SELECT customer_id, sum(amount), count(*), avg(amount), min(amount), max(amount)
    FROM app.orders_state GROUP BY customer_id
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--groups", type=int, default=10_000)
    add_service_arguments(parser)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="cdcsync-bench-") as tmp,
        bench_services(args, Path(tmp)) as services,
        Scratch(services) as scratch,
    ):
        run(args, Path(tmp), scratch)


def aggregate_sink(aggregates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The benchmark's ``postgres_aggregate`` sink (``app.orders_state`` into ``app.revenue`` by ``customer_id``)."""
    return {
        "type": "postgres_aggregate",
        "from": "orders",
        "schema": "app",
        "landing_table": "orders_state",
        "agg_table": "revenue",
        "group_by": {"customer_id": None},
        "aggregate": aggregates,
    }


def _pipeline(name: str, topic: str, columns: dict[str, str], sink: dict[str, Any]) -> Pipeline:
    source = {"type": "kafka", "topic": topic, "primary_key": "id", "columns": columns}
    return validate_pipeline_dict({"name": name, "sources": {"orders": source}, "sinks": {"sink": sink}})


def _timed_window(pipeline: Pipeline, root: Path, dsn: str, bootstrap: str, spark: Any) -> tuple[float, float, int]:
    return timed_window(pipeline, prepare_pipeline(pipeline, root, dsn, bootstrap), spark)


def run(args: argparse.Namespace, root: Path, scratch: Scratch) -> None:
    import psycopg

    bootstrap = scratch.bootstrap
    topic = scratch.topic()
    load = workload.generate(args.changes, args.keys, seed=1, customers=args.groups)
    messages = workload.produce(bootstrap, topic, load.events, partitions=4)
    print(
        f"produced {load.changes:,} changes over {args.keys:,} keys and {args.groups:,} groups "
        f"({messages:,} messages with tombstones)",
        flush=True,
    )
    columns = dict(load.columns)
    upsert = _pipeline(
        "bench_upsert", topic, columns, {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}
    )
    aggregate = _pipeline("bench_aggregate", topic, columns, aggregate_sink(AGGREGATES))
    upsert_dsn, aggregate_dsn = scratch.database(), scratch.database()
    # A short run first, so that neither timed run pays the JVM's warm-up.
    warm_topic = scratch.topic("bench.public.warmup")
    workload.produce(bootstrap, warm_topic, workload.generate(50_000, 5_000, seed=2).events, partitions=4)
    warm_up = _pipeline(
        "bench_warmup", warm_topic, columns, {"type": "postgres", "from": "orders", "schema": "app", "table": "warm"}
    )

    t0 = time.perf_counter()
    spark = build_spark_session(load_settings(), "cdcsync-bench")
    print(f"spark session started in {time.perf_counter() - t0:.1f}s", flush=True)
    with MachineCpu() as cpu:
        try:
            _timed_window(warm_up, root, scratch.database(), bootstrap, spark)
            upsert_run = _timed_window(upsert, root, upsert_dsn, bootstrap, spark)
            aggregate_run = _timed_window(aggregate, root, aggregate_dsn, bootstrap, spark)
        finally:
            spark.stop()

    names = list(load.columns)
    quoted = ", ".join(f'"{c}"' for c in names)
    with psycopg.connect(aggregate_dsn) as conn:
        landed = {
            r[0]: dict(zip(names, r, strict=True)) for r in conn.execute(f"SELECT {quoted} FROM app.orders_state")
        }
        assert landed == load.expected, "the landing table does not equal the expected final state"
        table = sorted(conn.execute(AGGREGATION_TABLE).fetchall(), key=repr)
        assert table == sorted(conn.execute(FRESH_GROUP_BY).fetchall(), key=repr), "aggregates differ from GROUP BY"

    runs = (
        ("plain upsert (type: postgres):    ", upsert_run),
        ("postgres_aggregate, 5 aggregates: ", aggregate_run),
    )
    rates = [load.changes / (end - start) for _, (start, end, _) in runs]
    print()
    print(machine_line())
    print(f"groups in the aggregation table:     {len(table):8,}")
    for (label, (start, end, batches)), rate in zip(runs, rates, strict=True):
        print(f"{label}   {end - start:8.1f} s  {rate:8,.0f} changes/s  ({batches} micro-batches)")
    print(f"aggregate / upsert throughput:       {rates[1] / rates[0]:8.2f}")
    print("landing table verified equal to the expected state; aggregates equal to a fresh GROUP BY")
    # Where a run's wall time went on a machine its services share: CPU it needed, and cores it left idle.
    print("the machine's CPU over each run: busy and idle core-seconds, then cores busy every 0.5 s")
    for label, (start, end, _) in runs:
        busy, idle = cpu.window(start, end)
        slices = " ".join(f"{cores:.1f}" for cores in cpu.cores_busy(start, end))
        print(f"{label}   {busy:5.1f} busy {idle:5.1f} idle   {slices}")


if __name__ == "__main__":
    main()
