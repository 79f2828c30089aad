"""cdcsync side by side with Debezium's JDBC sink connector: ``make bench-peer`` (or ``python
benchmarks/peer_jdbc_sink.py [--changes N --keys K --replays R --connect-port P]``).

1. starts a dev stack of its own unless ``--postgres-dsn`` and ``--bootstrap`` point at running services;
2. produces N Debezium changes over K keys (about 30% inserts, 60% updates, 10% deletes, a tombstone after each
   delete) as Kafka Connect's JsonConverter writes them by default, ``{"schema": ..., "payload": ...}``
   (``schemas.enable=true``, ~2.9 KB a change), into one fresh 4-partition topic; with ``--replays R``, R older
   changes of keys that changed again later are re-sent after the stream (same ``lsn``, as a connector restart
   or a producer retry re-sends them);
3. cdcsync: one Postgres mirror pipeline into a fresh database, ``run --available-now`` in-process;
4. Debezium's JDBC sink (``io.debezium:debezium-connector-jdbc``, its plugin tarball, see
   :mod:`benchmarks.jdbc_sink`) in a fresh Kafka Connect worker on ``--connect-port``, into another fresh database
   whose table is declared like cdcsync's mirror: ``insert.mode=upsert``, ``delete.enabled=true``,
   ``primary.key.mode=record_key``, ``tasks.max=4`` (one task per partition) and its best settings
   (``batch.size`` = the consumer's ``max.poll.records`` = ``--batch-size``, ``use.reduction.buffer=true``);
5. both timed the same way: from the first change read (cdcsync: the start of its first micro-batch; the sink: its
   consumer group stable with every partition assigned) to the target holding every change (cdcsync: the end of
   its last micro-batch; the sink: its committed offsets at the end of every partition, which it commits only for
   records it has written), and the whole wall time (cdcsync: Spark session start included; the sink: the Connect
   worker's start included);
6. checks both targets row by row against the source's final state and prints a side-by-side table with the ratio.
   With replays, the state a sink that applies changes in arrival order ends in (the replays applied over the
   source's state) is checked too: the table says which system ends equal to the source.

Prints its figures; raises only if a target equals neither state it may legitimately hold.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.common import (
    Scratch,
    add_service_arguments,
    bench_services,
    key_value,
    machine_line,
    prepare_pipeline,
    timed_run,
)
from cdcsync.devstack import workload

Row = dict[str, Any]
PARTITIONS = 4
DEFAULT_CONNECT_PORT = 28383
"""Clear of ``cdcsync dev up`` (18083), the test fixtures (28083) and the benchmark's own stack (283xx others)."""


# ------------------------------------------------------------------------------------------------- pure parts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=_positive, default=1_000_000, help="changes to produce (default 1M)")
    parser.add_argument("--keys", type=_positive, default=200_000, help="distinct keys (default 200k)")
    parser.add_argument(
        "--replays", type=_non_negative, default=0, help="older changes re-sent after the stream (default 0)"
    )
    parser.add_argument(
        "--batch-size",
        type=_positive,
        default=10_000,
        help="the JDBC sink's batch.size and its consumer's max.poll.records (default 10000)",
    )
    parser.add_argument(
        "--sink-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=key_value,
        help="an extra setting of the JDBC sink connector (repeatable; wins over the defaults)",
    )
    parser.add_argument(
        "--connect-port",
        type=_positive,
        default=DEFAULT_CONNECT_PORT,
        help=f"the benchmark's Kafka Connect REST port (default {DEFAULT_CONNECT_PORT})",
    )
    parser.add_argument(
        "--only", choices=("cdcsync", "jdbc"), help="run one system only (e.g. to profile it); no ratio then"
    )
    parser.add_argument(
        "--timeout", type=_positive, default=3600, help="seconds each system may take at most (default 3600)"
    )
    add_service_arguments(parser)
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text.replace("_", ""))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text.replace("_", ""))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def change_row(value: bytes) -> tuple[str, Row | None]:
    """A schema-wrapped workload message as the table row it leaves: (op, row), row None for a delete.

    Reads ``amount`` as a Connect ``Decimal`` (base64 big-endian two's complement, the workload's scale) and
    ``updated_at`` as a ``ZonedTimestamp`` ISO string, the two encodings of the workload's wrapped messages."""
    payload = json.loads(value)["payload"]
    op = payload["op"]
    after = payload.get("after")
    if op == "d" or after is None:
        return op, None
    row = dict(after)
    if row.get("amount") is not None:
        unscaled = int.from_bytes(base64.b64decode(row["amount"]), "big", signed=True)
        row["amount"] = Decimal(unscaled).scaleb(-workload.AMOUNT_SCALE)
    if row.get("updated_at") is not None:
        row["updated_at"] = datetime.fromisoformat(row["updated_at"])
    return op, row


def arrival_order_state(source_state: Mapping[int, Row], replays: Iterable[workload.ChangeEvent]) -> dict[int, Row]:
    """The final state of a sink that applies every change in arrival order, last write wins: the source's state
    with the replayed older changes applied over it (an old update or insert brings an old row back, an old delete
    removes a live row). Replays go to their key's partition after its newer changes, so per key they do arrive
    last."""
    state = {key: dict(row) for key, row in source_state.items()}
    for event in replays:
        if event.value is None:
            continue
        _, row = change_row(event.value)
        if row is None:
            state.pop(event.id, None)
        else:
            state[event.id] = row
    return state


@dataclass(frozen=True)
class RowDiff:
    """How a target differs from a state, by primary key."""

    missing: int = 0
    """Keys in the state, not in the target."""
    extra: int = 0
    """Keys in the target, not in the state."""
    differing: int = 0
    """Keys in both whose rows differ."""

    @property
    def equal(self) -> bool:
        return self.missing == self.extra == self.differing == 0

    def describe(self) -> str:
        if self.equal:
            return "equal"
        return f"{self.missing:,} missing, {self.extra:,} extra, {self.differing:,} differing"


def diff_rows(actual: Mapping[int, Row], expected: Mapping[int, Row]) -> RowDiff:
    """Row by row: values compare as Python values (Decimal 1.5 equals 1.50, aware datetimes across zones)."""
    missing = sum(1 for key in expected if key not in actual)
    extra = sum(1 for key in actual if key not in expected)
    differing = sum(1 for key, row in expected.items() if key in actual and actual[key] != row)
    return RowDiff(missing, extra, differing)


# ------------------------------------------------------------------------------------------------- the run


@dataclass
class SystemRun:
    """One system's figures on the shared topic."""

    name: str
    streaming_s: float = 0.0
    """First change read -> every change in the target."""
    wall_s: float = 0.0
    """Start of the system (Spark session / Connect worker) -> every change in the target."""
    detail: str = ""
    vs_source: RowDiff = field(default_factory=RowDiff)
    vs_arrival: RowDiff | None = None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdcsync-bench-peer-")))
        services = stack.enter_context(bench_services(args, root))
        scratch = stack.enter_context(Scratch(services))
        run(args, root, scratch, scratch.topic())  # ~3 GB of wrapped changes a run


def run(args: argparse.Namespace, root: Path, scratch: Scratch, topic: str) -> None:
    from benchmarks import jdbc_sink

    bootstrap = scratch.bootstrap
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    load = workload.generate(args.changes, args.keys, seed=1, wrapped=True)
    replays = workload.stale_replays(load, args.replays, seed=2)
    print(
        f"generated {load.changes:,} changes over {args.keys:,} keys in {time.perf_counter() - t0:.1f}s "
        f"({load.counts['c']:,} inserts, {load.counts['u']:,} updates, {load.counts['d']:,} deletes, "
        f"{load.counts['tombstone']:,} tombstones) + {len(replays):,} replayed older changes",
        flush=True,
    )
    t0 = time.perf_counter()
    messages = workload.produce(bootstrap, topic, [*load.events, *replays], partitions=PARTITIONS)
    print(f"produced {messages:,} messages into {topic} in {time.perf_counter() - t0:.1f}s", flush=True)
    ends = jdbc_sink.end_offsets(bootstrap, topic, PARTITIONS)
    arrival = arrival_order_state(load.expected, replays) if replays else None

    runs: list[SystemRun] = []
    if args.only in (None, "cdcsync"):
        runs.append(run_cdcsync(root, scratch, topic, load, arrival))
    if args.only in (None, "jdbc"):
        runs.append(run_jdbc_sink(args, root, scratch, topic, load, arrival, ends))

    changes = load.changes + len(replays)
    print()
    print(machine_line() + f"; load average {load_before:.1f} before the run, {os.getloadavg()[0]:.1f} after")
    print(
        f"{changes:,} changes ({messages:,} Kafka messages, {_bytes_per_change(load):,.0f} bytes a change, "
        f"schema-wrapped JSON) over {args.keys:,} keys, {PARTITIONS} partitions"
        + (f", {len(replays):,} of them older changes replayed after the stream" if replays else "")
    )
    print_table(runs, changes, arrival is not None)
    for one in runs:
        legit = one.vs_source.equal or (one.vs_arrival is not None and one.vs_arrival.equal)
        assert legit, f"{one.name}: the target equals neither the source nor the arrival-order state"


def _bytes_per_change(load: workload.Workload) -> float:
    sizes = [len(e.value) for e in load.events if e.value is not None]
    return sum(sizes) / max(1, len(sizes))


def run_cdcsync(
    root: Path,
    scratch: Scratch,
    topic: str,
    load: workload.Workload,
    arrival: Mapping[int, Row] | None,
) -> SystemRun:
    from cdcsync.config.load import validate_pipeline_dict
    from cdcsync.config.settings import load_settings
    from cdcsync.runtime.spark import build_spark_session

    dsn = scratch.database("peer_cdcsync")
    pipeline = validate_pipeline_dict(
        {
            "name": "peer_cdcsync",
            "sources": {
                "orders": {
                    "type": "kafka",
                    "topic": topic,
                    "format": "json",
                    "primary_key": "id",
                    "columns": dict(load.columns),
                }
            },
            "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}},
        }
    )
    settings = prepare_pipeline(pipeline, root, dsn, scratch.bootstrap)
    print("cdcsync: starting Spark and mirroring …", flush=True)
    started = time.monotonic()
    spark_settings = load_settings(kafka__bootstrap_servers=scratch.bootstrap, state_dir=root / "spark")
    spark = build_spark_session(spark_settings, "peer")
    try:
        streaming_s, batches = timed_run(pipeline, settings, spark)
        wall_s = time.monotonic() - started
    finally:
        spark.stop()
    one = SystemRun("cdcsync", streaming_s, wall_s, f"micro-batches: {batches}")
    _verify(one, dsn, "app", load, arrival)
    print(f"cdcsync: {streaming_s:.1f}s from its first micro-batch, {wall_s:.1f}s wall; {one.vs_source.describe()}")
    return one


def run_jdbc_sink(
    args: argparse.Namespace,
    root: Path,
    scratch: Scratch,
    topic: str,
    load: workload.Workload,
    arrival: Mapping[int, Row] | None,
    ends: Mapping[int, int],
) -> SystemRun:
    from psycopg.conninfo import conninfo_to_dict

    from benchmarks import jdbc_sink

    dsn = scratch.database("peer_jdbc")
    _create_table(dsn, "public", load.columns)
    info = conninfo_to_dict(dsn)
    config = jdbc_sink.connector_config(
        topic=topic,
        jdbc_url=jdbc_sink.jdbc_url(info),
        user=str(info.get("user") or ""),
        password=str(info["password"]) if info.get("password") else None,
        table=workload.ORDERS_TABLE,
        tasks=PARTITIONS,
        batch_size=args.batch_size,
        overrides=dict(args.sink_option),
    )
    print(f"JDBC sink: starting Kafka Connect on port {args.connect_port} and mirroring …", flush=True)
    started = time.monotonic()
    with jdbc_sink.connect_worker(root, scratch.bootstrap, args.connect_port) as connect_url:
        times = jdbc_sink.run_connector(
            connect_url, "peer-jdbc-sink", config, scratch.bootstrap, ends, timeout_s=float(args.timeout)
        )
    one = SystemRun(
        "Debezium JDBC sink",
        times.caught_up - times.first_read,
        times.caught_up - started,
        f"{times.caught_up - times.registered:.1f}s from registration",
    )
    _verify(one, dsn, "public", load, arrival)
    print(f"JDBC sink: {one.streaming_s:.1f}s from its first read, {one.wall_s:.1f}s wall; {one.vs_source.describe()}")
    return one


def _create_table(dsn: str, schema: str, columns: Mapping[str, str]) -> None:
    """The sink's table, declared as cdcsync declares its mirror's columns (same types, same key)."""
    import psycopg
    from psycopg import sql

    definition = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(pg_type)) for name, pg_type in columns.items()
    )
    key = sql.SQL(", ").join(sql.Identifier(name) for name in workload.ORDERS_PRIMARY_KEY)
    table = sql.Identifier(schema, workload.ORDERS_TABLE)
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY ({}))").format(table, definition, key))


def _verify(one: SystemRun, dsn: str, schema: str, load: workload.Workload, arrival: Mapping[int, Row] | None) -> None:
    import psycopg
    from psycopg import sql

    names = list(load.columns)
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(n) for n in names), sql.Identifier(schema, workload.ORDERS_TABLE)
    )
    with psycopg.connect(dsn) as conn:
        rows = {r[0]: dict(zip(names, r, strict=True)) for r in conn.execute(query)}
    one.vs_source = diff_rows(rows, load.expected)
    if arrival is not None:
        one.vs_arrival = diff_rows(rows, arrival)


def print_table(runs: Sequence[SystemRun], changes: int, with_replays: bool) -> None:
    """One column per system, and ``ratio``: how many times faster cdcsync is (only when both ran)."""
    both = len(runs) == 2
    header = f"{'':42}" + "".join(f"{one.name:>26}" for one in runs) + (f"{'ratio':>10}" if both else "")
    print()
    print(header)
    print("-" * len(header))
    timed = [
        ("first change read -> all in target (s)", lambda one: one.streaming_s, "s"),
        ("  changes/s", lambda one: changes / one.streaming_s, "rate"),
        ("start -> all in target, wall (s)", lambda one: one.wall_s, "s"),
        ("  changes/s", lambda one: changes / one.wall_s, "rate"),
    ]
    for label, value, kind in timed:
        cells = "".join(f"{value(one):>26,.1f}" if kind == "s" else f"{value(one):>26,.0f}" for one in runs)
        ratio = ""
        if both:
            a, b = value(runs[0]), value(runs[1])
            ratio = f"{(b / a if kind == 's' else a / b):>9.2f}x"
        print(f"{label:42}{cells}{ratio}")
    print(f"{'':42}" + "".join(f"{one.detail:>26}" for one in runs))
    print(f"{'ends equal to the source':42}" + "".join(f"{_yes_no(one.vs_source):>26}" for one in runs))
    if with_replays:
        print(
            f"{'ends equal to arrival order (replays won)':42}"
            + "".join(f"{_yes_no(one.vs_arrival):>26}" for one in runs)
        )
    for one in runs:
        if not one.vs_source.equal:
            print(f"  {one.name} vs the source: {one.vs_source.describe()}")


def _yes_no(diff: RowDiff | None) -> str:
    return "-" if diff is None else ("yes" if diff.equal else "no")


if __name__ == "__main__":
    main()
