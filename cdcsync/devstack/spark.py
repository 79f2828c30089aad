"""A Spark standalone cluster for the dev stack: ``cdcsync dev up --spark-workers N``.

``run`` uses ``local[2]`` unless told otherwise; to see a pipeline run the way it runs on a real cluster (executors
in other JVMs, jars and Python code shipped to them, executors lost and replaced), the dev stack starts Spark's own
standalone master and N workers from pyspark's distribution (its ``bin/spark-class`` and jars), so Java is the only
requirement, as for Spark itself. Point cdcsync at it with ``CDCSYNC__SPARK__MASTER=spark://127.0.0.1:17077``
(``cdcsync dev env`` prints it).

Each worker offers ``spark_worker_cores`` cores and ``spark_worker_memory`` to one executor per application. The
executors' Python workers run the interpreter the driver runs (``PYSPARK_PYTHON``, set by
:func:`cdcsync.runtime.spark.build_spark_session`), so on one machine the venv's cdcsync is what they import; on
other hosts the same cdcsync version must be installed there (the session checks it when it starts).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cdcsync.devstack.common import LOOPBACK, DevStackConfig, ServiceStatus
from cdcsync.devstack.service import Service, http_probe
from cdcsync.runtime.ivy import java_executable

MASTER = "spark-master"
WORKER_PREFIX = "spark-worker-"


def master_url(cfg: DevStackConfig) -> str:
    return f"spark://{LOOPBACK}:{cfg.spark_master_port}"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _daemon_env() -> dict[str, str]:
    java = Path(java_executable("the Spark standalone cluster"))
    env = dict(os.environ)
    env["SPARK_HOME"] = str(_spark_home())
    env["JAVA_HOME"] = str(java.resolve().parent.parent)
    env.setdefault("SPARK_DAEMON_MEMORY", "512m")
    return env


def _properties_file(home: Path) -> Path:
    """Each daemon gets a properties file of its own: its path in the command line is how we recognise it."""
    path = home / "spark-defaults.conf"
    home.mkdir(parents=True, exist_ok=True)
    if not path.is_file():
        path.write_text("# cdcsync dev stack: Spark standalone daemon settings\nspark.ui.showConsoleProgress false\n")
    return path


def started_workers(cfg: DevStackConfig) -> int:
    """How many workers ``up`` started (their pid files), so ``status``/``down`` find them."""
    if not cfg.root.is_dir():
        return 0
    return sum(1 for path in cfg.root.glob(f"{WORKER_PREFIX}*.pid"))


def master_was_started(cfg: DevStackConfig) -> bool:
    return cfg.pid_file(MASTER).is_file()


class SparkMaster(Service):
    name = MASTER
    log_name = "master.log"

    def __init__(self, cfg: DevStackConfig) -> None:
        super().__init__(
            cfg,
            marker=str(_properties_file(cfg.root / MASTER)),
            port=cfg.spark_master_port,
            address=master_url(cfg),
        )

    def ports(self) -> dict[str, int]:
        return {MASTER: self.cfg.spark_master_port, f"{MASTER} web UI": self.cfg.spark_master_webui_port}

    def launch(self) -> ServiceStatus:
        argv = [
            str(_spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--host",
            LOOPBACK,
            "--port",
            str(self.cfg.spark_master_port),
            "--webui-port",
            str(self.cfg.spark_master_webui_port),
            "--properties-file",
            self.marker,
        ]
        return self.spawn(argv, env=_daemon_env(), detail="Spark standalone master")

    def probe(self) -> str | None:
        return http_probe(f"http://{LOOPBACK}:{self.cfg.spark_master_webui_port}/json/")


class SparkWorker(Service):
    """Worker ``index`` (1-based); ready once the master lists it as ALIVE."""

    log_name = "worker.log"

    def __init__(self, cfg: DevStackConfig, index: int) -> None:
        self.index = index
        self.name = f"{WORKER_PREFIX}{index}"  # type: ignore[misc]  # one class, several named instances
        self.webui_port = cfg.spark_worker_webui_port + index - 1
        super().__init__(
            cfg,
            marker=str(_properties_file(cfg.root / self.name)),
            port=self.webui_port,
            address=f"http://{LOOPBACK}:{self.webui_port}",
        )

    def launch(self) -> ServiceStatus:
        argv = [
            str(_spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            LOOPBACK,
            "--cores",
            str(self.cfg.spark_worker_cores),
            "--memory",
            self.cfg.spark_worker_memory,
            "--webui-port",
            str(self.webui_port),
            "--work-dir",
            str(self.home / "work"),
            "--properties-file",
            self.marker,
            master_url(self.cfg),
        ]
        return self.spawn(argv, env=_daemon_env(), detail=f"{self.cfg.spark_worker_cores} core(s)")

    def probe(self) -> str | None:
        import urllib.error
        import urllib.request

        url = f"http://{LOOPBACK}:{self.cfg.spark_master_webui_port}/json/"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=3) as response:
                workers = json.load(response).get("workers", [])
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return f"master: {getattr(exc, 'reason', exc)}"
        alive = {w.get("webuiaddress") for w in workers if w.get("state") == "ALIVE"}
        return None if self.address in alive else "not registered with the master yet"


def services(cfg: DevStackConfig, workers: int) -> list[Service]:
    """The master and ``workers`` workers, in start order."""
    return [SparkMaster(cfg), *(SparkWorker(cfg, index) for index in range(1, workers + 1))]
