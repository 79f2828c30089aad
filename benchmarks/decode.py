"""Debezium JSON and Avro decoding throughput on one core: ``python benchmarks/decode.py [--changes N]``.

Generates the synthetic orders changelog in both JsonConverter shapes, slices it into Kafka-shaped Arrow batches
of Spark's default ``spark.sql.execution.arrow.maxRecordsPerBatch`` (10,000 rows) and times
:func:`cdcsync.sources.debezium.dispatch.decode_batches` over them, as ``mapInArrow`` calls it on an executor. Times are
process CPU time (best of ``--repeat``), so a busy machine skews them less than wall-clock time would. For scale,
it also prints how fast the JSON parser alone gets through the same messages (the decoder parses a repeated
Connect schema only once, so with the schema wrapper it can beat that line).

The Avro figures decode the same changes re-encoded as Debezium's AvroConverter writes them (Confluent wire
format; ``amount`` as Connect ``Decimal`` bytes), with the writer schemas in the dev stack's Apicurio
Registry, started for the run (fetched once, then cached, as on an executor); fastavro's ``schemaless_reader``
alone is the scale line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from cdcsync.config.types import parse_pg_type
from cdcsync.devstack.workload import (
    ORDERS_AVRO_VALUE_SCHEMA,
    ORDERS_COLUMNS,
    ORDERS_PRIMARY_KEY,
    ChangeEvent,
    generate,
    register_avro_schemas,
    to_avro,
    to_kafka_batch,
)
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess
from cdcsync.sources.debezium.dispatch import decode_batches
from cdcsync.sources.debezium.spec import DecodeSpec


def best_cpu_seconds(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def decoder_seconds(events: Sequence[ChangeEvent], spec: DecodeSpec, *, batch: int, repeat: int) -> float:
    """Best CPU seconds of :func:`decode_batches` over ``events`` in Kafka-shaped Arrow batches of ``batch`` rows,
    as ``mapInArrow`` calls it on one executor core; first checks that every message decodes to one row."""
    batches = [to_kafka_batch(events[i : i + batch]) for i in range(0, len(events), batch)]
    changes = len(events)  # a tombstone decodes to a row too: the delete of its key
    decoded = list(decode_batches(iter(batches), spec))
    rows = sum(out.num_rows for out in decoded)
    dead = sum(out.num_rows - out.column("_dlq_reason").null_count for out in decoded)
    assert rows == changes and not dead, f"{rows} rows ({dead} dead letters) from {changes} changes"

    def decode_all() -> None:
        for _ in decode_batches(iter(batches), spec):
            pass

    return best_cpu_seconds(decode_all, repeat)


@contextlib.contextmanager
def apicurio_registry() -> Iterator[str]:
    """The dev stack's Apicurio Registry on a free port in a temporary state dir: its Confluent-compatible URL."""
    import socket

    from cdcsync.devstack import DevStackConfig
    from cdcsync.devstack.apicurio import ApicurioRegistry

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with tempfile.TemporaryDirectory(prefix="cdcsync-bench-registry-") as state:
        registry = ApicurioRegistry(DevStackConfig(state_dir=Path(state), schema_registry_port=port))
        registry.start()
        try:
            registry.wait_ready(180)
            yield registry.address
        finally:
            registry.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=10_000, help="rows per Arrow batch")
    parser.add_argument("--repeat", type=int, default=5, help="best of N runs")
    args = parser.parse_args()

    loads: Callable[[bytes], Any]
    try:
        import orjson

        loads = orjson.loads
        parser_name = f"orjson {orjson.__version__}"
    except ImportError:
        import json

        loads = json.loads
        parser_name = "stdlib json"
    columns = tuple((name, parse_pg_type(text)) for name, text in ORDERS_COLUMNS.items())
    print(
        f"decoding {args.changes:,} changes over {args.keys:,} keys of orders({', '.join(ORDERS_COLUMNS)}), "
        f"batches of {args.batch:,}, {parser_name}, Python {sys.version.split()[0]}; CPU time, best of {args.repeat}"
    )
    for wrapped in (False, True):
        workload = generate(args.changes, args.keys, seed=42, wrapped=wrapped)
        events = workload.events
        values = [e.value for e in events if e.value is not None]
        shape = "schema+payload" if wrapped else "plain payload"
        size = sum(len(v) for v in values) / len(values)
        print(f"\n{shape}: {len(events):,} messages ({len(values):,} changes + tombstones), {size:,.0f} B/change")

        def parse_only(values: list[bytes] = values) -> None:
            for value in values:
                loads(value)

        seconds = best_cpu_seconds(parse_only, args.repeat)
        print(f"  {'orjson.loads of each message':28} {len(values) / seconds:>10,.0f} changes/s")
        for key_mode, primary_key in (("declared primary key", ORDERS_PRIMARY_KEY), ("key from message key", None)):
            spec = DecodeSpec("orders", columns, primary_key)
            seconds = decoder_seconds(events, spec, batch=args.batch, repeat=args.repeat)
            print(
                f"  {'decode, ' + key_mode:28} {len(events) / seconds:>10,.0f} msgs/s "
                f"({len(values) / seconds:,.0f} changes/s, {seconds / len(values) * 1e6:.2f} us/change)"
            )
        if not wrapped:
            avro_benchmark(args, columns, events)


def avro_benchmark(args: argparse.Namespace, columns: tuple[Any, ...], json_events: list[ChangeEvent]) -> None:
    import fastavro

    with apicurio_registry() as url:
        events = to_avro(json_events, *register_avro_schemas(url, "shop.public.orders"))
        values = [e.value for e in events if e.value is not None]
        size = sum(len(v) for v in values) / len(values)
        print(f"\navro (Confluent wire format): {len(events):,} messages, {size:,.0f} B/change")
        parsed = fastavro.parse_schema(ORDERS_AVRO_VALUE_SCHEMA)

        def read_only(values: list[bytes] = values) -> None:
            for value in values:
                stream = io.BytesIO(value)
                stream.seek(5)
                fastavro.schemaless_reader(stream, parsed, None)

        seconds = best_cpu_seconds(read_only, args.repeat)
        print(f"  {'fastavro read of each message':28} {len(values) / seconds:>10,.0f} changes/s")
        registry = SchemaRegistryAccess(url)
        for key_mode, primary_key in (("declared primary key", ORDERS_PRIMARY_KEY), ("key from message key", None)):
            spec = DecodeSpec("orders", columns, primary_key, format="avro", schema_registry=registry)
            seconds = decoder_seconds(events, spec, batch=args.batch, repeat=args.repeat)
            print(
                f"  {'decode, ' + key_mode:28} {len(events) / seconds:>10,.0f} msgs/s "
                f"({len(values) / seconds:,.0f} changes/s, {seconds / len(values) * 1e6:.2f} us/change)"
            )


if __name__ == "__main__":
    main()
