"""Latency under a steady stream: ``make bench-latency`` (or ``python benchmarks/latency.py [--rate R --seconds S
--keys K --wrapped]``).

Throughput benchmarks time a backlog; users of a running pipeline ask something else: how long after a commit
in the source can a reader of the target see it? This benchmark answers that with the real command:

1. starts a dev stack of its own unless ``--postgres-dsn`` and ``--bootstrap`` point at running services;
2. renders and applies a one-sink Postgres mirror pipeline (``cdcsync init`` + ``cdcsync migrate``) into a fresh
   database, then adds two statement-level triggers to the mirror that log, for every row a merge writes, the
   transaction's id and the row's ``_cdc_ts`` (the source commit time, Debezium's ``source.ts_ms``) into a side
   table ``bench_latency.seen``: one set-based INSERT per merge statement, no per-row round trip;
3. starts ``cdcsync run`` (streaming, the product's default trigger) as a subprocess, primes it with the first
   second of changes and waits until those are visible (Spark's start is not latency);
4. produces changes at a steady ``--rate``: first for ``--warmup-seconds`` (default 60), then, without a pause, for
   ``--seconds``, stamping each change's ``ts_ms`` with the wall clock at the moment it is handed to the producer
   (so ``_cdc_ts`` is "committed in the source" then). The headline figures are those of the second phase: a
   pipeline that has been running for a minute, as a running pipeline's users see it. The warm-up phase's figures
   are printed beside them: in its first minute the driver JVM is still compiling Spark's per-batch code paths
   (docs/benchmarks.md, "Latency"), and micro-batches take about twice as long;
5. a poller reads ``bench_latency.seen`` every ``--poll-ms`` in its own connection and notes, for each logged row,
   when it first became visible (the merge committed): latency = seen - ``_cdc_ts``;
6. once everything is visible, stops the run with SIGTERM (it finishes its batch and exits 0), checks the mirror
   row by row against the expected final state, and prints p50/p90/p99/max.

What the figure includes: producer batching (``linger.ms`` 20), broker, the trigger interval (Spark's
``processingTime`` of 1 s: a change waits for the next micro-batch), decoding, staging with COPY and the merge, plus
the poller's own granularity (``--poll-ms``). Deletes are not timed (a hard delete leaves no row to log); inserts
and updates are. A change overwritten in the same micro-batch by a newer change of its key is timed through the
newer one only (the mirror never shows it).

Prints its figures; raises only if the mirror does not end equal to the expected state.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks import jvm_threads
from benchmarks.common import (
    add_service_arguments,
    add_spark_conf_argument,
    bench_services,
    cdcsync_run,
    cli_env,
    delete_topics,
    drop_database,
    fresh_database,
    init_and_migrate,
    machine_line,
    mirror_equals,
    write_mirror_pipeline,
)
from cdcsync.devstack import workload

_TS_MS = re.compile(rb'"ts_ms":\d+')
PARTITIONS = 4

# The benchmark's own instrumentation (not product SQL): statement-level triggers with transition tables, one per
# event because Postgres allows a transition table only on single-event triggers.
_LOG_DDL = """
CREATE SCHEMA bench_latency;
CREATE TABLE bench_latency.seen (id bigserial PRIMARY KEY, txid xid8 NOT NULL, source_ts timestamptz NOT NULL);
CREATE FUNCTION bench_latency.log_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO bench_latency.seen (txid, source_ts) SELECT pg_current_xact_id(), "_cdc_ts" FROM written;
  RETURN NULL;
END $$;
CREATE TRIGGER bench_latency_inserted AFTER INSERT ON app.orders
  REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION bench_latency.log_rows();
CREATE TRIGGER bench_latency_updated AFTER UPDATE ON app.orders
  REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION bench_latency.log_rows();
"""
_POLL = "SELECT id, extract(epoch FROM source_ts) FROM bench_latency.seen WHERE id > %s ORDER BY id"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=10_000, help="changes per second to produce (default 10000)")
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the timed phase produces (default 120)")
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=60.0,
        help="how long to produce at the same rate before the timed phase (default 60; 0 times the run from its start)",
    )
    parser.add_argument("--keys", type=int, default=100_000, help="distinct keys (default 100k)")
    parser.add_argument(
        "--wrapped", action="store_true", help="schema-wrapped JSON (JsonConverter's default) instead of bare payloads"
    )
    parser.add_argument("--poll-ms", type=float, default=20.0, help="how often the poller looks (default 20 ms)")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="run `cdcsync --debug run` and print the driver's per-batch timings from its log (kept in --log)",
    )
    parser.add_argument("--log", type=Path, help="copy the run's log here")
    parser.add_argument(
        "--trigger-interval-s", type=float, help="the run's run.trigger_interval_s (default: the product's, 1 s)"
    )
    parser.add_argument(
        "--no-overlap-merges",
        action="store_true",
        help="run.overlap_merges false: each batch merged before the next one starts (to compare)",
    )
    add_spark_conf_argument(parser)
    parser.add_argument(
        "--window-s",
        type=float,
        default=60.0,
        help="with --debug: print CPU per micro-batch for each window of this many seconds (warm-up or steady?)",
    )
    add_service_arguments(parser)
    args = parser.parse_args(argv)
    if min(args.rate, args.seconds, args.keys, args.poll_ms, args.window_s) <= 0 or args.warmup_seconds < 0:
        parser.error(
            "--rate, --seconds, --keys, --poll-ms and --window-s must be positive, --warmup-seconds not negative"
        )
    return args


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending sequence (``fraction`` in [0, 1])."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, round(fraction * len(sorted_values) + 0.5 - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def phases(seen: Sequence[tuple[float, float]], timed_from: float) -> tuple[list[float], list[float]]:
    """The latencies of the warm-up and of the timed phase, each ascending: a change belongs to the phase in which
    it was committed (its source ``ts_ms``), whenever it became visible."""
    warmup = sorted(latency for source_ts, latency in seen if source_ts < timed_from)
    timed = sorted(latency for source_ts, latency in seen if source_ts >= timed_from)
    return warmup, timed


def stamp(value: bytes, now_ms: int) -> bytes:
    """The change with its source and envelope ``ts_ms`` set to ``now_ms`` (the schema part has no values)."""
    return _TS_MS.sub(b'"ts_ms":%d' % now_ms, value)


@dataclass
class Poller:
    """Notes when each logged row of ``bench_latency.seen`` first became visible to another connection."""

    dsn: str
    interval_s: float
    seen: list[tuple[float, float]] = field(default_factory=list)
    """(source commit time, latency) of each timed row, in seconds."""
    measuring_from_id: int | None = None
    """Rows logged up to here belong to the priming changes and are not timed."""
    last_id: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="latency-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(_POLL, (self.last_id,)).fetchall()
                seen = time.time()
                if rows:
                    self.last_id = rows[-1][0]
                    floor = self.measuring_from_id
                    if floor is not None:
                        self.seen.extend((float(ts), seen - float(ts)) for row_id, ts in rows if row_id > floor)
                self._stop.wait(self.interval_s)


@dataclass
class Producer:
    """Sends changes at a steady rate, each stamped with the moment it is handed over."""

    bootstrap: str
    topic: str
    behind_max_s: float = 0.0
    """How far the producer fell behind its schedule at worst (a figure is only steady if this stays small)."""

    def send(self, events: Sequence[workload.ChangeEvent], rate: float) -> float:
        from confluent_kafka import Producer as KafkaProducer

        producer = KafkaProducer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 20,
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                "queue.buffering.max.messages": 1_000_000,
                "log_level": 3,
            }
        )
        start = time.monotonic()
        for index, event in enumerate(events):
            due = start + index / rate
            lag = time.monotonic() - due
            if lag < 0:
                time.sleep(-lag)
            else:
                self.behind_max_s = max(self.behind_max_s, lag)
            value = None if event.value is None else stamp(event.value, int(time.time() * 1000))
            producer.produce(self.topic, key=event.key, value=value)
            if index % 1000 == 0:
                producer.poll(0)
        remaining = producer.flush(60)
        if remaining:
            raise RuntimeError(f"{remaining} messages still undelivered after 60 s")
        return time.monotonic() - start


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdcsync-latency-")))
        services = stack.enter_context(bench_services(args, root))
        topic = f"latency.public.orders_{uuid.uuid4().hex[:8]}"
        stack.callback(delete_topics, services.bootstrap, [topic])
        measure(args, root, services.admin_dsn, services.bootstrap, topic)


def measure(args: argparse.Namespace, root: Path, admin_dsn: str, bootstrap: str, topic: str) -> None:
    warmup_changes, timed_changes = int(args.rate * args.warmup_seconds), int(args.rate * args.seconds)
    load = workload.generate(args.rate + warmup_changes + timed_changes, args.keys, seed=7, wrapped=args.wrapped)
    prime_end = _events_for_changes(load.events, args.rate)
    warmup_end = _events_for_changes(load.events, args.rate + warmup_changes)
    events_by_phase = load.events[:prime_end], load.events[prime_end:warmup_end], load.events[warmup_end:]
    workload.ensure_topic(bootstrap, topic, PARTITIONS)
    dsn = fresh_database(admin_dsn, "latency")
    try:  # on shared services, a run's database would stay behind
        _measure(args, root, load, events_by_phase, topic, dsn, bootstrap)
    finally:
        drop_database(admin_dsn, dsn)


def _measure(
    args: argparse.Namespace,
    root: Path,
    load: workload.Workload,
    events_by_phase: tuple[Sequence[workload.ChangeEvent], ...],
    topic: str,
    dsn: str,
    bootstrap: str,
) -> None:
    import psycopg

    prime, warmup, steady = events_by_phase
    env = cli_env(root, dsn, bootstrap, dict(args.spark_conf))
    if args.trigger_interval_s is not None:
        env["CDCSYNC__RUN__TRIGGER_INTERVAL_S"] = str(args.trigger_interval_s)
    if args.no_overlap_merges:
        env["CDCSYNC__RUN__OVERLAP_MERGES"] = "false"
    pipeline_file = write_mirror_pipeline(root, "latency", topic, load.columns)
    init_and_migrate(pipeline_file, env)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_LOG_DDL)

    poller = Poller(dsn, args.poll_ms / 1000)
    poller.start()
    producer = Producer(bootstrap, topic)
    log_path = root / "run.log"
    with open(log_path, "w") as log, cdcsync_run(pipeline_file, env, log, debug=args.debug) as run:
        producer.send(prime, args.rate)
        _wait(lambda: poller.last_id > 0, run, "the first micro-batch", timeout=300)
        _wait_quiet(poller, run)
        poller.measuring_from_id = poller.last_id
        print(
            f"run started and primed; producing {len(warmup):,} messages at {args.rate:,}/s to warm up, then "
            f"{len(steady):,} timed …",
            flush=True,
        )
        producer.send(warmup, args.rate)
        timed_from = time.time()
        first_batch, cpu_before = _last_batch(dsn), session_cpu(run.pid)
        windows = Windows(dsn, run.pid, args.window_s) if args.debug else None
        produce_s = producer.send(steady, args.rate)
        _wait(
            lambda: mirror_equals(dsn, load.columns, load.expected),
            run,
            "the mirror to catch up",
            timeout=600,
            every_s=1.0,
        )
        _wait_quiet(poller, run)
        batches, cpu = _last_batch(dsn) - first_batch, _cpu_spent(cpu_before, session_cpu(run.pid))
        if windows is not None:
            windows.stop()
    poller.stop()
    if args.log is not None:
        args.log.write_text(log_path.read_text())
    if run.returncode != 0:
        raise RuntimeError(f"cdcsync run exited {run.returncode}; its log: {log_path.read_text()[-3000:]}")
    report(args, load, poller.seen, timed_from, produce_s, producer.behind_max_s, len(steady))
    if args.debug:
        text = log_path.read_text()
        report_batches(batches, cpu, batch_timings(text, first_batch), spark_durations(text, first_batch))
        if windows is not None:
            windows.report()
    else:
        report_batches(batches, cpu, [])


def report(
    args: argparse.Namespace,
    load: workload.Workload,
    seen: list[tuple[float, float]],
    timed_from: float,
    produce_s: float,
    behind_max_s: float,
    messages: int,
) -> None:
    warmup, ordered = phases(seen, timed_from)
    print()
    print(machine_line())
    print(f"format:                      {'schema-wrapped JSON' if args.wrapped else 'bare JSON'}")
    trigger = 1.0 if args.trigger_interval_s is None else args.trigger_interval_s
    print(f"trigger interval:            {trigger:g} s")
    print(f"merges overlapped:           {'no' if args.no_overlap_merges else 'yes'}")
    print(f"produced:                    {messages:,} messages in {produce_s:.1f} s ({messages / produce_s:,.0f}/s)")
    print(f"producer behind schedule:    {behind_max_s * 1000:,.0f} ms at worst")
    print(f"rows timed (ins/upd seen):   {len(ordered):,}")
    if ordered:
        for label, fraction in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99)):
            print(f"commit -> visible {label}:       {percentile(ordered, fraction) * 1000:8,.0f} ms")
        print(f"commit -> visible max:       {ordered[-1] * 1000:8,.0f} ms")
        print(f"commit -> visible mean:      {statistics.fmean(ordered) * 1000:8,.0f} ms")
    if warmup:
        print(
            f"warm-up ({args.warmup_seconds:g} s, not in the figures above): p50 {percentile(warmup, 0.5) * 1000:,.0f} "
            f"ms, p99 {percentile(warmup, 0.99) * 1000:,.0f} ms, max {warmup[-1] * 1000:,.0f} ms"
        )
    print(f"poll interval:               {args.poll_ms:8,.0f} ms (included in the figures)")
    print(f"mirror verified equal to the expected final state ({len(load.expected):,} rows)")


_BATCH_LOG = re.compile(r"batch (\d+): decoded and staged in ([\d.]+)s, merged .* in ([\d.]+)s")
_SPARK_LOG = re.compile(r"batch (\d+): Spark's durations \(ms\): (\{.*\})")
_TICK = os.sysconf("SC_CLK_TCK")


def session_cpu(session: int) -> dict[str, float]:
    """CPU seconds so far (user + system, all threads) of the run's processes (its session), by role: the
    ``cdcsync run`` Python driver, the Spark driver JVM, and the executors' Python workers (with their daemon)."""
    spent = {"driver": 0.0, "jvm": 0.0, "workers": 0.0}
    for pid, fields, command in _session_processes(session):
        role = "driver" if pid == session else "jvm" if b"java" in command else "workers"
        spent[role] += sum(int(value) for value in fields[11:15]) / _TICK  # and its ended children's
    return spent


def _session_processes(session: int) -> Iterator[tuple[int, list[str], bytes]]:
    """(pid, ``stat`` fields after the name, command line) of each process of the run's session (the run was
    started in a session of its own)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session:  # the session id
            yield int(entry.name), fields, command


def _cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each role spent between two readings (a process that ended meanwhile counts only once its parent
    waited for it: a Python worker through the PySpark daemon)."""
    return {role: after[role] - before[role] for role in after}


def _last_batch(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute('SELECT coalesce(max(batch_id), -1) FROM "cdcsync"."batch_ledger"').fetchone()
    return int(row[0]) if row else -1


def batch_timings(log: str, after_batch: int) -> list[tuple[float, float]]:
    """(decoded and staged, merged) seconds of each batch after ``after_batch``, from the driver's debug log."""
    found = (match.groups() for match in _BATCH_LOG.finditer(log))
    return [(float(staged), float(merged)) for batch, staged, merged in found if int(batch) > after_batch]


def spark_durations(log: str, after_batch: int) -> dict[str, list[float]]:
    """Spark's own split of each batch after ``after_batch`` (its progress events' ``durationMs``), by phase."""
    phases: dict[str, list[float]] = {}
    for batch, durations in _SPARK_LOG.findall(log):
        if int(batch) > after_batch:
            for phase, ms in json.loads(durations).items():
                phases.setdefault(phase, []).append(ms / 1000)
    return phases


def report_batches(
    batches: int,
    cpu: dict[str, float],
    timings: list[tuple[float, float]],
    phases: dict[str, list[float]] | None = None,
) -> None:
    """Per micro-batch figures of the timed phase: less sensitive to a busy machine than the latencies."""
    print(f"micro-batches (timed phase): {batches:,}")
    if batches <= 0:
        return
    per_batch = " / ".join(f"{role} {seconds / batches:.3f}" for role, seconds in cpu.items())
    print(f"CPU s per batch:             {sum(cpu.values()) / batches:.3f} ({per_batch})")
    if timings:
        staged = sorted(t[0] for t in timings)
        merged = sorted(t[1] for t in timings)
        print(
            f"driver, staged / merged:     p50 {percentile(staged, 0.5):.3f} / {percentile(merged, 0.5):.3f} s, "
            f"p99 {percentile(staged, 0.99):.3f} / {percentile(merged, 0.99):.3f} s"
        )
    for phase, seconds in sorted((phases or {}).items(), key=lambda item: -statistics.fmean(item[1])):
        ordered = sorted(seconds)
        print(
            f"  Spark {phase + ':':<22}mean {statistics.fmean(ordered):.3f}, p50 {percentile(ordered, 0.5):.3f}, "
            f"p99 {percentile(ordered, 0.99):.3f}, max {ordered[-1]:.3f} s"
        )
    print(f"load average:                {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


@dataclass
class Windows:
    """CPU per micro-batch in consecutive windows of the timed phase, by process and by JVM thread role
    (:mod:`benchmarks.jvm_threads`): whether a batch's cost falls as the run goes on (warm-up) or stays."""

    dsn: str
    session: int
    every_s: float
    samples: list[tuple[float, int, dict[str, float], dict[str, float], dict[str, float]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.jvm = _session_jvm(self.session)
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="latency-windows", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        threads = jvm_threads.thread_cpu(self.jvm) if self.jvm else {}
        roles = jvm_threads.role_cpu(self.jvm) if self.jvm else {}
        self.samples.append((time.monotonic(), _last_batch(self.dsn), session_cpu(self.session), roles, threads))

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def report(self) -> None:
        print(
            "CPU s per batch by window (process: driver / jvm / workers; JVM threads: "
            + " / ".join(jvm_threads.ROLES)
            + "):"
        )
        start = self.samples[0][0]
        for before, after in itertools.pairwise(self.samples):
            batches = after[1] - before[1]
            if batches <= 0:
                continue
            cpu = _cpu_spent(before[2], after[2])
            roles = jvm_threads.difference(before[3], after[3])
            print(
                f"  {before[0] - start:5.0f}-{after[0] - start:4.0f} s, {batches:3d} batches: "
                + " / ".join(f"{seconds / batches:.3f}" for seconds in cpu.values())
                + "; "
                + " / ".join(f"{roles.get(role, 0.0) / batches:.3f}" for role in jvm_threads.ROLES)
            )
        batches = self.samples[-1][1] - self.samples[0][1]
        if batches > 0:
            threads = jvm_threads.difference(self.samples[0][4], self.samples[-1][4])
            busiest = sorted(threads.items(), key=lambda item: -item[1])[:12]
            print(
                "JVM threads, CPU s per batch over the timed phase: "
                + ", ".join(f"{name!r} {s / batches:.3f}" for name, s in busiest)
            )


def _session_jvm(session: int) -> int | None:
    """The Spark driver JVM of the run's session."""
    return next((pid for pid, _, command in _session_processes(session) if b"java" in command), None)


def _events_for_changes(events: Sequence[workload.ChangeEvent], changes: int) -> int:
    """How many messages (tombstones included) hold the first ``changes`` changes."""
    seen = 0
    for index, event in enumerate(events):
        seen += event.value is not None
        if seen == changes:
            return index + 1 + int(index + 1 < len(events) and events[index + 1].value is None)
    return len(events)


def _wait(done: Any, run: subprocess.Popen[bytes], what: str, *, timeout: float, every_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if run.poll() is not None:
            raise RuntimeError(f"cdcsync run exited {run.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every_s)


def _wait_quiet(poller: Poller, run: subprocess.Popen[bytes], quiet_s: float = 3.0) -> None:
    """Until no new row has been logged for ``quiet_s`` (the last micro-batch's rows are all seen)."""
    last, since = poller.last_id, time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.2)
        if poller.last_id != last:
            last, since = poller.last_id, time.monotonic()
        if run.poll() is not None:
            raise RuntimeError(f"cdcsync run exited {run.returncode}")


if __name__ == "__main__":
    main()
