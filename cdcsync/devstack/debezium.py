"""Real Debezium for the dev stack: Kafka Connect standalone with the Debezium Postgres connector, on the local JVM.

Why real Debezium: cdcsync's promise is that a target equals its source after any workload, and only the real
connector shows what a Postgres source actually publishes (snapshot reads, primary-key changes as delete +
tombstone + create, logical types, LSNs). ``cdcsync dev up --with-debezium`` starts it next to the other services.

What runs: ``org.apache.kafka.connect.cli.ConnectStandalone`` of the broker's Kafka version, jars resolved from
Maven Central by Apache Ivy into the shared cache (offline after the first run, :mod:`cdcsync.runtime.jars`); the
connector's official plugin tarball, unpacked once, is linked into a plugin directory of its own under
``<state dir>/devstack/debezium/plugins`` with Apicurio's converter, so Connect loads them in plugin isolation, as
Debezium's container images do. Offsets live in a file next to it, so
a restarted worker resumes where it stopped. Standalone mode keeps connector configs in memory only, so ``up``
(re)registers the default connector through the REST API each time it finds it missing.

The default connector, ``cdcsync-source``, captures every table of schema ``public`` in the database
``cdcsync_source`` of the dev stack's Postgres (created on first start) with ``pgoutput``, publishing to
``cdcsync_source.public.<table>`` in JSON or (``devstack.debezium_format: avro``) in Avro: Apicurio's
AvroConverter, from the same plugin directory, writing the Confluent wire format with its schemas registered in
the dev stack's Apicurio Registry (see :func:`avro_converter_config`). Tests and differential checks register
connectors of their own with :func:`connector_config` and :func:`put_connector`, and wait for them with
:func:`wait_caught_up`.

Catching up is decided with a watermark, not by sleeping: :func:`emit_watermark` writes a transactional logical
decoding message (``pg_logical_emit_message``) into the source database's WAL, which pgoutput streams to Debezium
like any change (Postgres 14+). Connect commits a source offset only once every record before it was acked by
Kafka, so when the connector's committed offset reaches the watermark's LSN, every change committed before the
watermark is in Kafka.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdcsync.core.errors import ConfigError, ServiceError
from cdcsync.devstack import apicurio, postgres
from cdcsync.devstack.common import LOOPBACK, DevStackConfig, ServiceStatus, port_open
from cdcsync.devstack.service import Service
from cdcsync.runtime.ivy import java_executable

NAME = "debezium"
DEFAULT_CONNECTOR = "cdcsync-source"
DEFAULT_SLOT = "cdcsync_source"
DEFAULT_PUBLICATION = "cdcsync_source"
WATERMARK_PREFIX = "cdcsync.watermark"
CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
"""Apicurio's (``cdcsync.runtime.jars.APICURIO_CONVERTER_COORDINATES``), in the connector's plugin directory."""
SERVICE_MANIFESTS = {"org.apache.kafka.connect.storage.Converter": [AVRO_CONVERTER]}
"""ServiceLoader entries the plugin's jars lack (see :func:`_write_manifest_jar`)."""
VALUE_FORMATS = ("json", "avro")

# Connect plus Debezium is a small workload: a modest heap, the serial collector and C1 only keep start-up and
# CPU low on a shared two-core machine (throughput is bounded by Postgres and Kafka here, not by JIT quality).
JVM_OPTIONS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]

LOG4J2_PROPERTIES = """\
# cdcsync dev stack: Kafka Connect logs to stdout, which the dev stack appends to connect.log.
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.connect.name = org.apache.kafka.connect.runtime.Connect
logger.connect.level = INFO
logger.worker.name = org.apache.kafka.connect.runtime.Worker
logger.worker.level = INFO
logger.debezium.name = io.debezium
logger.debezium.level = INFO
"""


# ------------------------------------------------------------------------------------------------------ layout


def home(cfg: DevStackConfig) -> Path:
    return cfg.root / NAME


def worker_config_file(cfg: DevStackConfig) -> Path:
    return home(cfg) / "connect-standalone.properties"


def offsets_file(cfg: DevStackConfig) -> Path:
    return home(cfg) / "offsets.dat"


def plugin_dir(cfg: DevStackConfig) -> Path:
    return home(cfg) / "plugins"


def url(cfg: DevStackConfig) -> str:
    """Kafka Connect's REST API."""
    return f"http://{LOOPBACK}:{cfg.connect_port}"


def source_dsn(cfg: DevStackConfig) -> str:
    """The database the default connector captures: write to it, and Debezium publishes the changes."""
    return postgres.dsn(cfg, cfg.debezium_database)


def topic_prefix(cfg: DevStackConfig) -> str:
    return cfg.debezium_database


def was_started(cfg: DevStackConfig) -> bool:
    """Whether ``up --with-debezium`` ran here (a pid file exists): ``status``/``down`` only then report it."""
    return cfg.pid_file(NAME).exists()


# ------------------------------------------------------------------------------------------------- configuration


def worker_properties(cfg: DevStackConfig, overrides: Mapping[str, str] | None = None) -> str:
    """Standalone worker settings. Converters here are defaults; a connector config may override them.
    ``overrides`` win (a benchmark's worker, e.g. letting connectors override their consumers' settings)."""
    schemas = "true" if cfg.debezium_schemas_enable else "false"
    props = {
        "bootstrap.servers": f"{LOOPBACK}:{cfg.kafka_port}",
        "key.converter": JSON_CONVERTER,
        "value.converter": JSON_CONVERTER,
        "key.converter.schemas.enable": schemas,
        "value.converter.schemas.enable": schemas,
        "offset.storage.file.filename": str(offsets_file(cfg)),
        # Offsets are what :func:`wait_caught_up` watches; commit them often so waiting is short.
        "offset.flush.interval.ms": "500",
        "listeners": f"http://{LOOPBACK}:{cfg.connect_port}",
        "rest.advertised.host.name": LOOPBACK,
        "rest.advertised.port": str(cfg.connect_port),
        "plugin.path": str(plugin_dir(cfg)),
        # Debezium and Kafka's own plugins ship ServiceLoader manifests: no classpath scan, a faster start.
        "plugin.discovery": "service_load",
        "task.shutdown.graceful.timeout.ms": "10000",
    }
    props.update(overrides or {})
    return "".join(f"{key}={value}\n" for key, value in props.items())


def connector_config(
    *,
    database: str,
    topic_prefix: str,
    slot_name: str,
    publication_name: str,
    port: int,
    host: str = LOOPBACK,
    user: str = postgres.USER,
    password: str | None = None,
    tables: list[str] | None = None,
    schemas: list[str] | None = None,
    value_format: str = "json",
    schemas_enable: bool = True,
    schema_registry_url: str | None = None,
    overrides: dict[str, str] | None = None,
) -> dict[str, str]:
    """A Debezium Postgres connector config with the defaults cdcsync is tested against.

        ``tables`` (``schema.table``) makes a publication of exactly those tables (``filtered``); without it the
        publication covers all tables (``all_tables``, needs a superuser) so tables created later are captured too,
        and ``schemas`` (default ``public``) decides which of them Debezium publishes. Decimals stay exact
        (``precise``, which needs schemas in the JSON to carry the scale), times follow the column precision
        (``adaptive``), a new slot starts with a snapshot (``initial``), and truncates are published
    (``skipped.operations=none``; Debezium's default skips them). ``overrides`` win over everything.

        ``value_format="avro"`` writes keys and values with Apicurio's AvroConverter in the Confluent wire format,
        registering schemas in the Apicurio Registry whose Confluent-compatible API is at ``schema_registry_url`` (like
        the dev stack's; see :func:`avro_converter_config`); ``schemas_enable`` is then moot.
    """
    if value_format not in VALUE_FORMATS:
        raise ConfigError(
            f"Debezium value format {value_format!r} is not one of {', '.join(VALUE_FORMATS)}",
            hint="use json or avro",
        )
    if value_format == "avro" and not schema_registry_url:
        raise ConfigError("Debezium in Avro needs a schema registry URL", hint="pass schema_registry_url")
    config = {
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.dbname": database,
        "topic.prefix": topic_prefix,
        "slot.name": slot_name,
        "publication.name": publication_name,
        "publication.autocreate.mode": "filtered" if tables else "all_tables",
        "snapshot.mode": "initial",
        "decimal.handling.mode": "precise",
        "time.precision.mode": "adaptive",
        "tombstones.on.delete": "true",
        "skipped.operations": "none",  # Debezium skips truncates by default; cdcsync applies them in order
    }
    if value_format == "avro":
        assert schema_registry_url is not None
        config.update(avro_converter_config(schema_registry_url))
    else:
        config.update(
            {
                "key.converter": JSON_CONVERTER,
                "value.converter": JSON_CONVERTER,
                "key.converter.schemas.enable": "true" if schemas_enable else "false",
                "value.converter.schemas.enable": "true" if schemas_enable else "false",
            }
        )
    if password is not None:
        config["database.password"] = password
    if tables:
        config["table.include.list"] = ",".join(_include_pattern(t) for t in tables)
    else:
        config["schema.include.list"] = ",".join(_include_pattern(s) for s in schemas or ["public"])
    config.update(overrides or {})
    return config


def avro_converter_config(schema_registry_url: str) -> dict[str, str]:
    """Key and value converters writing what Confluent's AvroConverter writes (magic byte 0, 4-byte schema id,
    Avro body; subjects ``<topic>-key`` / ``<topic>-value``), with Apicurio's converter.

    ``schema_registry_url`` is Apicurio's Confluent-compatible API (``.../apis/ccompat/v7``); the converter talks
    to the v2 API of the same server. ``as-confluent`` makes the id 4 bytes after the magic byte,
    ``use-id=contentId`` makes it the id Apicurio's ccompat API serves at ``/schemas/ids/{id}`` (its default,
    non-legacy id mode), and ``headers.enabled=false`` keeps it in the body rather than in Kafka headers.
    """
    config: dict[str, str] = {}
    for side in ("key", "value"):
        prefix = f"{side}.converter"
        config[prefix] = AVRO_CONVERTER
        for option, value in (
            ("url", apicurio.v2_url(schema_registry_url)),
            ("auto-register", "true"),
            ("as-confluent", "true"),
            ("use-id", "contentId"),
            ("headers.enabled", "false"),
        ):
            config[f"{prefix}.apicurio.registry.{option}"] = value
    return config


def _include_pattern(name: str) -> str:
    """Debezium's include lists are regular expressions matched against the whole name: escape the dots."""
    return name.replace(".", r"\.")


def default_connector_config(cfg: DevStackConfig) -> dict[str, str]:
    return connector_config(
        database=cfg.debezium_database,
        topic_prefix=topic_prefix(cfg),
        slot_name=DEFAULT_SLOT,
        publication_name=DEFAULT_PUBLICATION,
        port=cfg.postgres_port,
        value_format=cfg.debezium_format,
        schemas_enable=cfg.debezium_schemas_enable,
        schema_registry_url=apicurio.url(cfg),
    )


# -------------------------------------------------------------------------------------------------- the process


@dataclass(frozen=True)
class ConnectPlugin:
    """One directory of the worker's plugin path: jars from the cache, loaded in their own plugin class loader."""

    name: str
    jars: Sequence[Path]
    manifests: Mapping[str, list[str]] = field(default_factory=dict)
    """ServiceLoader entries its jars lack (see :func:`_write_manifest_jar`); none for a complete tarball."""


def debezium_postgres_plugin(cfg: DevStackConfig) -> ConnectPlugin:
    """The default plugin: Debezium's Postgres connector with Apicurio's Avro converter (resolved on first use)."""
    from cdcsync.runtime.jars import debezium_postgres_plugin_jars

    return ConnectPlugin("debezium-connector-postgres", debezium_postgres_plugin_jars(cfg.cache_dir), SERVICE_MANIFESTS)


def _link_plugins(cfg: DevStackConfig, plugins: Sequence[ConnectPlugin]) -> None:
    """The plugin path as directories of symlinks into the cache, rebuilt on every start so upgrades (and plugins
    no longer asked for) leave no strays."""
    wanted = {plugin.name for plugin in plugins}
    if plugin_dir(cfg).is_dir():
        for stray in plugin_dir(cfg).iterdir():
            if stray.name not in wanted:
                shutil.rmtree(stray, ignore_errors=True)
    for plugin in plugins:
        _link_plugin(cfg, plugin)


def _link_plugin(cfg: DevStackConfig, plugin: ConnectPlugin) -> None:
    target = plugin_dir(cfg) / plugin.name
    scratch = target.with_name(target.name + ".new")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for jar in plugin.jars:
        (scratch / jar.name).symlink_to(jar)
    if plugin.manifests:
        _write_manifest_jar(scratch / "cdcsync-plugin-manifests.jar", plugin.manifests)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(scratch, target)


def _write_manifest_jar(path: Path, manifests: Mapping[str, list[str]]) -> None:
    """A jar of ``META-INF/services`` files only, for plugins whose jars ship none.

    The worker discovers plugins by ServiceLoader only (``plugin.discovery=service_load``, no slow classpath
    scan); Apicurio's converter jar has no manifest, so this adds one, as Kafka's ``connect-plugin-path
    sync-manifests`` tool would. Fixed timestamps keep the file identical from one start to the next.
    """
    import zipfile

    with zipfile.ZipFile(path, "w") as jar:
        for interface, classes in sorted(manifests.items()):
            info = zipfile.ZipInfo(f"META-INF/services/{interface}", date_time=(2020, 1, 1, 0, 0, 0))
            jar.writestr(info, "".join(f"{name}\n" for name in classes))


def _write_configs(cfg: DevStackConfig, overrides: Mapping[str, str] | None = None) -> None:
    home(cfg).mkdir(parents=True, exist_ok=True)
    files = {
        worker_config_file(cfg): worker_properties(cfg, overrides),
        home(cfg) / "log4j2.properties": LOG4J2_PROPERTIES,
    }
    for path, text in files.items():
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


class KafkaConnect(Service):
    """The Connect worker; ready (:meth:`wait_ready`) once its default connector runs, not merely its REST API.

    By default it carries the Debezium Postgres plugin with the dev stack's small-footprint JVM. A benchmark's
    worker passes other ``plugins``, ``worker_overrides`` (:func:`worker_properties`) and ``jvm_options``, and waits
    with :meth:`wait_rest_ready` only (no default connector).
    """

    name = NAME
    log_name = "connect.log"
    # SIGTERM lets the worker stop its tasks and commit their offsets; SIGKILL only if that takes too long.

    def __init__(
        self,
        cfg: DevStackConfig,
        *,
        plugins: Sequence[ConnectPlugin] | None = None,
        worker_overrides: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] | None = None,
    ) -> None:
        super().__init__(cfg, marker=str(worker_config_file(cfg)), port=cfg.connect_port, address=url(cfg))
        self.plugins = plugins
        self.worker_overrides = dict(worker_overrides or {})
        self.jvm_options = list(JVM_OPTIONS if jvm_options is None else jvm_options)

    def ports(self) -> dict[str, int]:
        return {f"{NAME} (Kafka Connect REST)": self.cfg.connect_port}

    def launch(self) -> ServiceStatus:
        """Resolve the jars (cached after the first run), lay out the plugin directory, launch detached.

        Kafka must already answer: the worker looks up the cluster id as it starts.
        """
        cfg = self.cfg
        if cfg.debezium_format not in VALUE_FORMATS:
            raise ConfigError(
                f"devstack.debezium_format {cfg.debezium_format!r} is not one of {', '.join(VALUE_FORMATS)}",
                hint="set CDCSYNC__DEVSTACK__DEBEZIUM_FORMAT to json or avro",
            )
        java = java_executable("Kafka Connect with Debezium")
        from cdcsync.runtime.jars import KAFKA_CONNECT_MAIN_CLASS, kafka_connect_jars

        classpath = os.pathsep.join(str(p) for p in kafka_connect_jars(cfg.cache_dir))
        _link_plugins(cfg, self.plugins if self.plugins is not None else [debezium_postgres_plugin(cfg)])
        _write_configs(cfg, self.worker_overrides)
        argv = [
            java,
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={(home(cfg) / 'log4j2.properties').as_uri()}",
            f"-Dkafka.logs.dir={home(cfg)}",
            "-cp",
            classpath,
            KAFKA_CONNECT_MAIN_CLASS,
            str(worker_config_file(cfg)),
        ]
        return self.spawn(argv)

    def probe(self) -> str | None:
        """The REST API answers with the worker's version, not merely that the port is bound."""
        if not port_open(self.cfg.connect_port):
            return "port not open yet"
        try:
            info = _rest("GET", url(self.cfg) + "/")
        except ServiceError as exc:
            return str(exc)
        return None if isinstance(info, dict) and info.get("version") else f"unexpected answer {info!r}"

    def wait_rest_ready(self, timeout_s: float | None = None) -> None:
        super().wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """REST up, source database there, default connector registered and running (its snapshot may still run)."""
        cfg = self.cfg
        budget = cfg.startup_timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        self.wait_rest_ready(budget)
        ensure_source_database(cfg)
        config = default_connector_config(cfg)
        if get_connector_config(url(cfg), DEFAULT_CONNECTOR) != config:
            put_connector(url(cfg), DEFAULT_CONNECTOR, config)
        wait_connector_running(url(cfg), DEFAULT_CONNECTOR, max(10.0, budget - (time.monotonic() - started)))


def ensure_source_database(cfg: DevStackConfig) -> None:
    """Create the captured database once, and check that the connector's user may replicate."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(postgres.dsn(cfg, "postgres"), connect_timeout=5, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (cfg.debezium_database,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(cfg.debezium_database)))
        ensure_replication_role(conn, postgres.USER)


def ensure_replication_role(conn: Any, role: str) -> None:
    """Debezium streams over a replication connection: its role needs REPLICATION (a superuser has it)."""
    from psycopg import sql

    row = conn.execute("SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    if row and row[0]:
        return
    try:
        conn.execute(sql.SQL("ALTER ROLE {} WITH REPLICATION").format(sql.Identifier(role)))
    except Exception as exc:
        raise ServiceError(
            f"Postgres role {role!r} lacks the REPLICATION attribute Debezium needs, and granting it failed: {exc}",
            hint=f"as a superuser: ALTER ROLE {role} WITH REPLICATION",
        ) from exc


# ------------------------------------------------------------------------------------------------ the REST API


def _rest(method: str, address: str, body: Any = None, *, timeout_s: float = 15.0) -> Any:
    """One call to Kafka Connect's REST API; JSON in and out. 404 answers None; other failures raise."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(address, data=data, method=method)
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            payload = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        detail = exc.read().decode(errors="replace")[:2000]
        with contextlib.suppress(ValueError, AttributeError):  # not Connect's JSON error: keep the raw text
            detail = json.loads(detail).get("message", detail)
        raise ServiceError(
            f"Kafka Connect {method} {address}: HTTP {exc.code}: {detail}",
            retriable=exc.code >= 500 or exc.code == 409,  # 409: a rebalance is in progress
        ) from exc
    except (OSError, urllib.error.URLError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ServiceError(
            f"Kafka Connect {method} {address}: {reason}",
            retriable=True,
            hint="is it running? `cdcsync dev up --with-debezium`, then `cdcsync dev status`",
        ) from exc
    return json.loads(payload) if payload else None


def _connector_url(connect_url: str, name: str, suffix: str = "") -> str:
    return f"{connect_url.rstrip('/')}/connectors/{urllib.parse.quote(name, safe='')}{suffix}"


def get_connector_config(connect_url: str, name: str) -> dict[str, str] | None:
    """The config Connect runs ``name`` with (without the ``name`` key Connect adds), or None if unknown."""
    config = _rest("GET", _connector_url(connect_url, name, "/config"))
    if config is None:
        return None
    return {key: value for key, value in config.items() if key != "name"}


def put_connector(connect_url: str, name: str, config: dict[str, str]) -> None:
    """Create ``name`` or replace its config (idempotent); Connect validates the config first."""
    _rest("PUT", _connector_url(connect_url, name, "/config"), config)


def delete_connector(connect_url: str, name: str) -> None:
    """Stop and forget ``name``; its replication slot stays in Postgres (see :func:`drop_replication_slot`)."""
    _rest("DELETE", _connector_url(connect_url, name))


def connector_status(connect_url: str, name: str) -> dict[str, Any] | None:
    status: dict[str, Any] | None = _rest("GET", _connector_url(connect_url, name, "/status"))
    return status


def _failure(name: str, status: dict[str, Any]) -> str | None:
    """The trace of a failed connector or task: Debezium's reason is in its first lines."""
    parts = [status.get("connector", {}), *status.get("tasks", [])]
    for part in parts:
        if part.get("state") == "FAILED":
            trace = str(part.get("trace", "")).strip().splitlines()
            return f"connector {name!r} failed: " + " | ".join(trace[:4])
    return None


def wait_connector_running(connect_url: str, name: str, timeout_s: float = 60.0) -> None:
    """Until the connector and its task report RUNNING; a FAILED one raises with Debezium's reason at once."""
    deadline = time.monotonic() + timeout_s
    last = "not registered"
    while True:
        status = connector_status(connect_url, name)
        if status is not None:
            failure = _failure(name, status)
            if failure:
                raise ServiceError(failure, hint=f"GET {_connector_url(connect_url, name, '/status')} for the trace")
            tasks = status.get("tasks", [])
            states = [status.get("connector", {}).get("state"), *(t.get("state") for t in tasks)]
            if tasks and all(state == "RUNNING" for state in states):
                return
            last = f"states {states}"
        if time.monotonic() > deadline:
            raise ServiceError(f"connector {name!r} is not running after {timeout_s:.0f}s ({last})", retriable=True)
        time.sleep(0.3)


def committed_offsets(connect_url: str, name: str) -> list[dict[str, Any]]:
    """The source offsets Connect has committed for ``name`` (Debezium's: ``lsn``, ``txId``, ``ts_usec`` ...)."""
    answer = _rest("GET", _connector_url(connect_url, name, "/offsets"))
    if not answer:
        return []
    return [entry.get("offset") or {} for entry in answer.get("offsets", [])]


# ------------------------------------------------------------------------------------------ waiting for catch-up


def emit_watermark(dsn: str) -> int:
    """Write a watermark into the source database's WAL and return its LSN (as a number, like Debezium's offsets).

    The message is transactional, so Debezium sees it at its commit, after every transaction committed before.
    """
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (pg_logical_emit_message(true, %s, now()::text) - '0/0'::pg_lsn)::bigint", (WATERMARK_PREFIX,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def wait_for_lsn(connect_url: str, name: str, lsn: int, timeout_s: float = 60.0) -> None:
    """Until ``name``'s committed offset has reached ``lsn``: everything before it is then acked by Kafka."""
    deadline = time.monotonic() + timeout_s
    reached: int | None = None
    while True:
        status = connector_status(connect_url, name)
        if status is None:
            raise ServiceError(f"connector {name!r} is not registered at {connect_url}")
        failure = _failure(name, status)
        if failure:
            raise ServiceError(failure)
        # Snapshot records carry the LSN the snapshot was taken at, which is also where the next WAL record (maybe
        # the watermark itself) goes: only a streamed record's offset proves the stream got that far.
        positions = [
            int(o["lsn"])
            for o in committed_offsets(connect_url, name)
            if o.get("lsn") is not None and not o.get("snapshot")
        ]
        reached = max(positions, default=None)
        if reached is not None and reached >= lsn:
            return
        if time.monotonic() > deadline:
            raise ServiceError(
                f"connector {name!r} has not published up to LSN {_format_lsn(lsn)} after {timeout_s:.0f}s "
                f"(committed offset: {'none' if reached is None else _format_lsn(reached)})",
                retriable=True,
                hint="check the Kafka Connect log for errors",
            )
        time.sleep(0.2)


def wait_snapshot_published(connect_url: str, name: str, timeout_s: float = 60.0) -> None:
    """Until the connector has committed an offset (its snapshot, if it had rows to read), writing nothing to
    the source: for tests that need the WAL position right after the snapshot untouched."""
    deadline = time.monotonic() + timeout_s
    while not committed_offsets(connect_url, name):
        if time.monotonic() > deadline:
            raise ServiceError(f"connector {name!r} has committed no offset after {timeout_s:.0f}s", retriable=True)
        time.sleep(0.2)


def wait_caught_up(connect_url: str, name: str, dsn: str, timeout_s: float = 60.0) -> int:
    """Until every change committed in ``dsn`` so far is in Kafka. Returns the watermark's LSN."""
    lsn = emit_watermark(dsn)
    wait_for_lsn(connect_url, name, lsn, timeout_s)
    return lsn


def _format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def drop_replication_slot(dsn: str, slot_name: str, timeout_s: float = 30.0) -> None:
    """Drop a connector's slot once its walsender is gone (a slot pins WAL and blocks ``DROP DATABASE``)."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)).fetchone()
            if row is None:
                return
            if not row[0]:
                try:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_name,))
                    return
                except psycopg.errors.ObjectInUse:
                    pass  # the walsender re-acquired it between our check and the drop
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"replication slot {slot_name!r} is still in use after {timeout_s:.0f}s",
                    hint="delete the connector that reads it first",
                )
            time.sleep(0.2)


def check_java() -> None:
    """Raise :class:`~cdcsync.core.errors.DependencyError` when no Java runtime is available (tests skip on it)."""
    java_executable("Kafka Connect with Debezium")
