"""Debezium JSON and Avro decoding throughput on one core: ``python benchmarks/decode.py [--changes N]``.

Generates the synthetic orders changelog in both JsonConverter shapes, slices it into Kafka-shaped Arrow batches
of Spark's default ``spark.sql.execution.arrow.maxRecordsPerBatch`` (10,000 rows) and times
:func:`cdcsync.sources.debezium.decode_batches` over them, as ``mapInArrow`` calls it on an executor. Times are
process CPU time (best of ``--repeat``), so a busy machine skews them less than wall-clock time would. For scale,
it also prints how fast the JSON parser alone gets through the same messages (the decoder parses a repeated
Connect schema only once, so with the schema wrapper it can beat that line).

The Avro figures decode the same changes re-encoded as Debezium's AvroConverter writes them (Confluent wire
format; ``amount`` as Connect ``Decimal`` bytes), with the writer schemas in an in-process schema registry
stand-in (fetched once, then cached, as on an executor); fastavro's ``schemaless_reader`` alone is the scale line.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from cdcsync.config.types import parse_pg_type
from cdcsync.devstack.workload import ORDERS_COLUMNS, ORDERS_PRIMARY_KEY, ChangeEvent, generate, to_kafka_batch
from cdcsync.sources.avro import SchemaRegistryAccess
from cdcsync.sources.debezium import DecodeSpec, decode_batches

_OPTIONAL_LONG = ["null", "long"]
_OPTIONAL_STRING = ["null", "string"]
AVRO_KEY_SCHEMA = {
    "type": "record",
    "name": "Key",
    "namespace": "shop.public.orders",
    "fields": [{"name": "id", "type": "long"}],
    "connect.name": "shop.public.orders.Key",
}
AVRO_ROW_SCHEMA = {
    "type": "record",
    "name": "Value",
    "namespace": "shop.public.orders",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer_id", "type": _OPTIONAL_LONG, "default": None},
        {
            "name": "amount",
            "type": [
                "null",
                {
                    "type": "bytes",
                    "scale": 2,
                    "precision": 12,
                    "connect.version": 1,
                    "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"},
                    "connect.name": "org.apache.kafka.connect.data.Decimal",
                    "logicalType": "decimal",
                },
            ],
            "default": None,
        },
        {"name": "status", "type": _OPTIONAL_STRING, "default": None},
        {"name": "Note", "type": _OPTIONAL_STRING, "default": None},
        {
            "name": "updated_at",
            "type": [
                "null",
                {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"},
            ],
            "default": None,
        },
    ],
    "connect.name": "shop.public.orders.Value",
}
AVRO_ENVELOPE_SCHEMA = {
    "type": "record",
    "name": "Envelope",
    "namespace": "shop.public.orders",
    "fields": [
        {"name": "before", "type": ["null", AVRO_ROW_SCHEMA], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.postgresql",
                "fields": [
                    {"name": "version", "type": "string"},
                    {"name": "connector", "type": "string"},
                    {"name": "name", "type": "string"},
                    {"name": "ts_ms", "type": "long"},
                    {"name": "snapshot", "type": _OPTIONAL_STRING, "default": None},
                    {"name": "db", "type": "string"},
                    {"name": "sequence", "type": _OPTIONAL_STRING, "default": None},
                    {"name": "schema", "type": "string"},
                    {"name": "table", "type": "string"},
                    {"name": "txId", "type": _OPTIONAL_LONG, "default": None},
                    {"name": "lsn", "type": _OPTIONAL_LONG, "default": None},
                    {"name": "xmin", "type": _OPTIONAL_LONG, "default": None},
                ],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": _OPTIONAL_LONG, "default": None},
        {"name": "transaction", "type": ["null", "string"], "default": None},
    ],
    "connect.name": "shop.public.orders.Envelope",
}


def to_avro(events: list[ChangeEvent], key_id: int, value_id: int) -> list[ChangeEvent]:
    """The plain-payload JSON events re-encoded in the Confluent Avro wire format (exact decimals kept)."""
    import fastavro

    key_schema = fastavro.parse_schema(AVRO_KEY_SCHEMA)
    value_schema = fastavro.parse_schema(AVRO_ENVELOPE_SCHEMA)

    def encode(schema_id: int, schema: Any, record: Any) -> bytes:
        out = io.BytesIO()
        out.write(b"\0" + schema_id.to_bytes(4, "big"))
        fastavro.schemaless_writer(out, schema, record)
        return out.getvalue()

    converted = []
    for event in events:
        key = encode(key_id, key_schema, json.loads(event.key)) if event.key is not None else None
        value = None
        if event.value is not None:
            payload = json.loads(event.value, parse_float=Decimal)
            payload["transaction"] = None
            value = encode(value_id, value_schema, payload)
        converted.append(ChangeEvent(key=key, value=value, id=event.id, op=event.op, lsn=event.lsn))
    return converted


def best_cpu_seconds(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


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
        batches = [to_kafka_batch(events[i : i + args.batch]) for i in range(0, len(events), args.batch)]
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
            rows = sum(out.num_rows for out in decode_batches(iter(batches), spec))
            assert rows == len(values), "every change decodes to one row"

            def decode_all(spec: DecodeSpec = spec, batches: list[Any] = batches) -> None:
                for _ in decode_batches(iter(batches), spec):
                    pass

            seconds = best_cpu_seconds(decode_all, args.repeat)
            print(
                f"  {'decode, ' + key_mode:28} {len(events) / seconds:>10,.0f} msgs/s "
                f"({len(values) / seconds:,.0f} changes/s, {seconds / len(values) * 1e6:.2f} us/change)"
            )
        if not wrapped:
            avro_benchmark(args, columns, events)


def avro_benchmark(args: argparse.Namespace, columns: tuple[Any, ...], json_events: list[ChangeEvent]) -> None:
    import fastavro
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from cdcsync.devstack.schema_registry import SchemaRegistryServer

    with tempfile.TemporaryDirectory(prefix="cdcsync-bench-registry-") as state:
        server = SchemaRegistryServer(0, Path(state) / "schemas.json", log_requests=False)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            client = SchemaRegistryClient({"url": server.url})
            key_id = client.register_schema("shop.public.orders-key", Schema(json.dumps(AVRO_KEY_SCHEMA), "AVRO"))
            value_id = client.register_schema(
                "shop.public.orders-value", Schema(json.dumps(AVRO_ENVELOPE_SCHEMA), "AVRO")
            )
            events = to_avro(json_events, key_id, value_id)
            values = [e.value for e in events if e.value is not None]
            batches = [to_kafka_batch(events[i : i + args.batch]) for i in range(0, len(events), args.batch)]
            size = sum(len(v) for v in values) / len(values)
            print(f"\navro (Confluent wire format): {len(events):,} messages, {size:,.0f} B/change")
            parsed = fastavro.parse_schema(AVRO_ENVELOPE_SCHEMA)

            def read_only(values: list[bytes] = values) -> None:
                for value in values:
                    stream = io.BytesIO(value)
                    stream.seek(5)
                    fastavro.schemaless_reader(stream, parsed, None)

            seconds = best_cpu_seconds(read_only, args.repeat)
            print(f"  {'fastavro read of each message':28} {len(values) / seconds:>10,.0f} changes/s")
            registry = SchemaRegistryAccess(server.url)
            for key_mode, primary_key in (("declared primary key", ORDERS_PRIMARY_KEY), ("key from message key", None)):
                spec = DecodeSpec("orders", columns, primary_key, format="avro", schema_registry=registry)
                decoded = [out for out in decode_batches(iter(batches), spec)]
                rows = sum(out.num_rows for out in decoded)
                dead = sum(out.column("_dlq_reason").null_count != out.num_rows for out in decoded)
                assert rows == len(values) and not dead, "every change decodes to one row"

                def decode_all(spec: DecodeSpec = spec, batches: list[Any] = batches) -> None:
                    for _ in decode_batches(iter(batches), spec):
                        pass

                seconds = best_cpu_seconds(decode_all, args.repeat)
                print(
                    f"  {'decode, ' + key_mode:28} {len(events) / seconds:>10,.0f} msgs/s "
                    f"({len(values) / seconds:,.0f} changes/s, {seconds / len(values) * 1e6:.2f} us/change)"
                )
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
