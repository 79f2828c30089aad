"""One executor task's CPU, phase by phase: ``python benchmarks/task_cpu.py --bootstrap HOST:PORT [--changes N
--keys K] [--wrapped] [--repeat R]``.

What a staging task does with its partition range, in this process and without Spark, each phase timed apart:

1. **read**: librdkafka fetches the range and the task builds the decoder's Arrow batches from it
   (:class:`~cdcsync.sources.kafka_fetch.KafkaFetch`, as a task of ``cdcsync run`` reads); timed as process CPU
   (librdkafka's own threads included) and as the task thread's CPU, of which building the batches apart;
2. **decode** (:class:`~cdcsync.sources.kafka.DecodeTask`, declared primary key, no dead letters);
3. **collapse** to the newest change per key (:func:`~cdcsync.sinks.postgres.newest_per_key`);
4. **CSV** for the staging COPY (the COPY itself is Postgres's time, not the task's).

It produces ``make bench``'s changes (bare JSON, or ``--wrapped``: JsonConverter's schema+payload) into a fresh
one-partition topic, deleted afterwards, and prints microseconds of CPU per Kafka message for each phase, the
best of ``--repeat`` reads. Where ``benchmarks/cpu_split.py`` says which process spends a run's CPU, this says
which part of a worker's share is which.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.common import delete_topics, machine_line
from cdcsync.config.types import parse_pg_type
from cdcsync.devstack import workload
from cdcsync.devstack.workload import ORDERS_COLUMNS, ORDERS_PRIMARY_KEY
from cdcsync.sinks.postgres import _to_csv, newest_per_key
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.kafka import DecodeTask, message_wrappers
from cdcsync.sources.kafka_fetch import KafkaFetch, PartitionRange


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="a running broker, e.g. the dev stack's 127.0.0.1:19092")
    parser.add_argument("--changes", type=int, default=250_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--wrapped", action="store_true", help="schema-wrapped JSON (JsonConverter's default)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    load = workload.generate(args.changes, args.keys, seed=3, wrapped=args.wrapped)
    topic = f"bench.task_cpu_{uuid.uuid4().hex[:8]}"
    try:
        messages = workload.produce(args.bootstrap, topic, load.events, partitions=1)
        profile(args, load.events, topic, messages)
    finally:
        delete_topics(args.bootstrap, [topic])


def profile(args: argparse.Namespace, events: list[workload.ChangeEvent], topic: str, messages: int) -> None:
    import pyarrow as pa

    columns = tuple((name, parse_pg_type(text)) for name, text in ORDERS_COLUMNS.items())
    spec = DecodeSpec("orders", columns, ORDERS_PRIMARY_KEY)
    wrappers: tuple[bytes, ...] = ()
    if args.wrapped:  # what the driver learns from a batch's first message (sources.kafka.KnownWrappers)
        first = next(e for e in events if e.value is not None)
        wrappers = tuple(dict.fromkeys(message_wrappers([first.value, first.key])))
    config = {"bootstrap.servers": args.bootstrap, "group.id": "cdcsync-task-cpu", "enable.auto.commit": "false"}
    fetch = BatchTimed(config=tuple(config.items()), wrappers=wrappers)
    part = PartitionRange(topic, 0, 0, messages)

    decode = DecodeTask(spec, None, wrappers=wrappers)
    names = tuple(name for name, _ in columns)
    phases: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        fetch.spent[0] = 0.0
        batches, read_s, read_thread_s = _cpu(lambda: list(fetch.read(part)))
        decoded, decode_s, _ = _cpu(lambda read: list(decode(iter(read))), batches)
        collapsed, collapse_s, _ = _cpu(newest_per_key, pa.Table.from_batches(decoded), ORDERS_PRIMARY_KEY, ())
        _, csv_s, _ = _cpu(_to_csv, collapsed, names, 1)
        for name, seconds in (
            ("read (process: librdkafka's threads included)", read_s),
            ("  the task's thread", read_thread_s),
            ("  of which building the Arrow batches", fetch.spent[0]),
            ("decode", decode_s),
            ("collapse to the newest change per key", collapse_s),
            ("CSV for the COPY", csv_s),
        ):
            phases.setdefault(name, []).append(seconds)

    size = sum(len(e.value) for e in events if e.value is not None) / max(1, sum(e.value is not None for e in events))
    shape = "schema-wrapped" if args.wrapped else "bare"
    print(machine_line())
    print(f"{messages:,} Kafka messages ({len(events):,} events, {shape} JSON, {size:,.0f} B a change), one partition")
    print(f"CPU microseconds per message, best of {args.repeat}:")
    for name, runs in phases.items():
        print(f"  {name:48} {min(runs) * 1e6 / messages:7.2f}")


def _cpu(work: Callable[..., Any], *args: Any) -> tuple[Any, float, float]:
    """``work(*args)``'s result, the process CPU it took (every thread's) and this thread's alone."""
    process, thread = time.process_time(), time.thread_time()
    result = work(*args)
    return result, time.process_time() - process, time.thread_time() - thread


@dataclass(frozen=True)
class BatchTimed(KafkaFetch):
    """The tasks' read, adding the thread CPU its batch building takes to ``spent[0]``."""

    spent: list[float] = field(default_factory=lambda: [0.0])

    def _batch(self, messages: list[Any]) -> Any:
        started = time.thread_time()
        try:
            return super()._batch(messages)
        finally:
            self.spent[0] += time.thread_time() - started


if __name__ == "__main__":
    main()
