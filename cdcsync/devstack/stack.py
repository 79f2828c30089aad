"""``cdcsync dev up | down | status | env``: the dev stack as a whole.

``up`` is idempotent and only ever starts what is not already running; ``down`` only stops processes whose pid
this module recorded (and whose command line still matches), so a developer's own Postgres or Kafka on the same
machine is never touched. Results are returned as data; the CLI decides how to render them.
"""

from __future__ import annotations

import contextlib
import fcntl
import shlex
from collections.abc import Callable, Iterator

from cdcsync.devstack import apicurio, clickhouse, debezium, kafka, postgres, spark
from cdcsync.devstack.common import DevStackConfig, ServiceStatus
from cdcsync.devstack.service import Service

ServiceKind = Callable[[DevStackConfig], Service]

# Start order; stopped in reverse so that clients (Kafka Connect later) go before what they depend on.
SERVICES: tuple[ServiceKind, ...] = (
    postgres.Postgres,
    kafka.KafkaBroker,
    apicurio.ApicurioRegistry,
    clickhouse.ClickHouse,
)

# Started only on request (``up(with_debezium=True)``), after the services above are ready: Kafka Connect looks
# up the Kafka cluster as it starts, and its connector needs Postgres. ``status``/``down`` include it when a pid
# file shows it was started.
DEBEZIUM: ServiceKind = debezium.KafkaConnect


@contextlib.contextmanager
def _locked(cfg: DevStackConfig) -> Iterator[None]:
    """Two concurrent ``up`` calls (parallel test sessions, two terminals) must not both start a service."""
    cfg.root.mkdir(parents=True, exist_ok=True)
    with open(cfg.root / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def up(cfg: DevStackConfig, *, with_debezium: bool = False, spark_workers: int = 0) -> dict[str, ServiceStatus]:
    """Start what is not running, then wait for every service to accept connections.

    All services are launched before any is waited for, so their start-up times overlap. A service that is
    already running is left alone (same pid), but is still checked for readiness. ``with_debezium`` then adds
    Kafka Connect with the Debezium Postgres connector; ``spark_workers`` > 0 a Spark standalone master and that
    many workers (:mod:`cdcsync.devstack.spark`).
    """
    with _locked(cfg):
        result = _start_and_wait([kind(cfg) for kind in SERVICES])
        if with_debezium:
            result.update(_start_and_wait([DEBEZIUM(cfg)]))
        if spark_workers:
            result.update(_start_and_wait(spark.services(cfg, spark_workers)))
        return result


def _start_and_wait(services: list[Service]) -> dict[str, ServiceStatus]:
    launched = {service.name: service.start() for service in services}
    result: dict[str, ServiceStatus] = {}
    for service in services:
        service.wait_ready()
        final = service.status()
        final.started = launched[service.name].started
        final.detail = launched[service.name].detail
        result[service.name] = final
    return result


def _present(cfg: DevStackConfig) -> list[Service]:
    """The services of this stack: the optional ones only once they were started."""
    kinds = (*SERVICES, DEBEZIUM) if debezium.was_started(cfg) else SERVICES
    present = [kind(cfg) for kind in kinds]
    if spark.master_was_started(cfg):
        present += spark.services(cfg, spark.started_workers(cfg))
    return present


def down(cfg: DevStackConfig) -> dict[str, ServiceStatus]:
    """Stop only what ``up`` started, newest first."""
    with _locked(cfg):
        return {service.name: service.stop() for service in reversed(_present(cfg))}


def status(cfg: DevStackConfig) -> dict[str, ServiceStatus]:
    return {service.name: service.status() for service in _present(cfg)}


def env_lines(cfg: DevStackConfig) -> list[str]:
    """Shell lines that point cdcsync's settings at this stack: ``eval "$(cdcsync dev env)"``."""
    values = {
        "CDCSYNC__POSTGRES__DSN": postgres.dsn(cfg),
        "CDCSYNC__KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers(cfg),
        "CDCSYNC__SCHEMA_REGISTRY__URL": apicurio.url(cfg),
        "CDCSYNC__CLICKHOUSE__URL": clickhouse.url(cfg),
    }
    if debezium.was_started(cfg):
        # Not cdcsync settings: where to write source changes and where Kafka Connect's REST API is.
        values["CDCSYNC_DEV_SOURCE_DSN"] = debezium.source_dsn(cfg)
        values["CDCSYNC_DEV_CONNECT_URL"] = debezium.url(cfg)
    if spark.master_was_started(cfg):
        values["CDCSYNC__SPARK__MASTER"] = spark.master_url(cfg)
    return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
