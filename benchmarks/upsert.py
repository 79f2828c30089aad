"""End-to-end upsert throughput: ``make bench`` (or ``python benchmarks/upsert.py [--changes N --keys K]
[--format avro]``).

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

``--blackhole`` (``make bench-blackhole``) then reads the JSON topic again through a ``type: blackhole`` sink (a
database of its own for the ledger, the same Spark session, warm by then) and prints its changes/s next to the
mirror's: everything the engine does (read, decode, the executor pass, the ledger) without a target to write.

``--format avro`` then does steps 2-5 again with the same changes in Avro, as Debezium's AvroConverter writes them
(Confluent wire format, schemas registered in the stack's schema registry, or ``--schema-registry-url``, or an
Apicurio Registry started for the run), into a topic and a database of their own, and prints both formats side by
side with the decoder's own cost: rows/s of :func:`~cdcsync.sources.debezium.dispatch.decode_batches` on one core
(CPU time, no Spark) over the same messages in Kafka-shaped Arrow batches, as ``benchmarks/decode.py`` measures it.
Both pipelines share one Spark session; JSON runs first and so also pays the session's first-batch warm-up (seconds:
small against 1M changes, but it dominates a small ``--changes`` run).

Prints its figures; asserts only correctness.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.common import Scratch, add_service_arguments, bench_services, machine_line
from benchmarks.decode import apicurio_registry, decoder_seconds
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.settings import load_settings
from cdcsync.config.types import parse_pg_type
from cdcsync.devstack import workload
from cdcsync.runtime.spark import build_spark_session
from cdcsync.runtime.stream import PipelineRunner
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess
from cdcsync.sources.debezium.spec import DecodeSpec


@dataclass
class FormatRun:
    """One format's end-to-end run and its decoder-only figure."""

    name: str
    events: list[workload.ChangeEvent]
    messages: int = 0
    produce_s: float = 0.0
    total_s: float = 0.0
    streaming_s: float = 0.0
    batches: int = 0
    dsn: str = ""
    decode_cpu_s: float = 0.0

    @property
    def bytes_per_change(self) -> float:
        values = [len(e.value) for e in self.events if e.value is not None]
        return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument(
        "--format",
        choices=("json", "avro"),
        default="json",
        help="avro: the same changes again in Avro, printed side by side with JSON (default: json only)",
    )
    parser.add_argument(
        "--blackhole", action="store_true", help="also run the JSON changes into a blackhole sink: the engine's ceiling"
    )
    add_service_arguments(parser)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdcsync-bench-")))
        services = stack.enter_context(bench_services(args, tmp))
        registry_url = stack.enter_context(_registry(args.format, services.schema_registry_url))
        scratch = stack.enter_context(Scratch(services))
        topics = {"json": scratch.topic()}
        if args.format == "avro":
            topics["avro"] = scratch.topic("bench.public.orders_avro")
        run(args, tmp, scratch, registry_url, topics)


@contextlib.contextmanager
def _registry(fmt: str, given: str) -> Iterator[str]:
    """The schema registry for Avro: the services' own, else an Apicurio Registry of its own."""
    if fmt != "avro" or given:
        yield given
        return
    with apicurio_registry() as url:
        yield url


def run(args: argparse.Namespace, root: Path, scratch: Scratch, registry_url: str, topics: dict[str, str]) -> None:
    import psycopg

    bootstrap = scratch.bootstrap

    t0 = time.perf_counter()
    load = workload.generate(args.changes, args.keys, seed=1, wrapped=False)
    generated = time.perf_counter() - t0
    print(
        f"generated {load.changes:,} changes over {args.keys:,} keys in {generated:.1f}s "
        f"({load.counts['c']:,} inserts, {load.counts['u']:,} updates, {load.counts['d']:,} deletes, "
        f"{load.counts['tombstone']:,} tombstones)",
        flush=True,
    )
    runs = [FormatRun("json", load.events)]
    if args.format == "avro":
        t0 = time.perf_counter()
        avro_events = workload.to_avro(load.events, *workload.register_avro_schemas(registry_url, topics["avro"]))
        print(f"re-encoded them in Avro in {time.perf_counter() - t0:.1f}s", flush=True)
        runs.append(FormatRun("avro", avro_events))
    for one in runs:
        t0 = time.perf_counter()
        one.messages = workload.produce(bootstrap, topics[one.name], one.events, partitions=4)
        one.produce_s = time.perf_counter() - t0
        print(f"{one.name}: produced {one.messages:,} messages in {one.produce_s:.1f}s", flush=True)

    spark_settings = load_settings(kafka__bootstrap_servers=bootstrap, state_dir=root / "state")
    t0 = time.perf_counter()
    spark = build_spark_session(spark_settings, "cdcsync-bench")
    spark_start = time.perf_counter() - t0
    try:
        for one in runs:
            mirror(one, args, root, scratch, registry_url, topics[one.name], load, spark)
        if args.blackhole:
            ceiling = FormatRun("blackhole", load.events, messages=runs[0].messages)
            sink = {"type": "blackhole", "from": "orders"}
            mirror(ceiling, args, root, scratch, registry_url, topics["json"], load, spark, sink)
    finally:
        spark.stop()

    columns = list(load.columns)
    quoted = ", ".join(f'"{c}"' for c in columns)
    for one in runs:
        with psycopg.connect(one.dsn) as conn:
            rows = {r[0]: dict(zip(columns, r, strict=True)) for r in conn.execute(f"SELECT {quoted} FROM app.orders")}
        assert rows == load.expected, f"{one.name}: the mirror does not equal the expected final state"
    with psycopg.connect(runs[0].dsn) as conn:
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

    pg_columns = tuple((name, parse_pg_type(text)) for name, text in load.columns.items())
    for one in runs:
        spec = (
            DecodeSpec("orders", pg_columns, workload.ORDERS_PRIMARY_KEY)
            if one.name == "json"
            else DecodeSpec(
                "orders",
                pg_columns,
                workload.ORDERS_PRIMARY_KEY,
                format="avro",
                schema_registry=SchemaRegistryAccess(registry_url),
            )
        )
        one.decode_cpu_s = decoder_seconds(one.events, spec, batch=10_000, repeat=1)

    first = runs[0]
    print()
    print(machine_line())
    print(f"spark session start:            {spark_start:8.1f} s")
    print(f"run --available-now (all):      {first.total_s:8.1f} s  ({first.batches} micro-batches)")
    print(f"first batch start -> catch-up:  {first.streaming_s:8.1f} s")
    rate = load.changes / first.streaming_s
    print(f"end-to-end throughput:          {rate:8,.0f} changes/s  ({load.changes:,} changes)")
    print(
        f"                                {first.messages / first.streaming_s:8,.0f} messages/s "
        f"({first.messages:,} with tombstones)"
    )
    print(f"final rows:                     {len(load.expected):8,}")
    print(f"plain COPY of the final rows:   {copy_seconds:8.2f} s  ({len(load.expected) / copy_seconds:,.0f} rows/s)")
    print(f"pipeline time / COPY time:      {first.streaming_s / copy_seconds:8.1f} x")
    if len(runs) > 1:
        print_side_by_side(runs, load.changes)
    if args.blackhole:
        print(
            f"blackhole sink (engine ceiling):{load.changes / ceiling.streaming_s:8,.0f} changes/s  "
            f"({ceiling.streaming_s:.1f} s, {ceiling.batches} micro-batches; the mirror: {rate:,.0f} changes/s)"
        )
    print("mirror verified equal to the expected final state" + (" in both formats" if len(runs) > 1 else ""))


def mirror(
    one: FormatRun,
    args: argparse.Namespace,
    root: Path,
    scratch: Scratch,
    registry_url: str,
    topic: str,
    load: workload.Workload,
    spark: Any,
    sink: dict[str, Any] | None = None,
) -> None:
    """Migrations into a fresh database, then the pipeline ``--available-now`` (into a mirror, or ``sink``),
    timed."""
    import psycopg

    from cdcsync import migrations
    from cdcsync.migrations import POSTGRES

    one.dsn = scratch.database()
    source: dict[str, Any] = {
        "type": "kafka",
        "topic": topic,
        "format": "avro" if one.name == "avro" else "json",
        "primary_key": "id",
        "columns": dict(load.columns),
    }
    if args.max_offsets_per_trigger:
        source["max_offsets_per_trigger"] = args.max_offsets_per_trigger
    pipeline = validate_pipeline_dict(
        {
            "name": f"bench_{one.name}",
            "sources": {"orders": source},
            "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}}
            if sink is None
            else {sink["type"]: sink},
        }
    )
    settings = load_settings(
        postgres__dsn=one.dsn,
        kafka__bootstrap_servers=scratch.bootstrap,
        schema_registry__url=registry_url or None,
        state_dir=root / "state" / one.name,
        migrations_dir=root / "migrations" / one.name,
    )
    migrations.init(POSTGRES, pipeline, settings.migrations_dir)
    with psycopg.connect(one.dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, settings.migrations_dir)
    t0 = time.perf_counter()
    snapshot = PipelineRunner(pipeline, settings, available_now=True).run(spark)
    one.total_s = time.perf_counter() - t0
    stats = snapshot.sources["orders"]
    assert stats.first_batch_at is not None and stats.last_batch_done_at is not None
    one.streaming_s = stats.last_batch_done_at - stats.first_batch_at
    one.batches = stats.batches
    done = "mirrored" if sink is None else f"through a {sink['type']} sink"
    print(f"{one.name}: {done} in {one.streaming_s:.1f}s ({one.batches} micro-batches)", flush=True)


def print_side_by_side(runs: Sequence[FormatRun], changes: int) -> None:
    print()
    print(f"{'':34}" + "".join(f"{one.name:>14}" for one in runs))
    lines = [
        ("bytes per change", lambda one: f"{one.bytes_per_change:,.0f}"),
        ("end-to-end changes/s", lambda one: f"{changes / one.streaming_s:,.0f}"),
        ("first batch -> catch-up (s)", lambda one: f"{one.streaming_s:,.1f}"),
        ("decode alone, 1 core (rows/s)", lambda one: f"{changes / one.decode_cpu_s:,.0f}"),
        ("decode CPU per change (us)", lambda one: f"{one.decode_cpu_s / changes * 1e6:,.2f}"),
    ]
    for label, value in lines:
        print(f"{label:34}" + "".join(f"{value(one):>14}" for one in runs))


if __name__ == "__main__":
    main()
