"""End-to-end ClickHouse throughput: ``make bench-clickhouse`` (or ``python benchmarks/clickhouse.py [--changes N]``).

1. starts a dev stack of its own (temporary state dir, ports of its own; ClickHouse is the chDB-backed HTTP
   stand-in) unless ``--postgres-dsn``, ``--bootstrap`` and ``--clickhouse-url`` point at running services;
2. produces N Debezium changes over K keys (the workload of ``benchmarks/upsert.py``) into a fresh topic;
3. renders and applies the migrations of a one-sink pipeline (``type: clickhouse``) into a fresh Postgres
   database (batch ledger, dead letters) and a fresh ClickHouse database;
4. runs the pipeline ``--available-now`` in-process and times it from the start of its first micro-batch to
   catch-up: changes/s;
5. checks ``SELECT … FINAL WHERE NOT _is_deleted`` equals the expected final state;
6. times one direct clickhouse-connect Arrow insert of the same rows the pipeline wrote (read back from the
   table before any merge) into an empty table of the same shape on the same engine — the ceiling — and prints
   the ratio.

Prints its figures; asserts only correctness.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.common import Scratch, add_service_arguments, bench_services, machine_line
from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.settings import load_settings
from cdcsync.db.clickhouse import connect
from cdcsync.devstack import workload
from cdcsync.migrations import CLICKHOUSE, POSTGRES
from cdcsync.runtime.spark import build_spark_session
from cdcsync.runtime.stream import PipelineRunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--compression", default="lz4", choices=["none", "gzip", "lz4", "zstd"])
    add_service_arguments(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdcsync-bench-ch-") as tmp, bench_services(args, Path(tmp)) as services:
        if not services.clickhouse_url:
            parser.error("--clickhouse-url is needed with --postgres-dsn and --bootstrap")
        with Scratch(services) as scratch:
            run(args, Path(tmp), scratch, services.clickhouse_url)


def run(args: argparse.Namespace, root: Path, scratch: Scratch, clickhouse_url: str) -> None:
    import psycopg

    bootstrap = scratch.bootstrap
    topic = scratch.topic()
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

    dsn = scratch.database("benchch")
    database = f"bench_{uuid.uuid4().hex[:8]}"
    source: dict[str, Any] = {"type": "kafka", "topic": topic, "primary_key": "id", "columns": dict(load.columns)}
    if args.max_offsets_per_trigger:
        source["max_offsets_per_trigger"] = args.max_offsets_per_trigger
    name = f"benchch_{uuid.uuid4().hex[:6]}"  # ClickHouse's migration ledger outlives the benchmark's database
    sink = {"type": "clickhouse", "from": "orders", "database": database, "table": "orders"}
    pipeline = validate_pipeline_dict(
        {"name": name, "sources": {"orders": source}, "sinks": {"ch": {**sink, "compression": args.compression}}}
    )
    settings = load_settings(
        postgres__dsn=dsn,
        kafka__bootstrap_servers=bootstrap,
        clickhouse__url=clickhouse_url,
        state_dir=root / "state",
        migrations_dir=root / "migrations",
    )
    migrations.init(POSTGRES, pipeline, settings.migrations_dir)
    migrations.init(CLICKHOUSE, pipeline, settings.migrations_dir)
    client = connect(clickhouse_url)
    with psycopg.connect(dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, settings.migrations_dir)
    migrations.apply_pending(CLICKHOUSE, client, pipeline.name, settings.migrations_dir)
    client.command(f"SYSTEM STOP MERGES `{database}`.orders")  # so the ceiling below inserts every row written

    t0 = time.perf_counter()
    spark = build_spark_session(settings, "cdcsync-bench-clickhouse")
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

    columns = list(load.columns)
    quoted = ", ".join(f"`{c}`" for c in columns)
    result = client.query(f"SELECT {quoted} FROM `{database}`.orders FINAL WHERE NOT _is_deleted")
    rows = {}
    for row in result.result_rows:
        record = dict(zip(columns, row, strict=True))
        if record["updated_at"] is not None and record["updated_at"].tzinfo is None:
            record["updated_at"] = record["updated_at"].replace(tzinfo=dt.timezone.utc)
        rows[record["id"]] = record
    assert rows == load.expected, "the ClickHouse table does not equal the expected final state"

    written = client.query_arrow(f"SELECT * FROM `{database}`.orders")
    client.command(f"CREATE TABLE `{database}`.ceiling AS `{database}`.orders")
    ceiling_client = connect(clickhouse_url, compression=args.compression)
    t0 = time.perf_counter()
    ceiling_client.insert_arrow("ceiling", written, database=database)
    insert_seconds = time.perf_counter() - t0
    client.command(f"DROP DATABASE `{database}` SYNC")

    print()
    print(machine_line())
    print(f"spark session start:            {spark_start:8.1f} s")
    print(f"run --available-now (all):      {total:8.1f} s  ({stats.batches} micro-batches)")
    print(f"first batch start -> catch-up:  {streaming:8.1f} s")
    print(f"end-to-end throughput:          {load.changes / streaming:8,.0f} changes/s  ({load.changes:,} changes)")
    print(f"                                {messages / streaming:8,.0f} messages/s ({messages:,} with tombstones)")
    print(f"rows the pipeline wrote:        {written.num_rows:8,}  ({len(rows):,} current after FINAL)")
    print(f"direct Arrow insert of them:    {insert_seconds:8.2f} s  ({written.num_rows / insert_seconds:,.0f} rows/s)")
    print(f"pipeline time / insert time:    {streaming / insert_seconds:8.1f} x")
    print("ClickHouse table verified equal to the expected final state (FINAL, without deleted rows)")


if __name__ == "__main__":
    main()
