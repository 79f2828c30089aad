"""Debezium JSON decoding throughput on one core: ``python benchmarks/decode.py [--changes N]``.

Generates the synthetic orders changelog (both JsonConverter shapes), slices it into Kafka-shaped Arrow batches
of Spark's default ``spark.sql.execution.arrow.maxRecordsPerBatch`` (10,000 rows) and times
:func:`cdcsync.sources.debezium.decode_batches` over them, as ``mapInArrow`` would call it. Prints messages/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from cdcsync.config.types import parse_pg_type  # noqa: E402
from cdcsync.devstack.workload import ORDERS_COLUMNS, ORDERS_PRIMARY_KEY, generate, to_kafka_batch  # noqa: E402
from cdcsync.sources.debezium import DecodeSpec, decode_batches  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    args = parser.parse_args()

    columns = tuple((name, parse_pg_type(text)) for name, text in ORDERS_COLUMNS.items())
    try:
        import orjson

        parser_name = f"orjson {orjson.__version__}"
    except ImportError:
        parser_name = "stdlib json"
    print(f"decoding {args.changes:,} changes over {args.keys:,} keys, batches of {args.batch:,}, {parser_name}")
    for wrapped in (False, True):
        workload = generate(args.changes, args.keys, seed=42, wrapped=wrapped)
        events = workload.events
        batches = [to_kafka_batch(events[i : i + args.batch]) for i in range(0, len(events), args.batch)]
        size = sum(len(e.value or b"") for e in events) / len(events)
        for key_mode, primary_key in (("declared key", ORDERS_PRIMARY_KEY), ("key from message", None)):
            spec = DecodeSpec("orders", columns, primary_key)
            best = float("inf")
            rows = 0
            for _ in range(args.repeat):
                started = time.process_time()
                rows = sum(out.num_rows for out in decode_batches(iter(batches), spec))
                best = min(best, time.process_time() - started)
            shape = "schema+payload" if wrapped else "plain payload "
            print(
                f"{shape} ({size:,.0f} B/msg avg), {key_mode:16}: {len(events) / best:10,.0f} msgs/s "
                f"({len(events):,} messages -> {rows:,} rows in {best:.2f}s)"
            )


if __name__ == "__main__":
    main()
