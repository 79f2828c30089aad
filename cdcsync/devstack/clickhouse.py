"""ClickHouse for the dev stack: the chDB engine (ClickHouse 26.x from the ``chdb-core`` wheel) served over the
ClickHouse HTTP interface by :mod:`cdcsync.devstack.clickhouse_server`.

No clickhouse-server that current clients work with installs without Docker, so the dev stack runs the real
engine in a Python process of its own instead; clickhouse-connect talks to it as to a server. It is a development
stand-in: no authentication (user ``default``, any password), no TLS, loopback only, one engine per data
directory. Tables live under ``<state_dir>/devstack/clickhouse/data`` and survive ``dev down`` / ``dev up``.

Unlike Postgres, the engine runs as root without complaint, so there is no switch to an unprivileged account.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import cdcsync
from cdcsync.core.errors import DependencyError
from cdcsync.devstack.common import LOOPBACK, DevStackConfig, ServiceStatus
from cdcsync.devstack.service import Service, http_probe

NAME = "clickhouse"
USER = "default"
SERVER_MODULE = "cdcsync.devstack.clickhouse_server"
ENGINE_DISTRIBUTION = "chdb-core"


def home(cfg: DevStackConfig) -> Path:
    return cfg.root / NAME


def data_dir(cfg: DevStackConfig) -> Path:
    return home(cfg) / "data"


def url(cfg: DevStackConfig) -> str:
    """What clickhouse-connect (``get_client(dsn=...)``) and ``CDCSYNC__CLICKHOUSE__URL`` take."""
    return f"http://{USER}@{LOOPBACK}:{cfg.clickhouse_port}"


def _check_engine() -> None:
    """Locate chDB without importing it: the import loads a 500 MB library, which only the server should pay."""
    if importlib.util.find_spec("chdb") is None:
        raise DependencyError(
            "the ClickHouse engine for the dev stack (chDB) is not installed",
            hint=f"pip install {ENGINE_DISTRIBUTION} (cdcsync's dependencies pin the version)",
        )


class ClickHouse(Service):
    name = NAME
    log_name = "clickhouse.log"
    # SIGTERM lets the server finish requests in flight and close the engine cleanly.
    poll_interval_s = 0.1

    def __init__(self, cfg: DevStackConfig) -> None:
        super().__init__(cfg, marker=str(data_dir(cfg)), port=cfg.clickhouse_port, address=url(cfg))

    def launch(self) -> ServiceStatus:
        """The server opens the engine first and only then listens."""
        _check_engine()
        data_dir(self.cfg).mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            SERVER_MODULE,
            "--port",
            str(self.cfg.clickhouse_port),
            "--data-dir",
            str(data_dir(self.cfg)),
        ]
        # The server imports cdcsync from wherever this process did, installed or not (tests run from a checkout).
        package_root = str(Path(cdcsync.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        return self.spawn(argv, env=env, detail="chDB")

    def probe(self) -> str | None:
        """Ready when ``/ping`` answers as ClickHouse does; the port opens only after the engine has its data."""
        return http_probe(f"http://{LOOPBACK}:{self.cfg.clickhouse_port}/ping", expect=b"Ok.")
