"""End-to-end upsert throughput: ``make bench`` (or ``python benchmarks/upsert.py [--changes N --keys K]``).

1. starts a dev stack of its own (temporary state dir, ports of its own) unless ``--postgres-dsn`` and
   ``--bootstrap`` point at running services;
2. produces N Debezium changes over K keys (about 30% inserts, 60% updates, 10% deletes, JsonConverter without
   the schema wrapper) into a fresh topic;
3. renders and applies the migrations of a one-sink pipeline into a fresh database;
4. runs the pipeline ``--available-now`` in-process and times it from the start of its first micro-batch to
   catch-up: changes/s;
5. checks the mirror equals the expected final state;
6. times a plain ``COPY`` of the same final rows into an empty table with the same primary key — the ceiling —
   and prints the ratio.

Prints its figures; asserts only correctness.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.common import add_service_arguments, bench_services, fresh_database, machine_line
from cdcsync.config.pipeline import validate_pipeline_dict
from cdcsync.config.settings import load_settings
from cdcsync.devstack import workload
from cdcsync.runtime.spark import build_spark_session
from cdcsync.runtime.stream import PipelineRunner
from cdcsync.sql import migrations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    add_service_arguments(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdcsync-bench-") as tmp, bench_services(args, Path(tmp)) as services:
        run(args, Path(tmp), services.admin_dsn, services.bootstrap)


def run(args: argparse.Namespace, root: Path, admin_dsn: str, bootstrap: str) -> None:
    import psycopg

    topic = f"bench.public.orders_{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    load = workload.generate(args.changes, args.keys, seed=1, wrapped=False)
    generated = time.perf_counter() - t0
    t0 = time.perf_counter()
    messages = workload.produce(bootstrap, topic, load.events, partitions=4)
    produced = time.perf_counter() - t0
    print(
        f"generated {load.changes:,} changes over {args.keys:,} keys in {generated:.1f}s "
        f"({load.counts['c']:,} inserts, {load.counts['u']:,} updates, {load.counts['d']:,} deletes, "
        f"{load.counts['tombstone']:,} tombstones); produced {messages:,} messages in {produced:.1f}s",
        flush=True,
    )

    dsn = fresh_database(admin_dsn, "bench")

    source: dict[str, Any] = {"type": "kafka", "topic": topic, "primary_key": "id", "columns": dict(load.columns)}
    if args.max_offsets_per_trigger:
        source["max_offsets_per_trigger"] = args.max_offsets_per_trigger
    pipeline = validate_pipeline_dict(
        {
            "name": "bench",
            "sources": {"orders": source},
            "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}},
        }
    )
    settings = load_settings(
        postgres__dsn=dsn,
        kafka__bootstrap_servers=bootstrap,
        state_dir=root / "state",
        migrations_dir=root / "migrations",
    )
    migrations.init(pipeline, settings.migrations_dir)
    with psycopg.connect(dsn) as conn:
        migrations.apply_pending(conn, pipeline.name, settings.migrations_dir)

    t0 = time.perf_counter()
    spark = build_spark_session(settings, "cdcsync-bench")
    spark_start = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        snapshot = PipelineRunner(pipeline, settings, available_now=True).run(spark)
        total = time.perf_counter() - t0
    finally:
        spark.stop()
    stats = snapshot.sources["orders"]
    assert stats.first_batch_at is not None and stats.last_batch_done_at is not None
    streaming = stats.last_batch_done_at - stats.first_batch_at
    changes_per_s = load.changes / streaming

    columns = list(load.columns)
    quoted = ", ".join(f'"{c}"' for c in columns)
    with psycopg.connect(dsn) as conn:
        rows = {r[0]: dict(zip(columns, r, strict=True)) for r in conn.execute(f"SELECT {quoted} FROM app.orders")}
        assert rows == load.expected, "the mirror does not equal the expected final state"
        buffer = io.BytesIO()
        with conn.cursor().copy("COPY app.orders TO STDOUT") as copy:
            for chunk in copy:
                buffer.write(chunk)
        conn.execute("CREATE TABLE app.copy_ceiling (LIKE app.orders INCLUDING ALL)")
        conn.commit()
        t0 = time.perf_counter()
        with conn.cursor().copy("COPY app.copy_ceiling FROM STDIN") as copy:
            copy.write(buffer.getvalue())
        conn.commit()
        copy_seconds = time.perf_counter() - t0

    print()
    print(machine_line())
    print(f"spark session start:            {spark_start:8.1f} s")
    print(f"run --available-now (all):      {total:8.1f} s  ({stats.batches} micro-batches)")
    print(f"first batch start -> catch-up:  {streaming:8.1f} s")
    print(f"end-to-end throughput:          {changes_per_s:8,.0f} changes/s  ({load.changes:,} changes)")
    print(f"                                {messages / streaming:8,.0f} messages/s ({messages:,} with tombstones)")
    print(f"final rows:                     {len(rows):8,}")
    print(f"plain COPY of the final rows:   {copy_seconds:8.2f} s  ({len(rows) / copy_seconds:,.0f} rows/s)")
    print(f"pipeline time / COPY time:      {streaming / copy_seconds:8.1f} x")
    print("mirror verified equal to the expected final state")


if __name__ == "__main__":
    main()
