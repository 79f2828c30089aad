"""The Python workers' part of a micro-batch, without Spark or Postgres: ``python benchmarks/worker_path.py
[--changes N --keys K] [--batch-changes B] [--wrapped] [--repeat R] [--profile FILE]``.

What a ``mapInArrow`` task of ``make bench``'s mirror does on an executor, in one process and on CPU time: the
pickled :class:`~cdcsync.engine.batch.StageTask` unpickled (PySpark does that per task), the partition's Kafka rows
decoded (:class:`~cdcsync.sources.kafka.DecodeTask`), collapsed and written as COPY text
(:class:`~cdcsync.sinks.postgres.StageWriter`; its connection is a stand-in that takes the bytes and holds no
stored row), then the full garbage collection that PySpark's reused workers run after every task. The changes are
cut into micro-batches of ``--batch-changes`` messages (the bench's ``maxOffsetsPerTrigger`` is 500,000; the
latency benchmark's batches hold ~14,000) and each micro-batch into one task per partition, in Arrow batches of
Spark's ``maxRecordsPerBatch``.

Prints process CPU seconds per 1M changes (best of ``--repeat``) and per task, so that both the per-change and the
per-task cost show: the figure to compare before and after a change to the workers, on a shared machine too.
``--profile`` writes cProfile's statistics of one more pass.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from cdcsync.config.load import validate_pipeline_dict
from cdcsync.devstack import workload
from cdcsync.engine.batch import StageTask, writer_for
from cdcsync.sinks import postgres as postgres_sink
from cdcsync.sinks.postgres import PostgresUpsertSink
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.debezium.wrappers import CUT_COLUMNS, PAYLOAD_MARK, WRAPPED_PREFIX
from cdcsync.sources.kafka import DecodeTask

RECORDS_PER_ARROW_BATCH = 20_000  # spark.sql.execution.arrow.maxRecordsPerBatch (cdcsync.runtime.spark)


class _Copy:
    def __init__(self, sink: list[int]) -> None:
        self.sink = sink

    def __enter__(self) -> _Copy:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def write(self, data: bytes) -> None:
        self.sink.append(len(data))


class _Cursor(_Copy):
    def copy(self, sql: str) -> _Copy:
        return _Copy(self.sink)

    def execute(self, sql: str, params: Any = None) -> _Cursor:
        return self

    def fetchall(self) -> list[Any]:
        return []  # no stored row: a lone tombstone is dropped


class _Connection(_Cursor):
    def transaction(self) -> _Copy:
        return _Copy(self.sink)

    def cursor(self) -> _Cursor:
        return _Cursor(self.sink)


def _cut(batch: Any, wrapper: bytes) -> Any:
    """What :func:`cdcsync.sources.kafka.decoder_input` hands over with one known wrapper: the payloads alone."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    for column, wrapper_column in CUT_COLUMNS:
        if column == "key":
            continue
        values = batch.column(names.index(column))
        hit = pc.fill_null(pc.and_(pc.starts_with(values, wrapper.decode()), pc.ends_with(values, "}")), False)
        payloads = pc.if_else(hit, pc.binary_slice(values, len(wrapper), -1), values)
        batch = batch.set_column(names.index(column), column, payloads)
        batch = batch.append_column(
            wrapper_column, pc.if_else(hit, pa.scalar(0, pa.int32()), pa.scalar(None, pa.int32()))
        )
        names = batch.schema.names
    return batch


def tasks_of(events: list[Any], batch_changes: int, partitions: int, wrapper: bytes | None) -> list[list[Any]]:
    """Each micro-batch's tasks: a partition's messages in Arrow batches of Spark's size."""
    import pyarrow as pa
    import pyarrow.compute as pc

    everything = workload.to_kafka_batch(events, partitions=partitions)
    everything = everything.append_column("new_key", pa.nulls(everything.num_rows, pa.binary()))
    tasks = []
    for start in range(0, everything.num_rows, batch_changes):
        micro = everything.slice(start, batch_changes)
        for partition in range(partitions):
            rows = micro.filter(pc.equal(micro.column("partition"), partition))
            if wrapper is not None:
                rows = _cut(rows, wrapper)
            tasks.append(
                [rows.slice(i, RECORDS_PER_ARROW_BATCH) for i in range(0, rows.num_rows, RECORDS_PER_ARROW_BATCH)]
            )
    return tasks


def main() -> None:
    import pickle

    import pyarrow as pa
    from pyspark import cloudpickle  # what PySpark pickles a mapInArrow function with

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=40_000)
    parser.add_argument("--batch-changes", type=int, default=500_000, help="messages per micro-batch")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--wrapped", action="store_true", help="JsonConverter's schema+payload, cut as on the JVM")
    parser.add_argument("--repeat", type=int, default=5, help="best of N passes")
    parser.add_argument("--profile", help="write cProfile statistics of one more pass here")
    args = parser.parse_args()

    load = workload.generate(args.changes, args.keys, seed=42, wrapped=args.wrapped)
    pipeline = validate_pipeline_dict(
        {
            "name": "bench_workers",
            "sources": {
                "orders": {
                    "type": "kafka",
                    "topic": "shop.public.orders",
                    "format": "json",
                    "primary_key": "id",
                    "columns": dict(workload.ORDERS_COLUMNS),
                }
            },
            "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}},
        }
    )
    sink = PostgresUpsertSink(pipeline, "mirror", pipeline.sinks["mirror"], "postgresql://nowhere/none")
    spec = DecodeSpec.from_source("orders", pipeline.sources["orders"], None, ())
    wrapper = None
    if args.wrapped:
        first = next(e.value for e in load.events if e.value is not None)
        wrapper = first[: first.index(PAYLOAD_MARK) + len(PAYLOAD_MARK)]
        assert first.startswith(WRAPPED_PREFIX)
    task = StageTask(DecodeTask(spec, None, wrappers=(wrapper,) if wrapper else ()), (writer_for(sink, 7, "bench"),))
    pickled = cloudpickle.dumps(task)
    tasks = tasks_of(load.events, args.batch_changes, args.partitions, wrapper)
    messages = sum(e.value is not None or e.key is not None for e in load.events)
    del load  # a worker holds no generated changes: the collection after each task should not walk them
    gc.collect()
    os.environ["SPARK_REUSE_WORKER"] = "1"  # as in a reused PySpark worker (cdcsync.core.worker_heap)
    copied: list[int] = []
    postgres_sink.reused_connection = lambda dsn: contextlib.nullcontext(_Connection(copied))  # type: ignore[assignment]

    def one_pass() -> int:
        staged = 0
        copied.clear()
        for batches in tasks:
            run = pickle.loads(pickled)
            for counts in run(iter(batches)):
                assert counts.column("report").null_count == counts.num_rows, counts.column("report")
                staged += pa.compute.sum(counts.column("rows")).as_py() or 0
            del run
            gc.collect()  # what a reused PySpark worker does after each task (pyspark/daemon.py)
        return staged

    staged = one_pass()  # warm: the plan, the schemas
    best = float("inf")
    for _ in range(args.repeat):
        started = time.process_time()
        one_pass()
        best = min(best, time.process_time() - started)
    print(
        f"{args.changes:,} changes ({messages:,} messages{', wrapped' if args.wrapped else ''}) over "
        f"{args.keys:,} keys, micro-batches of {args.batch_changes:,} messages: {len(tasks)} tasks, "
        f"{staged:,} rows staged, {sum(copied) / 1e6:.1f} MB of COPY text per pass"
    )
    print(
        f"worker path: {best:.3f} CPU s per pass (best of {args.repeat}), {best / args.changes * 1e6:.2f} CPU s per "
        f"1M changes, {best / len(tasks) * 1e3:.2f} ms per task; task pickle {len(pickled):,} B"
    )
    unpickle = min(_timed(lambda: pickle.loads(pickled), 200) for _ in range(3))
    print(f"unpickling the task: {unpickle * 1e3:.3f} ms")
    if args.profile:
        import cProfile

        cProfile.runctx("one_pass()", globals(), {"one_pass": one_pass}, args.profile)


def _timed(run: Any, times: int) -> float:
    started = time.process_time()
    for _ in range(times):
        run()
    return (time.process_time() - started) / times


if __name__ == "__main__":
    main()
