"""The executors' Python workers and the full garbage collection PySpark runs after each of their tasks.

A reused PySpark worker (``spark.python.worker.reuse``, cdcsync's default) calls ``gc.collect()`` after every
task (``pyspark/daemon.py``). A full collection walks every container object the collector tracks, and a
cdcsync worker holds about 85,000 of them that live as long as the process: the imported modules (pyarrow,
psycopg, pydantic's models of the configuration, the decoder, the sinks) and the caches built by the first
tasks. Walking them costs about 50 ms of CPU per task whatever the task's size: four tasks per micro-batch, so
for a micro-batch of a few thousand changes it was about as much CPU as decoding and staging them.

:func:`freeze_long_lived` moves what is alive at the start of a worker's first tasks into the collector's
permanent generation (``gc.freeze``), which collections skip; the collection after each task then walks only what
that task left behind. It freezes at the start of the first few tasks only, right after PySpark's collection of
the previous one (so nearly nothing frozen is garbage), and never again: an object frozen while alive that later
becomes cyclic garbage is never freed, so freezing each task's objects would leak a little on every task.
"""

from __future__ import annotations

import gc
import os

FREEZES_PER_WORKER = 3
"""Tasks at whose start a worker freezes: the warm-up task that imports the modules
(:func:`cdcsync.runtime.spark.build_spark_session`), then the first real ones, which build the decoder's plan,
the sinks' caches and the kept connections."""

_frozen = (0, 0)  # (the process that froze, how many times)


def freeze_long_lived() -> None:
    """In a reused PySpark worker, during its first :data:`FREEZES_PER_WORKER` tasks: freeze what is alive now
    (see the module docstring). Anywhere else (the driver, a test, a worker that is not reused) it does nothing."""
    global _frozen
    if not os.environ.get("SPARK_REUSE_WORKER"):
        return
    pid, times = _frozen
    if pid != os.getpid():  # a fork of a process that froze starts its own count
        times = 0
    if times >= FREEZES_PER_WORKER:
        return
    gc.freeze()
    _frozen = (os.getpid(), times + 1)
