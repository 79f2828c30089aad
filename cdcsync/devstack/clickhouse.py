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
import signal
import sys
import time
from pathlib import Path

import cdcsync
from cdcsync.core.errors import DependencyError
from cdcsync.devstack.common import (
    LOOPBACK,
    DevStackConfig,
    ServiceStatus,
    ensure_port_free,
    owned_pid,
    service_status,
    spawn,
    startup_failure,
    stop_pid,
)

NAME = "clickhouse"
USER = "default"
SERVER_MODULE = "cdcsync.devstack.clickhouse_server"
ENGINE_DISTRIBUTION = "chdb-core"


def home(cfg: DevStackConfig) -> Path:
    return cfg.root / NAME


def data_dir(cfg: DevStackConfig) -> Path:
    return home(cfg) / "data"


def log_file(cfg: DevStackConfig) -> Path:
    return home(cfg) / "clickhouse.log"


def url(cfg: DevStackConfig) -> str:
    """What clickhouse-connect (``get_client(dsn=...)``) and ``CDCSYNC__CLICKHOUSE__URL`` take."""
    return f"http://{USER}@{LOOPBACK}:{cfg.clickhouse_port}"


def _marker(cfg: DevStackConfig) -> str:
    return str(data_dir(cfg))


def status(cfg: DevStackConfig) -> ServiceStatus:
    return service_status(NAME, cfg, marker=_marker(cfg), port=cfg.clickhouse_port, address=url(cfg), log=log_file(cfg))


def _check_engine() -> None:
    """Locate chDB without importing it: the import loads a 500 MB library, which only the server should pay."""
    if importlib.util.find_spec("chdb") is None:
        raise DependencyError(
            "the ClickHouse engine for the dev stack (chDB) is not installed",
            hint=f"pip install {ENGINE_DISTRIBUTION} (cdcsync's dependencies pin the version)",
        )


def start(cfg: DevStackConfig) -> ServiceStatus:
    """Launch the server detached; it opens the engine first and only then listens. See :func:`wait_ready`."""
    current = status(cfg)
    if current.pid is not None:
        return current
    ensure_port_free(NAME, cfg.clickhouse_port)
    _check_engine()
    data_dir(cfg).mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        SERVER_MODULE,
        "--port",
        str(cfg.clickhouse_port),
        "--data-dir",
        str(data_dir(cfg)),
    ]
    # The server imports cdcsync from wherever this process did, installed or not (tests run from a checkout).
    package_root = str(Path(cdcsync.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    pid = spawn(argv, log_file=log_file(cfg), pid_file=cfg.pid_file(NAME), cwd=home(cfg), env=env)
    return ServiceStatus(NAME, "starting", pid, url(cfg), log_file(cfg), started=True, detail="chDB")


def _ping(cfg: DevStackConfig) -> str | None:
    """None when the server answers ``/ping`` as ClickHouse does, else what went wrong."""
    import urllib.error
    import urllib.request  # here, not at the top: 30 ms that `cdcsync --help` need not pay

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an HTTP_PROXY
    try:
        with opener.open(f"http://{LOOPBACK}:{cfg.clickhouse_port}/ping", timeout=3) as response:
            body = response.read()
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))
    return None if body.startswith(b"Ok.") else f"unexpected answer to /ping: {body[:80]!r}"


def wait_ready(cfg: DevStackConfig, timeout_s: float | None = None) -> None:
    """Ready when ``/ping`` answers; the server binds its port only after the engine has opened its data."""
    deadline = time.monotonic() + (cfg.startup_timeout_s if timeout_s is None else timeout_s)
    last = "no answer yet"
    while True:
        if owned_pid(cfg.pid_file(NAME), _marker(cfg)) is None:
            raise startup_failure(NAME, log_file(cfg), "the server process exited")
        problem = _ping(cfg)
        if problem is None:
            return
        last = problem
        if time.monotonic() > deadline:
            raise startup_failure(NAME, log_file(cfg), f"not answering at {url(cfg)}: {last}")
        time.sleep(0.1)


def stop(cfg: DevStackConfig) -> ServiceStatus:
    """SIGTERM lets the server finish requests in flight and close the engine cleanly; SIGKILL only after 30 s."""
    pid = owned_pid(cfg.pid_file(NAME), _marker(cfg))
    detail = None
    if pid is not None:
        killed = stop_pid(pid, first_signal=signal.SIGTERM, timeout_s=30)
        detail = "killed after timeout" if killed else "stopped"
    cfg.pid_file(NAME).unlink(missing_ok=True)
    return ServiceStatus(NAME, "stopped", None, url(cfg), log_file(cfg), detail=detail)
