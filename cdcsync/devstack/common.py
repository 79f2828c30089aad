"""What the dev-stack services share: configuration, status records, pid files and process control.

The services are plain OS processes started in their own session, so they outlive the ``cdcsync dev up``
invocation that started them. Everything needed to find them again lives under ``<state_dir>/devstack``: one
``<service>.pid`` file each. A pid alone is not proof of identity (pids are reused after a reboot), so every
check also looks for a service-specific marker (its data directory or config file) in the process command line
before trusting, let alone signalling, a pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from cdcsync.config.settings import DevStackSettings
from cdcsync.core.errors import ServiceError

_DEFAULTS = DevStackSettings()
"""The ports and names the settings default to: one place for both."""

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class DevStackConfig:
    """Where the dev stack keeps its state and which loopback ports it binds."""

    state_dir: Path
    postgres_port: int = _DEFAULTS.postgres_port
    kafka_port: int = _DEFAULTS.kafka_port
    kafka_controller_port: int = _DEFAULTS.kafka_controller_port
    clickhouse_port: int = _DEFAULTS.clickhouse_port
    schema_registry_port: int = _DEFAULTS.schema_registry_port
    connect_port: int = _DEFAULTS.connect_port
    """Kafka Connect's REST API, for ``dev up --with-debezium``."""
    debezium_database: str = _DEFAULTS.debezium_database
    """The database the default Debezium connector captures; also its topic prefix."""
    debezium_format: str = _DEFAULTS.debezium_format
    debezium_schemas_enable: bool = _DEFAULTS.debezium_schemas_enable
    """JsonConverter ``schemas.enable``: the schema/payload wrapper that carries decimal scales."""
    spark_master_port: int = _DEFAULTS.spark_master_port
    spark_master_webui_port: int = _DEFAULTS.spark_master_webui_port
    spark_worker_webui_port: int = _DEFAULTS.spark_worker_webui_port
    spark_worker_cores: int = _DEFAULTS.spark_worker_cores
    spark_worker_memory: str = _DEFAULTS.spark_worker_memory
    startup_timeout_s: float = 120.0
    cache_dir: Path | None = None
    """Where downloaded JVM artifacts are cached; None: :func:`cdcsync.runtime.ivy.cache_root`."""

    @property
    def root(self) -> Path:
        # Absolute: the path is handed to services that run in another working directory, and is matched
        # against their command lines to recognise them later.
        return Path(self.state_dir).absolute() / "devstack"

    def pid_file(self, service: str) -> Path:
        return self.root / f"{service}.pid"


@dataclass
class ServiceStatus:
    """One service as ``up``/``status``/``down`` see it; ``state`` is running, starting, stopped or port-busy."""

    name: str
    state: str
    pid: int | None
    address: str
    log_file: Path
    started: bool = False
    detail: str | None = None

    @property
    def running(self) -> bool:
        return self.state == "running"

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["running"] = self.running
        data["log_file"] = str(self.log_file)
        return data


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
        return int(text.split()[0]) if text else None
    except (OSError, ValueError):
        return None


def write_pid(pid_file: Path, pid: int) -> None:
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = pid_file.with_name(pid_file.name + ".tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, pid_file)


def _reap(pid: int) -> None:
    """A service started by this very process becomes a zombie when it exits; collect it so it really goes."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def process_command_line(pid: int) -> str | None:
    """The command line of a live (non-zombie) process, or None when it is gone."""
    _reap(pid)
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            # The command line reads empty while a just-spawned child is still inside execve (Popen can return
            # before the new image's arguments are in place) and while a process exits: wait for either to settle.
            for _ in range(100):
                stat = (proc / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return None
                cmdline = (proc / "cmdline").read_bytes()
                if cmdline:
                    return cmdline.replace(b"\0", b" ").decode(errors="replace")
                time.sleep(0.01)
            return ""
        except (OSError, IndexError):
            return None
    try:  # macOS and friends: no /proc
        argv = ["ps", "-o", "stat=,command=", "-p", str(pid)]
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError:
        return None
    line = out.stdout.strip()
    if out.returncode != 0 or not line or line.startswith("Z"):
        return None
    return line.split(None, 1)[1] if " " in line else ""


def owned_pid(pid_file: Path, marker: str) -> int | None:
    """The recorded pid if that process is alive and is ours (its command line mentions ``marker``)."""
    pid = read_pid(pid_file)
    if pid is None:
        return None
    cmdline = process_command_line(pid)
    if cmdline is None or marker not in cmdline:
        return None
    return pid


def spawn(
    argv: Sequence[str],
    *,
    log_file: Path,
    pid_file: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
    user: tuple[int, int] | None = None,
) -> int:
    """Start a long-lived service detached from this process (new session), output appended to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        try:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                user=user[0] if user else None,
                group=user[1] if user else None,
                extra_groups=[] if user else None,
            )
        except OSError as exc:
            raise ServiceError(f"starting {argv[0]}: {exc}") from exc
    write_pid(pid_file, process.pid)
    # The Popen object is dropped on purpose: the service must outlive us, and subprocess reaps it lazily.
    return process.pid


def stop_pid(pid: int, *, first_signal: int = signal.SIGTERM, timeout_s: float = 30.0) -> bool:
    """Signal politely, wait, then SIGKILL the whole process group. Returns True if it had to kill."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, first_signal)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_command_line(pid) is None:
            return False
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        # Started with start_new_session, so the service leads its own group; take its children with it.
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        if process_command_line(pid) is None:
            break
        time.sleep(0.1)
    return True


def log_tail(log_file: Path, lines: int = 20) -> str:
    try:
        content = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(content[-lines:])


def startup_failure(service: str, log_file: Path, reason: str) -> ServiceError:
    """A start failure is only actionable with the service's own words, so quote the end of its log."""
    tail = log_tail(log_file)
    message = f"{service} did not start: {reason} (log: {log_file})"
    if tail:
        message += "\n--- last lines of the log ---\n" + tail
    return ServiceError(message, hint=f"read {log_file}; `cdcsync dev down` then `cdcsync dev up` to retry")


def ensure_port_free(service: str, port: int) -> None:
    if port_open(port):
        raise ServiceError(
            f"{service}: port {LOOPBACK}:{port} is already in use by a process the dev stack did not start",
            hint="stop that process, or configure a different port for the dev stack",
        )
