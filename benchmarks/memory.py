"""Peak memory against the backlog: ``make bench-memory`` (or ``python benchmarks/memory.py [--changes N ...
--keys K --max-offsets-per-trigger M]``).

A pipeline that is behind must not need memory in proportion to how far behind it is: a micro-batch reads at most
``max_offsets_per_trigger`` messages (default 500k), so what a run holds should depend on that setting, not on
the backlog. This benchmark checks it with the real command, for each ``--changes`` (default 1M, then 5M):

1. starts a dev stack of its own unless ``--postgres-dsn`` and ``--bootstrap`` point at running services;
2. produces the changes (``make bench``'s workload: bare JSON over ``--keys`` keys, 4 partitions) into a topic of
   their own, generated and sent one at a time (:class:`~cdcsync.devstack.workload.Changelog`), so the producer
   holds only the expected final state, not the 5M messages;
3. renders and applies a one-mirror pipeline (``cdcsync init`` + ``cdcsync migrate``) into a fresh database;
4. runs ``cdcsync run --available-now`` as a subprocess and, every ``--sample-ms`` until it exits, reads the
   resident set size (RSS) of every process of the run's session from ``/proc``, summed per role:

   - the driver: the CLI's Python process and the JVM it starts (in ``local`` mode the JVM is also the executor:
     Kafka fetch, rows to Arrow);
   - the executors' Python workers: the Python daemon and the workers it forks (decoding, staging). Forked
     workers share pages with the daemon, and RSS counts a shared page in each, so this sum overstates what
     they take from the machine; it is compared with itself, backlog against backlog;

5. checks the mirror equals the expected final state, notes the micro-batches from the ledger, then drops the
   database and deletes the topic (a 5M-change topic is about 2.5 GB of broker disk);
6. prints the peaks of each backlog side by side with the ratio to the first (and the CPU seconds of the JVM and
   the workers, which a loaded machine changes less than the wall time), how RSS moved over each run (peak
   per quarter of the run: a plateau is memory bounded by configuration; a climb is memory that grows with the
   backlog), and whether the issue's goal holds: peak RSS at the largest backlog within 20% of the smallest.

Prints its figures; raises only if a run fails or a mirror does not end equal to the expected state.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from benchmarks.common import (
    BenchServices,
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
from cdcsync.runtime.spark import DEFAULT_SPARK_CONF

PARTITIONS = 4
GOAL_RATIO = 1.2
"""Issue 14: peak RSS at 5M changes of backlog within 20% of 1M."""
_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
_TICK = os.sysconf("SC_CLK_TCK")
ROLES = ("driver", "jvm", "cli", "workers", "largest worker", "all")
"""What each sample holds (KiB): ``driver`` = ``cli`` + ``jvm``; ``workers`` = daemon + forked workers; ``all`` =
every process of the run's session (also a launcher shell while Spark starts)."""
CPU_ROLES = ("cpu cli", "cpu jvm", "cpu workers")
"""And the CPU ticks each role has spent so far (user + system, with its reaped children's): the largest sample is
the run's CPU, a figure a loaded machine changes less than the wall time."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--changes",
        type=int,
        nargs="+",
        default=[1_000_000, 5_000_000],
        help="backlogs to drain, each into a fresh topic and database (default 1000000 5000000)",
    )
    parser.add_argument("--keys", type=int, default=200_000, help="distinct keys (default 200k)")
    parser.add_argument(
        "--max-offsets-per-trigger", type=int, default=None, help="the source's setting (default: the product's)"
    )
    parser.add_argument("--sample-ms", type=float, default=100.0, help="how often /proc is read (default 100 ms)")
    add_spark_conf_argument(parser)
    add_service_arguments(parser)
    args = parser.parse_args(argv)
    if min(args.changes) <= 0 or args.keys <= 0 or args.sample_ms <= 0:
        parser.error("--changes, --keys and --sample-ms must be positive")
    if args.max_offsets_per_trigger is not None and args.max_offsets_per_trigger <= 0:
        parser.error("--max-offsets-per-trigger must be positive")
    return args


# ---------------------------------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    rss_kib: int
    cpu_ticks: int = 0
    exe: str = ""
    """The name of the program it runs (``/proc/<pid>/exe``), or ``comm`` when that cannot be read."""


def session_processes(session: int) -> list[Proc]:
    """Every live process whose session is ``session`` (``cdcsync run`` is started in a session of its own, so
    this is its JVM, the Python daemon and workers, and anything Spark's launcher runs)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                text = stat.read()
        except OSError:  # gone since the scan
            continue
        close = text.rindex(b")")
        fields = text[close + 2 :].split()  # fields 3 (state) onwards of proc(5)
        if int(fields[3]) == session:
            comm = text[text.index(b"(") + 1 : close].decode(errors="replace")
            cpu = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
            try:
                exe = os.path.basename(os.readlink(f"/proc/{entry.name}/exe"))
            except OSError:
                exe = comm
            found.append(Proc(int(entry.name), int(fields[1]), comm, int(fields[21]) * _PAGE_KIB, cpu, exe))
    return found


def _started_by_the_jvm(proc: Proc, by_pid: dict[int, Proc]) -> bool:
    """A process the JVM is starting, caught before it runs its program. Hadoop's local file system starts a
    ``chmod`` for every checkpoint file it writes (it has no native library here), and the JVM starts a process
    with ``posix_spawn``, whose child shares the JVM's memory until it execs: its RSS is the JVM's, already counted.
    It also carries the JVM's command line (with the daemon module in Spark's options) and the name of the JVM
    thread that started it, so it would otherwise pass for a Python worker of the JVM's size."""
    parent = by_pid.get(proc.ppid)
    return proc.exe == "java" and parent is not None and parent.exe == "java"


def classify(processes: Sequence[Proc], root: int, is_daemon: dict[tuple[int, str], bool]) -> dict[str, int]:
    """One sample: KiB per role (see :data:`ROLES`) and CPU ticks (:data:`CPU_ROLES`). ``is_daemon`` caches, per
    pid and program, whether its command line is the Python daemon's (:data:`DAEMON_MODULES`; its forked workers
    carry the same one; a worker is one whose parent is a Python daemon too). A process the JVM is starting counts
    nowhere (:func:`_started_by_the_jvm`)."""
    by_pid = {p.pid: p for p in processes}
    sample = dict.fromkeys((*ROLES, *CPU_ROLES), 0)
    for proc in processes:
        if _started_by_the_jvm(proc, by_pid):
            continue
        sample["all"] += proc.rss_kib
        if proc.pid == root:
            sample["cli"] += proc.rss_kib
            sample["cpu cli"] += proc.cpu_ticks
        elif proc.exe == "java":
            sample["jvm"] += proc.rss_kib
            sample["cpu jvm"] += proc.cpu_ticks
        elif _is_daemon(proc.pid, is_daemon, proc.exe):
            sample["workers"] += proc.rss_kib
            sample["cpu workers"] += proc.cpu_ticks  # a worker that ended is in the daemon's (its parent's) count
            parent = by_pid.get(proc.ppid)
            if parent is not None and parent.exe != "java" and _is_daemon(parent.pid, is_daemon, parent.exe):
                sample["largest worker"] = max(sample["largest worker"], proc.rss_kib)
    sample["driver"] = sample["cli"] + sample["jvm"]
    return sample


DAEMON_MODULES = (b"pyspark.daemon", DEFAULT_SPARK_CONF["spark.python.daemon.module"].encode())
"""The command lines of the executors' Python daemon: cdcsync's (the default), or pyspark's own."""


def _is_daemon(pid: int, cache: dict[tuple[int, str], bool], exe: str = "") -> bool:
    """Whether the process runs the daemon module (or is a worker it forked), cached per pid and program: the
    daemon's pid first runs the JVM's ``jspawnhelper``, then Python."""
    if (pid, exe) not in cache:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            return False
        if not command:  # mid-exec: the kernel has not given the new program its arguments yet; ask again later
            return False
        cache[pid, exe] = any(module in command for module in DAEMON_MODULES)
    return cache[pid, exe]


@dataclass
class Sampler:
    """Samples the run's session every ``interval_s`` on a thread of its own until stopped."""

    root: int
    interval_s: float
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        is_daemon: dict[tuple[int, str], bool] = {}
        start = time.monotonic()
        while not self._stop.is_set():
            processes = session_processes(self.root)
            if processes:
                self.samples.append((time.monotonic() - start, classify(processes, self.root, is_daemon)))
            self._stop.wait(self.interval_s)


# ------------------------------------------------------------------------------------------------------ one run


@dataclass
class Backlog:
    """One backlog's run and what was sampled."""

    changes: int
    messages: int = 0
    produce_s: float = 0.0
    run_s: float = 0.0
    batches: int = 0
    load: str = ""
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    def peak(self, role: str) -> int:
        return max((sample[role] for _, sample in self.samples), default=0)

    def quarters(self, role: str) -> list[int]:
        """The peak of ``role`` in each quarter of the run's time."""
        end = self.samples[-1][0] if self.samples else 0.0
        peaks = [0] * 4
        for at, sample in self.samples:
            quarter = min(3, int(4 * at / end)) if end else 0
            peaks[quarter] = max(peaks[quarter], sample[role])
        return peaks


def drain(args: argparse.Namespace, root: Path, services: BenchServices, changes: int) -> Backlog:
    """Produce ``changes`` into a fresh topic, drain them with ``cdcsync run --available-now`` while sampling, check
    the mirror, and remove the topic and database again."""
    import psycopg

    one = Backlog(changes)
    topic = f"memory.public.orders_{uuid.uuid4().hex[:8]}"
    dsn = ""
    try:
        changelog = workload.Changelog(changes, args.keys, seed=1)
        started = time.perf_counter()
        one.messages = workload.produce(services.bootstrap, topic, changelog, partitions=PARTITIONS)
        one.produce_s = time.perf_counter() - started
        print(f"{changes:,} changes: produced {one.messages:,} messages in {one.produce_s:.0f} s", flush=True)

        dsn = fresh_database(services.admin_dsn, "memory")
        run_root = root / f"run_{changes}"
        run_root.mkdir()
        env = cli_env(run_root, dsn, services.bootstrap, dict(args.spark_conf))
        options = {"max_offsets_per_trigger": args.max_offsets_per_trigger} if args.max_offsets_per_trigger else {}
        pipeline_file = write_mirror_pipeline(run_root, "memory", topic, workload.ORDERS_COLUMNS, options)
        init_and_migrate(pipeline_file, env)
        log_path = run_root / "run.log"
        started = time.perf_counter()
        with (
            open(log_path, "w") as log,
            cdcsync_run(pipeline_file, env, log, "--available-now") as run,
            Sampler(run.pid, args.sample_ms / 1000) as sampler,
        ):
            run.wait()
        one.run_s = time.perf_counter() - started
        one.load = " ".join(f"{value:.1f}" for value in os.getloadavg())
        one.samples = sampler.samples
        if run.returncode != 0:
            raise RuntimeError(f"cdcsync run exited {run.returncode}; its log: {log_path.read_text()[-3000:]}")
        if not mirror_equals(dsn, workload.ORDERS_COLUMNS, changelog.expected):
            raise RuntimeError(f"{changes:,} changes: the mirror does not equal the expected final state")
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM cdcsync.batch_ledger").fetchone()
        one.batches = row[0] if row else 0
        print(
            f"{changes:,} changes: drained in {one.run_s:.0f} s ({one.batches} micro-batches), mirror verified "
            f"({len(changelog.expected):,} rows); peak RSS driver {_mib(one.peak('driver'))}, "
            f"workers {_mib(one.peak('workers'))} MiB",
            flush=True,
        )
        return one
    finally:
        if dsn:
            drop_database(services.admin_dsn, dsn)
        delete_topics(services.bootstrap, [topic])


# ------------------------------------------------------------------------------------------------------ report


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.0f}"


def _count(changes: int) -> str:
    return f"{changes / 1e6:g}M" if changes >= 1_000_000 else f"{changes / 1e3:g}k"


_LINES = (
    ("driver: CLI + JVM", "driver"),
    ("  the JVM alone", "jvm"),
    ("  the CLI's Python", "cli"),
    ("Python workers (daemon + forks, sum)", "workers"),
    ("  the largest single worker", "largest worker"),
    ("the run's whole process tree", "all"),
)


def report(args: argparse.Namespace, runs: Sequence[Backlog]) -> None:
    first, last = runs[0], runs[-1]
    print()
    print(machine_line())
    print("load average (1, 5, 15 min) at the end of each run: " + "; ".join(one.load for one in runs))
    mopt = args.max_offsets_per_trigger or "the default (500,000)"
    print(f"workload: bare JSON, {args.keys:,} keys, {PARTITIONS} partitions, max_offsets_per_trigger {mopt}")
    print(f"sampled every {args.sample_ms:g} ms from /proc (RSS; the sum over processes per role)")
    print()
    head = "".join(f"{_count(one.changes) + ' changes':>18}" for one in runs)
    print(f"{'peak RSS (MiB)':38}{head}{_count(last.changes) + ' / ' + _count(first.changes):>14}")
    for label, role in _LINES:
        values = "".join(f"{_mib(one.peak(role)):>18}" for one in runs)
        ratio = last.peak(role) / first.peak(role) if first.peak(role) else float("nan")
        print(f"{label:38}{values}{ratio:>14.2f}")
    print(f"{'messages (with tombstones)':38}" + "".join(f"{one.messages:>18,}" for one in runs))
    print(f"{'micro-batches':38}" + "".join(f"{one.batches:>18}" for one in runs))
    print(f"{'run --available-now, wall (s)':38}" + "".join(f"{one.run_s:>18.0f}" for one in runs))
    for label, role in (("CPU s: the JVM", "cpu jvm"), ("CPU s: the Python workers", "cpu workers")):
        print(f"{label:38}" + "".join(f"{one.peak(role) / _TICK:>18.1f}" for one in runs))
    print()
    print("peak RSS per quarter of each run (MiB): a plateau is bounded by configuration, a climb by the backlog")
    for one in runs:
        for label, role in (("driver", "driver"), ("JVM", "jvm"), ("workers", "workers")):
            quarters = " / ".join(_mib(kib) for kib in one.quarters(role))
            print(f"  {one.changes:>11,} changes, {label:8} {quarters}")
    print()
    failing = [label.strip() for label, role in _LINES[:4] if last.peak(role) > GOAL_RATIO * first.peak(role)]
    goal = f"peak RSS at {last.changes:,} changes within {GOAL_RATIO - 1:.0%} of {first.changes:,}"
    if len(runs) < 2:
        print(f"goal ({goal}): needs two backlogs")
    elif failing:
        print(f"goal ({goal}): does NOT hold for {', '.join(failing)}")
    else:
        print(f"goal ({goal}): holds for the driver, the JVM, the CLI and the Python workers")
    print("every mirror verified equal to the expected final state")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdcsync-memory-")))
        services = stack.enter_context(bench_services(args, root))
        runs = [drain(args, root, services, changes) for changes in args.changes]
    report(args, runs)


if __name__ == "__main__":
    main()
