"""The Spark driver JVM's CPU by thread role, from ``/proc/<pid>/task/*/stat`` (no agent, no JFR).

A JVM's CPU is mostly spent by a few kinds of thread: the JIT compilers, the garbage collector, the stream
execution thread (a micro-batch's planning, the closure cleaner, job submission), the executor task threads
(reading Kafka, writing Arrow to the Python workers) and a long tail. Which of them a micro-batch pays for says
whether its cost is warm-up (the compilers stop once the code is compiled) or steady. Linux keeps each thread's
name (its first 15 bytes) in ``comm``; threads that ended are counted in the process's total only, so their share
shows as ``ended``, and the processes the JVM started and reaped (Hadoop's local file system runs ``chmod`` and
``readlink`` as processes when it has no native library) as ``children``.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")

ROLES = ("jit", "gc", "stream", "tasks", "other", "ended", "children")
_PREFIXES = (
    ("C1 CompilerThre", "jit"),
    ("C2 CompilerThre", "jit"),
    ("GC Thread", "gc"),
    ("G1 ", "gc"),
    ("stream executio", "stream"),
    ("Executor task", "tasks"),
)


def role_of(thread_name: str) -> str:
    """The role of a JVM thread by its (15-byte) name."""
    return next((role for prefix, role in _PREFIXES if thread_name.startswith(prefix)), "other")


def _cpu(stat: str, fields: slice) -> float:
    values = stat.rsplit(")", 1)[1].split()[fields]
    return sum(int(value) for value in values) / _TICK


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the process's living threads, by name (threads of one name summed)."""
    spent: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            seconds = _cpu((task / "stat").read_text(), slice(11, 13))
        except OSError:  # the thread ended meanwhile
            continue
        spent[name] = spent.get(name, 0.0) + seconds
    return spent


def role_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the process, by :data:`ROLES` (``ended``: threads no longer alive; ``children``:
    processes it started that have ended)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    spent = dict.fromkeys(ROLES, 0.0)
    for name, seconds in thread_cpu(pid).items():
        spent[role_of(name)] += seconds
    spent["ended"] = max(0.0, _cpu(stat, slice(11, 13)) - sum(spent.values()))
    spent["children"] = _cpu(stat, slice(13, 15))
    return spent


def difference(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
