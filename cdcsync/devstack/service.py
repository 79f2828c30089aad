"""One dev-stack service: start detached, wait until it answers, report its status, stop it by its own pid.

Every service of the dev stack (Postgres, Kafka, Apicurio Registry, ClickHouse, Kafka Connect with Debezium) is a
subclass that says only what differs: how to prepare and launch its process, what identifies that process
(``marker``, a path in its command line), which ports it binds, and how to tell that it is ready (``probe``).
Start-up, the readiness loop, pid ownership checks and shutdown are written once, here.
"""

from __future__ import annotations

import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from cdcsync.devstack.common import (
    DevStackConfig,
    ServiceStatus,
    ensure_port_free,
    owned_pid,
    port_open,
    spawn,
    startup_failure,
    stop_pid,
)


class Service(ABC):
    """A long-lived process of the dev stack, found again through ``<state_dir>/devstack/<name>.pid``."""

    name: ClassVar[str]
    log_name: ClassVar[str]
    """The log file's name inside :attr:`home`."""
    stop_signal: ClassVar[int] = signal.SIGTERM
    stop_timeout_s: ClassVar[float] = 30.0
    poll_interval_s: ClassVar[float] = 0.3

    def __init__(self, cfg: DevStackConfig, *, marker: str, port: int, address: str) -> None:
        self.cfg = cfg
        self.marker = marker
        """A string only this service's command line contains (its data directory or config file)."""
        self.port = port
        """The port clients use; open means at least "starting"."""
        self.address = address
        """What a client is given (a DSN, a URL, bootstrap servers)."""

    # ------------------------------------------------------------------------------- what each service says

    @property
    def home(self) -> Path:
        return self.cfg.root / self.name

    @property
    def log_file(self) -> Path:
        return self.home / self.log_name

    def ports(self) -> dict[str, int]:
        """Every port it binds, by a label for the "already in use" error."""
        return {self.name: self.port}

    @abstractmethod
    def launch(self) -> ServiceStatus:
        """Prepare (configs, data directory, jars) and spawn the process with :meth:`spawn`; do not wait."""

    @abstractmethod
    def probe(self) -> str | None:
        """None once clients can use the service, else what is still missing (quoted on a time-out)."""

    # ------------------------------------------------------------------------------------------ the lifecycle

    def pid(self) -> int | None:
        return owned_pid(self.cfg.pid_file(self.name), self.marker)

    def status(self) -> ServiceStatus:
        """Running, starting (ours, port not open yet), stopped, or port-busy (someone else holds the port)."""
        pid = self.pid()
        if pid is None:
            state = "port-busy" if port_open(self.port) else "stopped"
            return ServiceStatus(self.name, state, None, self.address, self.log_file)
        state = "running" if port_open(self.port) else "starting"
        return ServiceStatus(self.name, state, pid, self.address, self.log_file)

    def start(self) -> ServiceStatus:
        """Launch unless our process already runs (then its status, same pid). Returns without waiting."""
        current = self.status()
        if current.pid is not None:
            return current
        for label, port in self.ports().items():
            ensure_port_free(label, port)
        return self.launch()

    def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        user: tuple[int, int] | None = None,
        detail: str | None = None,
    ) -> ServiceStatus:
        self.home.mkdir(parents=True, exist_ok=True)
        pid = spawn(
            argv,
            log_file=self.log_file,
            pid_file=self.cfg.pid_file(self.name),
            cwd=cwd or self.home,
            env=env,
            user=user,
        )
        return ServiceStatus(self.name, "starting", pid, self.address, self.log_file, started=True, detail=detail)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until :meth:`probe` says ready; fails at once, quoting the log, if the process exits meanwhile."""
        deadline = time.monotonic() + (self.cfg.startup_timeout_s if timeout_s is None else timeout_s)
        last = "no answer yet"
        while True:
            if self.pid() is None:
                raise startup_failure(self.name, self.log_file, "the process exited")
            problem = self.probe()
            if problem is None:
                return
            last = problem
            if time.monotonic() > deadline:
                raise startup_failure(self.name, self.log_file, f"not ready at {self.address}: {last}")
            time.sleep(self.poll_interval_s)

    def stop(self) -> ServiceStatus:
        """Signal politely (:attr:`stop_signal`), SIGKILL the process group only after :attr:`stop_timeout_s`."""
        pid = self.pid()
        detail = None
        if pid is not None:
            killed = stop_pid(pid, first_signal=self.stop_signal, timeout_s=self.stop_timeout_s)
            detail = "killed after timeout" if killed else "stopped"
        self.cfg.pid_file(self.name).unlink(missing_ok=True)
        return ServiceStatus(self.name, "stopped", None, self.address, self.log_file, detail=detail)


def http_probe(url: str, *, expect: bytes | None = None, timeout_s: float = 3.0) -> str | None:
    """None when ``url`` answers 2xx (starting with ``expect`` if given), else what went wrong. Never via a proxy."""
    import urllib.error
    import urllib.request  # here, not at the top: 30 ms that `cdcsync --help` need not pay

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            body: bytes = response.read()
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))
    if expect is not None and not body.startswith(expect):
        return f"unexpected answer from {url}: {body[:80]!r}"
    return None
