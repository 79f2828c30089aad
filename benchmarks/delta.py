"""Delta mirror throughput next to the Postgres mirror's: ``make bench-delta`` (or ``python benchmarks/delta.py
[--changes N --keys K]``).

1. starts a dev stack of its own unless ``--postgres-dsn`` and ``--bootstrap`` point at running services;
2. produces N Debezium changes over K keys (the workload of ``make bench``: about 30% inserts, 60% updates, 10%
   deletes) into one topic;
3. runs two pipelines ``--available-now`` over it on one Spark session, each timed from its first micro-batch to
   catch-up: a Postgres mirror (as ``make bench``), then a Delta mirror (hard deletes, a local path);
4. checks both equal the expected final state (the Delta table read back with Spark) and prints changes/s of each.

Prints its figures; asserts only correctness.
"""

from __future__ import annotations

import argparse
import contextlib
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
from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.devstack import workload
from cdcsync.migrations import DELTA
from cdcsync.migrations.delta import DeltaConnection
from cdcsync.runtime.spark import build_spark_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    add_service_arguments(parser)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdcsync-bench-delta-")))
        services = stack.enter_context(bench_services(args, tmp))
        run(args, tmp, stack.enter_context(Scratch(services)))


def pipeline(name: str, topic: str, columns: dict[str, str], sink: dict[str, Any], max_offsets: int | None) -> Any:
    source: dict[str, Any] = {"type": "kafka", "topic": topic, "primary_key": "id", "columns": dict(columns)}
    if max_offsets:
        source["max_offsets_per_trigger"] = max_offsets
    return validate_pipeline_dict(
        {"name": name, "sources": {"orders": source}, "sinks": {"mirror": {"from": "orders", **sink}}}
    )


def run(args: argparse.Namespace, root: Path, scratch: Scratch) -> None:
    import psycopg

    bootstrap = scratch.bootstrap
    load = workload.generate(args.changes, args.keys, seed=1, wrapped=False)
    topic = scratch.topic()
    messages = workload.produce(bootstrap, topic, load.events, partitions=4)
    print(f"produced {load.changes:,} changes ({messages:,} messages) over {args.keys:,} keys", flush=True)
    lake = root / "lake" / "orders"
    postgres = pipeline(
        "bench_pg",
        topic,
        load.columns,
        {"type": "postgres", "schema": "app", "table": "orders"},
        args.max_offsets_per_trigger,
    )
    delta = pipeline(
        "bench_delta", topic, load.columns, {"type": "delta", "path": str(lake)}, args.max_offsets_per_trigger
    )

    dsn = scratch.database()
    pg_settings = prepare_pipeline(postgres, root, dsn, bootstrap)
    delta_settings = prepare_pipeline(delta, root, dsn, bootstrap)
    t0 = time.perf_counter()
    spark = build_spark_session(pg_settings, "cdcsync-bench-delta")
    spark_start = time.perf_counter() - t0
    try:
        migrations.init(DELTA, delta, delta_settings.migrations_dir)
        with psycopg.connect(dsn) as conn:
            migrations.apply_pending(DELTA, DeltaConnection(conn, spark), delta.name, delta_settings.migrations_dir)
        pg_s, pg_batches = timed_run(postgres, pg_settings, spark)
        print(f"postgres mirror: {pg_s:.1f}s ({pg_batches} micro-batches)", flush=True)
        delta_s, delta_batches = timed_run(delta, delta_settings, spark)
        print(f"delta mirror:    {delta_s:.1f}s ({delta_batches} micro-batches)", flush=True)
        columns = list(load.columns)
        rows = spark.read.format("delta").load(str(lake)).select(*columns).collect()
        lake_rows = {row["id"]: row.asDict() for row in rows}
    finally:
        spark.stop()
    quoted = ", ".join(f'"{c}"' for c in columns)
    with psycopg.connect(dsn) as conn:
        pg_rows = {r[0]: dict(zip(columns, r, strict=True)) for r in conn.execute(f"SELECT {quoted} FROM app.orders")}
    assert pg_rows == load.expected, "the Postgres mirror does not equal the expected final state"
    assert set(lake_rows) == set(load.expected), "the Delta mirror's keys differ from the expected final state"

    print()
    print(machine_line())
    print(f"spark session start:          {spark_start:8.1f} s")
    print(f"{'':30}{'postgres':>12}{'delta':>12}")
    print(f"{'first batch -> catch-up (s)':30}{pg_s:12.1f}{delta_s:12.1f}")
    print(f"{'micro-batches':30}{pg_batches:12}{delta_batches:12}")
    print(f"{'changes/s':30}{load.changes / pg_s:12,.0f}{load.changes / delta_s:12,.0f}")
    print(f"final rows: {len(load.expected):,}; both mirrors verified against the expected final state")


if __name__ == "__main__":
    main()
