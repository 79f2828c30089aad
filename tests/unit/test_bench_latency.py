"""The pure parts of ``benchmarks/latency.py`` (and the ``--spark-conf`` it shares with ``memory.py``): arguments,
the percentile, the ``ts_ms`` stamp and the priming split. Nothing is started."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks import jvm_threads, memory
from benchmarks.common import cli_env
from benchmarks.latency import (
    _events_for_changes,
    batch_timings,
    parse_args,
    percentile,
    phases,
    spark_durations,
    stamp,
)
from cdcsync.config.settings import load_settings
from cdcsync.devstack import workload

pytestmark = pytest.mark.unit


def test_arguments_defaults_and_refusals() -> None:
    args = parse_args([])
    assert (args.rate, args.seconds, args.warmup_seconds, args.keys, args.wrapped) == (
        10_000,
        120.0,
        60.0,
        100_000,
        False,
    )
    assert parse_args(["--rate", "500", "--wrapped"]).wrapped
    assert parse_args(["--warmup-seconds", "0"]).warmup_seconds == 0
    for refused in (["--rate", "0"], ["--warmup-seconds", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(refused)


def test_a_change_is_timed_in_the_phase_it_was_committed_in() -> None:
    seen = [(99.0, 3.5), (100.0, 0.9), (99.9, 0.2), (101.0, 1.1), (98.0, 7.0)]
    assert phases(seen, 100.0) == ([0.2, 3.5, 7.0], [0.9, 1.1])
    assert phases(seen, 0.0) == ([], [0.2, 0.9, 1.1, 3.5, 7.0])


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, f) for f in (0.0, 0.5, 0.9, 0.99, 1.0)] == [1.0, 50.0, 90.0, 99.0, 100.0]
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


@pytest.mark.parametrize("wrapped", [False, True])
def test_stamp_sets_both_ts_ms_and_nothing_else(wrapped: bool) -> None:
    event = workload.generate(3, 3, seed=1, wrapped=wrapped).events[0]
    assert event.value is not None
    before = json.loads(event.value)
    after = json.loads(stamp(event.value, 1_700_000_000_123))
    payload_before, payload_after = (before["payload"], after["payload"]) if wrapped else (before, after)
    assert payload_after["ts_ms"] == payload_after["source"]["ts_ms"] == 1_700_000_000_123
    payload_after["ts_ms"] = payload_before["ts_ms"]
    payload_after["source"]["ts_ms"] = payload_before["source"]["ts_ms"]
    assert after == before


def test_priming_split_keeps_a_delete_with_its_tombstone() -> None:
    events = workload.generate(400, 20, seed=5).events
    for changes in range(1, 200):
        count = _events_for_changes(events, changes)
        assert sum(e.value is not None for e in events[:count]) == changes
        assert count == len(events) or events[count].value is not None  # no tombstone split from its delete


def test_per_batch_figures_are_read_from_the_debug_log_after_the_priming() -> None:
    log = "\n".join(
        [
            "2026-11-27 00:03:52,469 INFO cdcsync.engine.batch: batch 1: decoded and staged in 3.26s, merged "
            "{'mirror': 1316} in 0.33s",
            """2026-11-27 00:03:53,001 DEBUG cdcsync.runtime.progress: batch 1: Spark's durations (ms): """
            """{"addBatch": 3600, "walCommit": 90}""",
            "2026-11-27 00:03:56,829 INFO cdcsync.engine.batch: batch 2: decoded and staged in 0.25s, merged "
            "{'mirror': 1388} in 0.05s",
            """2026-11-27 00:03:57,001 DEBUG cdcsync.runtime.progress: batch 2: Spark's durations (ms): """
            """{"addBatch": 400, "walCommit": 30}""",
        ]
    )
    assert batch_timings(log, after_batch=1) == [(0.25, 0.05)]
    assert spark_durations(log, after_batch=1) == {"addBatch": [0.4], "walCommit": [0.03]}
    assert spark_durations(log, after_batch=0)["addBatch"] == [3.6, 0.4]


@pytest.mark.parametrize("parse", [parse_args, memory.parse_args])
def test_spark_conf_reaches_the_runs_settings_with_its_keys_as_written(
    parse: Callable[[list[str]], argparse.Namespace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = parse(["--spark-conf", "spark.driver.extraJavaOptions=-XX:+UseSerialGC -Da=b", "--spark-conf", "k=v"])
    monkeypatch.setenv("CDCSYNC__SPARK__CONF__stale", "from the caller")  # a run never sees the caller's settings
    env = cli_env(tmp_path, "postgresql://x@h/db", "h:9092", dict(args.spark_conf))
    for name in [name for name in os.environ if name.startswith("CDCSYNC")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    assert load_settings().spark.conf == {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC -Da=b", "k": "v"}
    assert "CDCSYNC__SPARK__CONF" not in cli_env(tmp_path, "postgresql://x@h/db", "h:9092")
    for refused in (["--spark-conf", "no-value"], ["--spark-conf", "=v"]):
        with pytest.raises(SystemExit):
            parse(refused)


def test_window_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--window-s", "0"])


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("C2 CompilerThre", "jit"),
        ("C1 CompilerThre", "jit"),
        ("GC Thread#1", "gc"),
        ("G1 Conc#0", "gc"),
        ("stream executio", "stream"),
        ("Executor task l", "tasks"),
        ("VM Thread", "other"),
    ],
)
def test_jvm_thread_roles(name: str, role: str) -> None:
    assert jvm_threads.role_of(name) == role


def test_role_cpu_of_a_real_process_adds_up() -> None:
    import os
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="a second thread")
    other.start()
    try:
        roles = jvm_threads.role_cpu(os.getpid())
        threads = jvm_threads.thread_cpu(os.getpid())
    finally:
        stop.set()
        other.join()
    assert len(threads) >= 1
    assert set(roles) == set(jvm_threads.ROLES)
    assert all(seconds >= 0 for seconds in roles.values())
    living = sum(roles.values()) - roles["ended"] - roles["children"]
    assert sum(threads.values()) == pytest.approx(living, abs=0.05)
    assert jvm_threads.difference({"a": 1.0}, {"a": 3.5, "b": 1.0}) == {"a": 2.5, "b": 1.0}


@pytest.mark.parametrize("module", ["cdcsync.runtime.python_daemon", "pyspark.daemon"])
def test_the_memory_benchmark_counts_either_python_daemon_as_the_workers(module: str) -> None:
    """cdcsync's daemon is Spark's ``spark.python.daemon.module`` by default, pyspark's when a user sets it back:
    the workers' memory must be counted under either (a process that is neither is not a worker)."""
    import subprocess
    import sys

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    daemon, other = subprocess.Popen([*sleeper, module]), subprocess.Popen([*sleeper, "something.else"])
    try:
        assert _classified(daemon.pid) and not _classified(other.pid)
    finally:
        daemon.kill()
        other.kill()
        daemon.wait()
        other.wait()


def _classified(pid: int) -> bool:
    """Whether the memory benchmark counts the process as the workers' daemon, once it tells. Popen returns when the
    child's exec has closed its file descriptors, and the kernel gives the new program its arguments a moment later:
    until then the command line reads empty, which counts as nothing and is not cached."""
    cache: dict[tuple[int, str], bool] = {}
    for _ in range(500):
        memory._is_daemon(pid, cache)
        if cache:
            return cache[pid, ""]
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never showed its command line")


def test_the_memory_benchmark_counts_a_process_the_jvm_is_starting_nowhere() -> None:
    """Hadoop starts a ``chmod`` for each checkpoint file; caught before it execs, that child runs the JVM's program
    with the JVM's memory, command line (the daemon module is in Spark's options) and a JVM thread's name. It once
    passed for a Python worker of the JVM's size; the JVM's RSS must count once, and only as the JVM's."""
    cli, jvm = memory.Proc(10, 1, "python", 200_000, exe="python3.11"), memory.Proc(11, 10, "java", 700_000, exe="java")
    starting = memory.Proc(12, 11, "stream executio", 700_000, exe="java")
    daemon = memory.Proc(13, 11, "python", 40_000, exe="python3.11")
    worker = memory.Proc(14, 13, "python", 400_000, exe="python3.11")
    chmod = memory.Proc(15, 11, "chmod", 1_000, exe="chmod")
    cache = {(13, "python3.11"): True, (14, "python3.11"): True, (15, "chmod"): False}
    sample = memory.classify([cli, jvm, starting, daemon, worker, chmod], root=10, is_daemon=cache)
    assert (sample["cli"], sample["jvm"], sample["driver"]) == (200_000, 700_000, 900_000)
    assert (sample["workers"], sample["largest worker"]) == (440_000, 400_000)
    assert sample["all"] == 200_000 + 700_000 + 40_000 + 400_000 + 1_000
