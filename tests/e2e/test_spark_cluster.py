"""cdcsync on a Spark standalone cluster (the dev stack's ``--spark-workers``), one worker SIGKILLed mid-run.

The pipeline runs unchanged with ``CDCSYNC__SPARK__MASTER=spark://...``: executors in other JVMs get the Kafka
connector's jars from the driver and run the venv's cdcsync in their Python workers. Killing a worker (with its
executor) mid-run loses the tasks it was running; Spark runs them again on the other executor, a stage a lost
task had partly written is staged again (the merge's row count check), and the mirror still equals the source.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdcsync.devstack import DevStackConfig, env_lines, status, workload
from cdcsync.devstack.service import Service
from cdcsync.devstack.spark import SparkWorker, services
from tests.e2e.conftest import Project, assert_each_batch_once, ledger_batches, mirror_rows, orders_pipeline

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.soak,
]  # too heavy for make test's 25-minute budget: make soak (see docs/devstack.md)

COLUMNS = list(workload.ORDERS_COLUMNS)
WORKERS = 2


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Service]]:
    """A master and two one-core workers on ports of their own (clear of ``cdcsync dev up``'s)."""
    cfg = DevStackConfig(
        state_dir=tmp_path_factory.mktemp("spark-cluster"),
        spark_master_port=27077,
        spark_master_webui_port=28080,
        spark_worker_webui_port=28091,
    )
    cluster = services(cfg, WORKERS)
    try:
        for service in cluster:
            service.start()
        for service in cluster:
            service.wait_ready()
        # What `cdcsync dev status` and `dev env` show for a stack with a cluster.
        states = {name: s.state for name, s in status(cfg).items() if name.startswith("spark-")}
        assert states == {"spark-master": "running", "spark-worker-1": "running", "spark-worker-2": "running"}
        assert f"export CDCSYNC__SPARK__MASTER=spark://127.0.0.1:{cfg.spark_master_port}" in env_lines(cfg)
        yield cluster
    finally:
        for service in reversed(cluster):
            service.stop()


def _applications(worker: SparkWorker) -> list[Path]:
    """The executors this worker launched (one work directory per application)."""
    work = worker.home / "work"
    return list(work.glob("app-*")) if work.is_dir() else []


def test_a_worker_killed_mid_run_loses_nothing(
    spark_cluster: list[Service],
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    topic_name: str,
) -> None:
    master, *workers = spark_cluster
    load = workload.generate(60_000, 6_000, seed=23)
    workload.produce(kafka_bootstrap, topic_name, load.events, partitions=4)
    pipeline = orders_pipeline(topic_name, max_offsets_per_trigger=8_000)
    pipeline["sinks"].pop("audit")
    project = make_project(pipeline)
    project.env["CDCSYNC__SPARK__MASTER"] = master.address
    project.prepare()

    process = project.start("run", str(project.pipeline_file), "--available-now")
    deadline = time.monotonic() + 600
    while process.poll() is None and not ledger_batches(postgres_dsn, "e2e") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before a worker could be killed; make the workload larger"
    victim = workers[0]
    assert isinstance(victim, SparkWorker) and _applications(victim), "worker 1 never ran an executor"
    victim_pid = victim.pid()
    assert victim_pid is not None
    os.killpg(victim_pid, signal.SIGKILL)  # the worker, its executor and the executor's Python workers

    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, f"run exited {process.returncode}\n{stdout}\n{stderr[-4000:]}"
    assert victim.pid() is None
    survivor = workers[1]
    assert isinstance(survivor, SparkWorker) and _applications(survivor), "worker 2 never ran an executor"

    mirror = mirror_rows(postgres_dsn, "app", "Orders Mirror", COLUMNS)
    assert mirror == load.expected
    assert_each_batch_once(postgres_dsn, "e2e", ["mirror"])
