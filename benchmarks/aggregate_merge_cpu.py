"""Postgres CPU of an aggregation sink's merges, without Spark: ``python benchmarks/aggregate_merge_cpu.py
--postgres-dsn DSN [--changes N --keys K --groups G] [--sinks upsert,aggregate,...] [--rounds R]``.

What ``make bench-aggregate`` compares (a plain upsert against a ``postgres_aggregate`` sink with sum, count, avg,
min and max by ``customer_id``) depends mostly on what the Postgres backend does in each micro-batch's merge,
and on a shared machine that is best read as the backend's CPU seconds (``/proc/<pid>/stat``), not as
wall-clock time. So this harness:

1. generates the benchmark's changes (1M over 200k keys and 10,000 groups by default), cuts them into Kafka's
   four partitions and each partition into three micro-batches by offset (as the benchmark's three micro-batches
   cut them), and decodes them with the executors' decoder, once (cached under ``--cache``);
2. for each sink of ``--sinks`` and each of ``--rounds`` rounds: a fresh database with the sink's migrations,
   then per micro-batch the sink's own stage writer (COPY) and merge, reading the merging backend's CPU seconds
   around the merge only;
3. checks the landing table against the expected state and the aggregation table against a fresh
   ``SELECT ... GROUP BY``; prints the CPU seconds per merge and their sum.

Sinks: ``upsert`` (``type: postgres``), ``aggregate`` (the five aggregates), ``aggregate-no-triggers`` (the same
landing table and its index, the triggers disabled: what the landing table alone costs), ``aggregate-sum``
(sum and count only: no min/max index, no recompute), ``aggregate-bare`` (the landing table without its
index, the triggers disabled), ``aggregate-group-index`` (triggers disabled, an index on the group key alone
instead of the min/max index: what an index costs that most updates do not touch). The Postgres server must run
on this machine (its backend is read from ``/proc``). Run from another checkout, it measures that checkout's SQL.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.aggregate import AGGREGATES, aggregate_sink
from benchmarks.common import drop_database, fresh_database, prepare_pipeline
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline, PostgresAggregateSink, PostgresSink
from cdcsync.devstack import workload

TOPIC = "bench.public.orders"
PARTITIONS = 4
BATCHES = 3
_TICK = os.sysconf("SC_CLK_TCK")
SUMS_ONLY = {name: spec for name, spec in AGGREGATES.items() if spec["fn"] in ("sum", "count")}
_NO_TRIGGERS = "ALTER TABLE app.orders_state DISABLE TRIGGER USER"
SETUP: dict[str, tuple[str, ...]] = {
    "aggregate-no-triggers": (_NO_TRIGGERS,),
    "aggregate-bare": (_NO_TRIGGERS, "DROP INDEX app.revenue__amount__minmax"),
    "aggregate-group-index": (
        _NO_TRIGGERS,
        "DROP INDEX app.revenue__amount__minmax",
        "CREATE INDEX ON app.orders_state (customer_id)",
    ),
}
"""What each variant of the aggregate sink changes after its migrations (how much of the cost is what)."""
CHECKS = {
    "revenue": "sum(amount)",
    "orders": "count(*)",
    "avg_amount": "avg(amount)",
    "smallest": "min(amount)",
    "largest": "max(amount)",
}


def _backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def decoded_batches(changes: int, keys: int, groups: int, cache: Path) -> tuple[list[list[Any]], dict[int, Any]]:
    """[micro-batch][partition] decoded Arrow tables, and the expected final rows (cached: decoding 1M changes
    takes a while)."""
    import pyarrow as pa

    from cdcsync.config.types import parse_pg_type
    from cdcsync.sources.debezium.dispatch import decode_batches
    from cdcsync.sources.debezium.spec import DecodeSpec

    path = cache / f"aggregate-merge-{changes}-{keys}-{groups}.pickle"
    if path.exists():
        with path.open("rb") as f:
            loaded: tuple[list[list[Any]], dict[int, Any]] = pickle.load(f)
            return loaded
    load = workload.generate(changes, keys, seed=1, customers=groups)
    columns = tuple((name, parse_pg_type(type_)) for name, type_ in load.columns.items())
    spec = DecodeSpec("orders", columns, ("id",))
    kafka = workload.to_kafka_batch(load.events, topic=TOPIC, partitions=PARTITIONS)
    chunks = (kafka.slice(i, 10_000) for i in range(0, kafka.num_rows, 10_000))
    rows = pa.Table.from_batches(list(decode_batches(chunks, spec)))
    batches: list[list[Any]] = [[] for _ in range(BATCHES)]
    partition, offset = rows.column("_cdc_partition").to_pylist(), rows.column("_cdc_offset").to_pylist()
    ends = [max(o for p, o in zip(partition, offset, strict=True) if p == part) + 1 for part in range(PARTITIONS)]
    for part in range(PARTITIONS):
        for b in range(BATCHES):
            low, high = ends[part] * b // BATCHES, ends[part] * (b + 1) // BATCHES
            mask = [p == part and low <= o < high for p, o in zip(partition, offset, strict=True)]
            batches[b].append(rows.filter(pa.array(mask)))
    cache.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump((batches, load.expected), f)
    return batches, load.expected


def pipeline_for(kind: str) -> Pipeline:
    sink: dict[str, Any] = {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}
    if kind != "upsert":
        sink = aggregate_sink(SUMS_ONLY if kind == "aggregate-sum" else AGGREGATES)
    source = {"type": "kafka", "topic": TOPIC, "primary_key": "id", "columns": dict(workload.ORDERS_COLUMNS)}
    return validate_pipeline_dict({"name": "merge_cpu", "sources": {"orders": source}, "sinks": {"sink": sink}})


def run_sink(
    kind: str, batches: list[list[Any]], expected: dict[int, Any], admin_dsn: str, root: Path, explain: Path | None
) -> list[float]:
    """CPU seconds of the backend in each merge of ``batches`` into a fresh database; checks the result."""
    import psycopg

    from cdcsync.db.postgres import reused_connection
    from cdcsync.sinks.postgres import PostgresUpsertSink

    pipeline = pipeline_for(kind)
    dsn = fresh_database(admin_dsn, "merge_cpu")
    try:
        prepare_pipeline(pipeline, root / uuid.uuid4().hex[:8], dsn, "127.0.0.1:1")
        if SETUP.get(kind):
            with psycopg.connect(dsn) as conn:
                for statement in SETUP[kind]:
                    conn.execute(statement)
        definition = pipeline.sinks["sink"]
        assert isinstance(definition, PostgresSink | PostgresAggregateSink)
        sink = PostgresUpsertSink(pipeline, "sink", definition, dsn)
        seconds = []
        for batch_id, partitions in enumerate(batches):
            key = sink.ledger_key(batch_id, "merge-cpu")
            assert sink.prepare(key)
            writer = sink.stage_writer(batch_id)
            staged = sum(writer.stage(table) for table in partitions)
            with reused_connection(dsn) as conn:
                pid = conn.info.backend_pid
                if explain is not None:
                    _explain_into(conn, explain / f"{kind}-{batch_id}.txt")
            before = _backend_cpu(pid)
            assert sink.merge(key, staged) is not None
            seconds.append(_backend_cpu(pid) - before)
        _check(kind, dsn, expected)
        return seconds
    finally:
        drop_database(admin_dsn, dsn)


def _explain_into(conn: Any, path: Path) -> None:
    """Every statement the session runs from now on (the triggers' too) is explained, with its timing, into
    ``path`` (auto_explain at NOTICE level reaches the client; needs a superuser)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = path.open("w")

    def write(notice: Any) -> None:
        out.write(f"{notice.message_primary}\n\n")
        out.flush()

    conn.add_notice_handler(write)
    conn.execute("LOAD 'auto_explain'")
    for setting, value in (
        ("log_min_duration", "0"),
        ("log_analyze", "on"),
        ("log_timing", "off"),
        ("log_nested_statements", "on"),
        ("log_buffers", "on"),
        ("log_level", "notice"),
    ):
        conn.execute(f"SET auto_explain.{setting} = {value}")


def _check(kind: str, dsn: str, expected: dict[int, Any]) -> None:
    import psycopg

    table = "app.orders" if kind == "upsert" else "app.orders_state"
    names = list(workload.ORDERS_COLUMNS)
    quoted = ", ".join(f'"{name}"' for name in names)
    with psycopg.connect(dsn) as conn:
        landed = {r[0]: dict(zip(names, r, strict=True)) for r in conn.execute(f"SELECT {quoted} FROM {table}")}
        assert landed == expected, f"{kind}: {table} does not equal the expected final state"
        if kind in ("aggregate", "aggregate-sum"):
            wanted = SUMS_ONLY if kind == "aggregate-sum" else AGGREGATES
            stored = f"SELECT customer_id, {', '.join(wanted)} FROM app.revenue"
            fresh = f"SELECT customer_id, {', '.join(CHECKS[n] for n in wanted)} FROM {table} GROUP BY customer_id"
            got = sorted(conn.execute(stored).fetchall(), key=repr)
            assert got == sorted(conn.execute(fresh).fetchall(), key=repr), f"{kind}: aggregates differ"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres-dsn", required=True, help="a server on this machine (its maintenance database)")
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--sinks", default="upsert,aggregate", help="comma-separated: upsert, aggregate, ...")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/cdcsync-bench-cache"))
    parser.add_argument("--explain", type=Path, help="write every statement's plan and timing under this directory")
    args = parser.parse_args()
    t0 = time.perf_counter()
    batches, expected = decoded_batches(args.changes, args.keys, args.groups, args.cache)
    rows = [sum(t.num_rows for t in partitions) for partitions in batches]
    print(f"{args.changes:,} changes decoded into micro-batches of {rows} rows ({time.perf_counter() - t0:.1f}s)")
    root = args.cache / "runs"
    for round_ in range(args.rounds):
        for kind in args.sinks.split(","):
            seconds = run_sink(kind, batches, expected, args.postgres_dsn, root, args.explain)
            merges = ", ".join(f"{s:.2f}" for s in seconds)
            print(f"round {round_ + 1} {kind:24} merges {merges}  total {sum(seconds):6.2f} backend CPU s", flush=True)
    print(f"checked; load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")


if __name__ == "__main__":
    main()
