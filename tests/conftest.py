"""Shared fixtures: real services for integration and end-to-end tests, started once per test session.

Where the services come from:

* default: the dev stack (``cdcsync.devstack``: embedded Postgres, a KRaft Kafka broker on the local JVM and
  ClickHouse's engine from chDB behind the HTTP interface), started in a temporary state directory on ports of its
  own, so a developer's running ``cdcsync dev up`` is never touched;
* ``CDCSYNC_TEST_STACK=containers``: the same services as containers through testcontainers (needs Docker): the
  pinned public images of ``PUBLIC_IMAGES`` (there ClickHouse is a real clickhouse-server), or others named by
  ``CDCSYNC_TEST_POSTGRES_IMAGE`` / ``..._KAFKA_IMAGE`` / ``..._SCHEMA_REGISTRY_IMAGE`` / ``..._CLICKHOUSE_IMAGE``
  (``make container-images`` builds local ones where no registry is reachable; ``make containers-smoke`` runs
  a subset of the tests on them);
* ``CDCSYNC_TEST_POSTGRES_DSN`` / ``CDCSYNC_TEST_KAFKA_BOOTSTRAP`` / ``CDCSYNC_TEST_CLICKHOUSE_URL``: services you
  already run (``eval "$(cdcsync dev env)"`` prints the dev stack's).

The schema registry is the dev stack's Apicurio Registry (port 28081, its Confluent-compatible API at
``/apis/ccompat/v7``), with containers an Apicurio Registry container (in-memory storage), or
``CDCSYNC_TEST_SCHEMA_REGISTRY_URL``.

Real Debezium (Kafka Connect standalone with the Debezium Postgres connector, ``cdcsync.devstack.debezium``) is
started only for tests that ask for ``debezium_connect`` / ``debezium_source``, on port 28083
(``CDCSYNC_TEST_CONNECT_PORT``; under pytest-xdist each worker on its own, that port plus the worker's number),
against the session's Postgres and Kafka; ``CDCSYNC_TEST_CONNECT_URL`` names a Connect worker you already run (it
must reach the same Postgres and Kafka).

``make test`` runs two pytest-xdist workers (``-n 2 --dist loadgroup``). They share one dev stack: the controller
names its directory, the first worker that needs a service starts it, the controller stops it at the end. Tests
that start services on fixed ports of their own (``tests/faults``) form one xdist group, so one worker runs them one
after another; the fault figures travel to the controller with the test reports.

Tests are marked by directory (``unit``, ``integration``, ``e2e``) so ``pytest -m unit`` needs no services.
``faults`` tests (``tests/faults/``: the real CLI while something fails) are end-to-end tests too: they carry both
``faults`` and ``e2e``, so ``make test`` and ``make e2e`` run them and ``make faults`` runs only them. Their long
variants (1M changes, 100 kills, 60 s outages) also carry ``soak``: ``make test``, ``make e2e`` and ``make faults``
leave them out, ``make soak`` runs only them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.ports import free_port

if TYPE_CHECKING:
    from cdcsync.devstack import DevStackConfig

TESTS_DIR = Path(__file__).parent
PUBLIC_IMAGES = {
    "postgres": "postgres:16.4-alpine",
    "kafka": "apache/kafka:3.9.1",
    "schema_registry": "apicurio/apicurio-registry-mem:2.6.13.Final",
    "clickhouse": "clickhouse/clickhouse-server:24.8",
}
"""The images ``CDCSYNC_TEST_STACK=containers`` runs unless ``CDCSYNC_TEST_<SERVICE>_IMAGE`` names another; the same
pins as compose/docker-compose.yml."""


_TIER_MARKERS = {
    "unit": ("unit",),
    "integration": ("integration",),
    "e2e": ("e2e",),
    "faults": ("faults", "e2e"),
}
"""The markers of the tests in each directory under ``tests/``."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouped = config.pluginmanager.hasplugin("xdist")
    # integration modules where a test uses the session's SparkSession: one worker runs them all, so the run starts
    # one Spark JVM (about 15 s of CPU and a 1 GB heap that lives until the session ends), not one per worker
    on_spark = {item.fspath for item in items if "spark" in getattr(item, "fixturenames", ())}
    for item in items:
        path = Path(str(item.fspath)).relative_to(TESTS_DIR)
        for marker in _TIER_MARKERS.get(path.parts[0], ()):
            if not any(item.iter_markers(name=marker)):
                item.add_marker(getattr(pytest.mark, marker))
        if grouped and any(path.as_posix().startswith(prefix) for prefix in _FIXED_PORT_PATHS):
            item.add_marker(pytest.mark.xdist_group(_FIXED_PORT_GROUP))
        elif grouped and path.parts[0] == "integration":
            # an integration module's tests may build on each other's effects (test_devstack: up, then down, then
            # what down kept), so each module runs whole on one worker
            item.add_marker(pytest.mark.xdist_group(_SPARK_GROUP if item.fspath in on_spark else path.as_posix()))
    if hasattr(config, "workerinput"):
        # the fixed-port group is the longest unit of work (minutes): handed out first, it cannot be the run's tail
        items.sort(key=lambda item: _xdist_group(item) != _FIXED_PORT_GROUP)


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """On the controller: a test of the fixed-port group whose id lacks xdist's ``@group`` suffix would be handed
    out like any other, and two workers would each start the fault suite's private services on the same ports and
    fail at random. It happened: pytest 9.2 keeps ids where pytest-xdist 3.8 cannot add the suffix, and before that
    the grouping hook ran after xdist's. Stop the run and say so."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    prefixes = tuple(f"{TESTS_DIR.name}/{path}" for path in _FIXED_PORT_PATHS)
    ungrouped = [nodeid for nodeid in ids if nodeid.startswith(prefixes) and "@" not in nodeid]
    if ungrouped:
        pytest.exit(
            f"pytest-xdist did not group {len(ungrouped)} fixed-port test(s), e.g. {ungrouped[0]}: check the pytest "
            "and pytest-xdist versions pinned in pyproject.toml",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def _xdist_group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return None if marker is None else str(marker.args[0] if marker.args else marker.kwargs.get("name"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """``CDCSYNC_TEST_NO_SKIPS=1`` (``make containers-smoke``): a skipped test fails the run, so that a smoke test
    whose Debezium could not start does not pass as green."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if os.environ.get("CDCSYNC_TEST_NO_SKIPS") and reporter is not None and reporter.stats.get("skipped"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


FIGURES_PROPERTY = "fault_figures"
"""The name of a fault figures row in a test report's ``user_properties``."""
_FAULT_FIGURES: list[dict[str, Any]] = []
"""The fault tests' figures rows (``tests/faults/harness.py``), gathered from test reports (xdist's workers' too)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _FAULT_FIGURES.extend(value for name, value in report.user_properties if name == FIGURES_PROPERTY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault figures table at the end of a session that ran fault tests: ``make faults`` shows it,
    ``docs/operations.md`` keeps it."""
    if _FAULT_FIGURES:
        from tests.faults.harness import Figures, figures_table

        terminalreporter.section("fault figures")
        terminalreporter.write_line(figures_table([Figures(**row) for row in _FAULT_FIGURES]))


@dataclass(frozen=True)
class Services:
    postgres_dsn: str
    """DSN of the server's maintenance database; tests get their own database from ``postgres_dsn``."""
    bootstrap_servers: str
    clickhouse_url: str = ""
    """ClickHouse HTTP interface as a clickhouse-connect DSN (``http://user[:password]@host:port``); empty when
    services were given without ``CDCSYNC_TEST_CLICKHOUSE_URL``."""
    schema_registry_url: str = ""
    """A Confluent-compatible schema registry; empty when services were given without
    ``CDCSYNC_TEST_SCHEMA_REGISTRY_URL`` (the ``schema_registry_url`` fixture then starts an Apicurio of its own)."""


def _dev_stack_config(state_dir: Path) -> DevStackConfig:
    from cdcsync.devstack import DevStackConfig

    return DevStackConfig(
        state_dir=state_dir,
        postgres_port=25441,  # below the ephemeral range, as tests/ports.py says
        kafka_port=29192,
        kafka_controller_port=29193,
        clickhouse_port=28123,
        schema_registry_port=28081,
    )


def _dev_stack_services(config: DevStackConfig) -> Services:
    from cdcsync.devstack import apicurio

    return Services(
        postgres_dsn=f"postgresql://cdcsync@127.0.0.1:{config.postgres_port}/cdcsync",
        bootstrap_servers=f"127.0.0.1:{config.kafka_port}",
        clickhouse_url=f"http://default@127.0.0.1:{config.clickhouse_port}",
        schema_registry_url=apicurio.url(config),
    )


def _dev_stack(tmp_root: Path) -> Iterator[Services]:
    from cdcsync.devstack import down, up

    config = _dev_stack_config(tmp_root)
    up(config)
    try:
        yield _dev_stack_services(config)
    finally:
        down(config)


# ------------------------------------------------------------------------------ pytest-xdist (make test's -n 2)

_SHARED_STACK_ENV = "CDCSYNC_TEST_SHARED_STACK_DIR"
"""Set by the xdist controller for its workers: where the one dev stack of the whole run lives."""
_SHARED_STACK_KEY = pytest.StashKey[Path]()
_FIXED_PORT_GROUP = "fixed_ports"
"""The xdist group of tests that start services on fixed ports of their own (the fault suite's private stack, the
Spark cluster): one worker runs them all, one after another."""
_FIXED_PORT_PATHS = ("faults", "e2e/test_spark_cluster.py")
_SPARK_GROUP = "spark_session"
"""The xdist group of the integration modules that use the ``spark`` fixture (a session's SparkSession)."""


def _services_given() -> bool:
    return bool(os.environ.get("CDCSYNC_TEST_POSTGRES_DSN") and os.environ.get("CDCSYNC_TEST_KAFKA_BOOTSTRAP"))


def _xdist_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def xdist_worker_index() -> int:
    """0 outside xdist and on its first worker (``gw0``), 1 on ``gw1``, ...: for ports each worker needs alone."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist the workers share one dev stack (its ports are fixed): the controller names its directory
    here, the first worker that needs services starts it (:func:`_shared_dev_stack`), and the controller stops it
    when the run ends, after every worker is done with it."""
    if _xdist_controller(config) and not _services_given() and os.environ.get("CDCSYNC_TEST_STACK") != "containers":
        root = Path(tempfile.mkdtemp(prefix="cdcsync-test-stack-"))
        os.environ[_SHARED_STACK_ENV] = str(root)  # workers start after this hook and inherit the environment
        config.stash[_SHARED_STACK_KEY] = root


def pytest_unconfigure(config: pytest.Config) -> None:
    root = config.stash.get(_SHARED_STACK_KEY, None)
    if root is None:
        return
    if (root / "stack").exists():
        from cdcsync.devstack import down

        down(_dev_stack_config(root / "stack"))
    shutil.rmtree(root, ignore_errors=True)


def _shared_dev_stack(root: Path) -> Services:
    """The run's dev stack, started by the first worker to get here (the others wait on the lock, then reuse it)."""
    import fcntl

    from cdcsync.devstack import up

    config = _dev_stack_config(root / "stack")
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = root / "started"
        if not started.exists():
            (root / "stack").mkdir(exist_ok=True)
            up(config)
            started.touch()
    return _dev_stack_services(config)


def container_image(service: str) -> str:
    """``CDCSYNC_TEST_<SERVICE>_IMAGE``, else the pinned public image."""
    return os.environ.get(f"CDCSYNC_TEST_{service.upper()}_IMAGE") or PUBLIC_IMAGES[service]


def kafka_container_environment(host_port: int) -> dict[str, str]:
    """One KRaft node configured the apache/kafka image's way (the local image reads the same variables).

    Clients reach the broker through Docker's port mapping, so its client listener is advertised at the host port
    it is bound to, fixed before the container starts; the broker talks to itself on a listener of its own.
    """
    return {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,BROKER://:9094,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{host_port},BROKER://localhost:9094",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "BROKER",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_NUM_PARTITIONS": "4",  # as the dev stack's broker
    }


def _containers() -> Iterator[Services]:
    from testcontainers.community.clickhouse import ClickHouseContainer
    from testcontainers.community.postgres import PostgresContainer
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import HttpWaitStrategy, LogMessageWaitStrategy

    # Creating a container copies its whole image on Docker's vfs storage driver (where no overlay file system is
    # available): minutes for the 2 GB ClickHouse stand-in on a loaded machine, past docker-py's 60 s default.
    client = {"docker_client_kw": {"timeout": 600}}
    postgres = PostgresContainer(
        container_image("postgres"), username="cdcsync", password="cdcsync", dbname="cdcsync", driver=None, **client
    )
    postgres.with_command("postgres -c wal_level=logical -c max_replication_slots=10 -c max_connections=200")
    kafka_port = free_port()
    kafka = DockerContainer(container_image("kafka"), **client).with_bind_ports(9092, kafka_port)
    for name, value in kafka_container_environment(kafka_port).items():
        kafka.with_env(name, value)
    kafka.waiting_for(LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(180))
    registry = (
        DockerContainer(container_image("schema_registry"), **client)
        .with_exposed_ports(8080)
        .waiting_for(HttpWaitStrategy(8080, "/apis/ccompat/v7/subjects").for_status_code(200).with_startup_timeout(180))
    )
    clickhouse = ClickHouseContainer(
        container_image("clickhouse"), username="cdcsync", password="cdcsync", dbname="cdcsync", **client
    )
    # Started side by side (each start waits until its service is ready); stop() also removes one that failed.
    containers = (postgres, kafka, clickhouse, registry)
    with contextlib.ExitStack() as stack:
        for container in containers:
            stack.callback(container.stop)
        with concurrent.futures.ThreadPoolExecutor(len(containers)) as pool:
            for started in [pool.submit(container.start) for container in containers]:
                started.result()
        registry_url = f"http://{registry.get_container_host_ip()}:{registry.get_exposed_port(8080)}/apis/ccompat/v7"
        http_port = clickhouse.get_exposed_port(8123)  # the container's get_connection_url() is the native port
        yield Services(
            postgres_dsn=postgres.get_connection_url(),
            bootstrap_servers=f"127.0.0.1:{kafka_port}",
            clickhouse_url=f"http://cdcsync:cdcsync@{clickhouse.get_container_host_ip()}:{http_port}",
            schema_registry_url=registry_url,
        )


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    given_dsn = os.environ.get("CDCSYNC_TEST_POSTGRES_DSN")
    given_kafka = os.environ.get("CDCSYNC_TEST_KAFKA_BOOTSTRAP")
    if given_dsn and given_kafka:
        yield Services(
            given_dsn,
            given_kafka,
            os.environ.get("CDCSYNC_TEST_CLICKHOUSE_URL", ""),
            schema_registry_url=os.environ.get("CDCSYNC_TEST_SCHEMA_REGISTRY_URL", ""),
        )
    elif os.environ.get("CDCSYNC_TEST_STACK") == "containers":
        yield from _containers()
    elif os.environ.get(_SHARED_STACK_ENV):
        yield _shared_dev_stack(Path(os.environ[_SHARED_STACK_ENV]))
    else:
        # Not under pytest's basetemp: a second pytest session rotates old basetemps away, and must not delete
        # the data directory of a Postgres this session is still using.
        state_dir = Path(tempfile.mkdtemp(prefix="cdcsync-test-stack-"))
        try:
            yield from _dev_stack(state_dir)
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture()
def postgres_dsn(services: Services) -> Iterator[str]:
    """A fresh, empty database per test, dropped afterwards."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(services.postgres_dsn, dbname=name)
    finally:
        with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@dataclass(frozen=True)
class ClickHouseDatabase:
    """A database of its own for one test, on the session's ClickHouse."""

    url: str
    """The server, as a clickhouse-connect DSN (no database in it)."""
    database: str

    def client(self, **kwargs: Any) -> Any:
        """A clickhouse-connect client whose default database is this one; ``kwargs`` go to ``get_client``."""
        import clickhouse_connect

        return clickhouse_connect.get_client(dsn=self.url, database=self.database, **kwargs)


@pytest.fixture()
def clickhouse_database(services: Services) -> Iterator[ClickHouseDatabase]:
    """A fresh, empty ClickHouse database per test, dropped afterwards."""
    import clickhouse_connect

    if not services.clickhouse_url:
        pytest.fail(
            "CDCSYNC_TEST_POSTGRES_DSN and CDCSYNC_TEST_KAFKA_BOOTSTRAP are set but CDCSYNC_TEST_CLICKHOUSE_URL is "
            "not: set it too (`cdcsync dev env` prints the dev stack's CDCSYNC__CLICKHOUSE__URL)"
        )
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = clickhouse_connect.get_client(dsn=services.clickhouse_url)
    try:
        admin.command(f"CREATE DATABASE `{name}`")
        yield ClickHouseDatabase(url=services.clickhouse_url, database=name)
    finally:
        admin.command(f"DROP DATABASE IF EXISTS `{name}` SYNC")
        admin.close()


@pytest.fixture(scope="session")
def schema_registry_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The session's schema registry: ``CDCSYNC_TEST_SCHEMA_REGISTRY_URL``, else the one of ``services``, else
    (services given without a registry) the dev stack's Apicurio Registry alone, on a free port in a temporary
    directory."""
    given = os.environ.get("CDCSYNC_TEST_SCHEMA_REGISTRY_URL")
    if given:
        yield given
        return
    services: Services = request.getfixturevalue("services")
    if services.schema_registry_url:
        yield services.schema_registry_url
        return
    from cdcsync.devstack import DevStackConfig
    from cdcsync.devstack.apicurio import ApicurioRegistry

    state_dir = Path(tempfile.mkdtemp(prefix="cdcsync-test-registry-"))
    registry = ApicurioRegistry(DevStackConfig(state_dir=state_dir, schema_registry_port=free_port()))
    registry.start()
    try:
        registry.wait_ready(180)
        yield registry.address
    finally:
        registry.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture()
def kafka_bootstrap(services: Services) -> str:
    return services.bootstrap_servers


@pytest.fixture()
def topic_name() -> str:
    """A topic name of its own per test, so tests never see each other's messages."""
    return f"test.public.orders_{uuid.uuid4().hex[:10]}"


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Any]:
    """Every message of ``topic``, partition by partition in offset order, as a consumer with ``isolation`` (Kafka's
    ``isolation.level``) sees it; stops after two idle seconds."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    messages: list[Any] = []
    idle = 0
    while idle < 2:
        batch = consumer.consume(1000, timeout=1.0)
        idle = 0 if batch else idle + 1
        messages += [m for m in batch if m.error() is None]
    consumer.close()
    return messages


TEST_SPARK_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
"""Spark as the tests run it: the JIT's first tier only. A test's JVM lives for seconds over small batches, where
the optimising compiler costs more CPU than it gives back (about 2 s of each Spark start on 2 cores); production
runs keep the JVM's default."""


def run_env(**settings: Any) -> dict[str, str]:
    """Environment for a ``cdcsync`` subprocess: the test's services through ``CDCSYNC__`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCSYNC__")}
    env["COLUMNS"] = "200"  # Rich tables on a pipe: wide enough that no cell wraps
    env["CDCSYNC__SPARK__CONF"] = json.dumps(TEST_SPARK_CONF)
    # tests that SIGTERM a run expect the batch in flight to finish: on a loaded 2-core machine one may take longer
    # than production's 25 s bound (tests/e2e/test_operations.py sets its own, short one to test the bound)
    env["CDCSYNC__RUN__STOP_TIMEOUT_S"] = "120"
    for key, value in settings.items():
        env[f"CDCSYNC__{key.upper()}"] = str(value)
    return env


# ------------------------------------------------------------------------------------------- real Debezium

DEFAULT_TEST_CONNECT_PORT = 28083
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class DebeziumConnect:
    """A Kafka Connect worker with the Debezium Postgres connector, and how it reaches the session's Postgres."""

    url: str
    """Kafka Connect's REST API."""
    postgres_host: str
    postgres_port: int
    postgres_user: str
    postgres_password: str | None


@pytest.fixture(scope="session")
def debezium_connect(services: Services) -> Iterator[DebeziumConnect]:
    """Kafka Connect for the session, started on first use only, so tests that do not need it pay nothing.

    Skips (with the reason) only when Java or the Connect/Debezium jars cannot be had; anything else fails.
    """
    from psycopg.conninfo import conninfo_to_dict

    from cdcsync.core.errors import CdcsyncError, DependencyError
    from cdcsync.devstack import DevStackConfig, debezium

    pg = conninfo_to_dict(services.postgres_dsn)
    pg_host, pg_port = str(pg.get("host") or "127.0.0.1"), int(pg.get("port") or 5432)
    pg_user = str(pg.get("user") or "cdcsync")
    pg_password = str(pg["password"]) if pg.get("password") else None
    given = os.environ.get("CDCSYNC_TEST_CONNECT_URL")
    if given:
        yield DebeziumConnect(given.rstrip("/"), pg_host, pg_port, pg_user, pg_password)
        return
    kafka_host, _, kafka_port = services.bootstrap_servers.split(",")[0].rpartition(":")
    if pg_host not in _LOOPBACK_HOSTS or kafka_host.strip("[]") not in _LOOPBACK_HOSTS:
        pytest.skip(
            f"Kafka Connect runs on this machine and reaches Postgres and Kafka on loopback only; the session's are "
            f"at {pg_host} and {kafka_host}: set CDCSYNC_TEST_CONNECT_URL to a Connect worker that reaches them"
        )
    try:
        debezium.check_java()
    except DependencyError as exc:
        pytest.skip(f"real Debezium needs Java: {exc}")
    try:
        from cdcsync.runtime.jars import debezium_postgres_plugin_jars, kafka_connect_jars

        kafka_connect_jars()
        debezium_postgres_plugin_jars()
    except CdcsyncError as exc:
        pytest.skip(f"Kafka Connect / Debezium jars are not available (not cached, Maven Central unreachable): {exc}")
    state_dir = Path(tempfile.mkdtemp(prefix="cdcsync-test-connect-"))
    config = DevStackConfig(
        state_dir=state_dir,
        postgres_port=pg_port,
        kafka_port=int(kafka_port),
        # each xdist worker runs a Connect worker of its own, on the next port up
        connect_port=int(os.environ.get("CDCSYNC_TEST_CONNECT_PORT", DEFAULT_TEST_CONNECT_PORT)) + xdist_worker_index(),
    )
    connect = debezium.KafkaConnect(config)
    try:
        connect.start()
        connect.wait_rest_ready(180)
        yield DebeziumConnect(connect.address, pg_host, pg_port, pg_user, pg_password)
    finally:
        connect.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


@dataclass
class DebeziumSource:
    """A source database of its own for one test, and the Debezium connectors that capture it.

    A connector's name is also its topic prefix, replication slot and publication, so tests never share any. The
    first connector is named like the database; a test that captures the same changes in several connector modes
    at once (one ``cdcsync run`` checking all of them) names the others with :meth:`capture`'s ``connector``.
    """

    connect: DebeziumConnect
    dsn: str
    database: str
    name: str
    schema_registry_url: str
    """Where ``value_format="avro"`` registers its schemas (the session's registry)."""
    connectors: list[str] = field(default_factory=list)
    """The connectors registered so far, by name."""

    def capture(
        self,
        *tables: str,
        overrides: dict[str, str] | None = None,
        value_format: str = "json",
        wait_snapshot: bool = True,
        timeout_s: float = 90.0,
        connector: str | None = None,
    ) -> None:
        """Register a connector for ``tables`` (``schema.table``; all of ``public`` when none) and wait until
        it runs and (``wait_snapshot``) its snapshot is in Kafka. Rows already there arrive first, as snapshot
        reads (``op: r``). ``value_format="avro"``: keys and values in the Confluent Avro wire format, schemas in
        the session's registry. ``connector``: a second (third, ...) connector of the same database, named
        ``<name>_<connector>``, with its own slot, publication and topics (:meth:`topic`)."""
        from cdcsync.devstack import debezium

        name = self.connector_name(connector)
        config = debezium.connector_config(
            database=self.database,
            topic_prefix=name,
            slot_name=name,
            publication_name=name,
            host=self.connect.postgres_host,
            port=self.connect.postgres_port,
            user=self.connect.postgres_user,
            password=self.connect.postgres_password,
            tables=list(tables) or None,
            value_format=value_format,
            schema_registry_url=self.schema_registry_url,
            overrides=overrides,
        )
        debezium.put_connector(self.connect.url, name, config)
        self.connectors.append(name)
        debezium.wait_connector_running(self.connect.url, name, timeout_s)
        if wait_snapshot:
            debezium.wait_caught_up(self.connect.url, name, self.dsn, timeout_s)

    def connector_name(self, connector: str | None = None) -> str:
        return self.name if connector is None else f"{self.name}_{connector}"

    def topic(self, table: str, connector: str | None = None) -> str:
        """The topic of ``schema.table`` (as the connector named ``connector`` in :meth:`capture` writes it)."""
        return f"{self.connector_name(connector)}.{table}"

    def wait_caught_up(self, timeout_s: float = 90.0) -> None:
        """Until every change committed so far in the source database is in Kafka, from every connector."""
        from cdcsync.devstack import debezium

        lsn = debezium.emit_watermark(self.dsn)
        for name in self.connectors:
            debezium.wait_for_lsn(self.connect.url, name, lsn, timeout_s)


@pytest.fixture()
def debezium_source(
    services: Services, debezium_connect: DebeziumConnect, schema_registry_url: str
) -> Iterator[DebeziumSource]:
    """A fresh source database captured by a connector of its own; connector, slot and database go afterwards."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from cdcsync.devstack import debezium

    name = f"dbz_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        debezium.ensure_replication_role(conn, debezium_connect.postgres_user)
    source = DebeziumSource(
        debezium_connect, make_conninfo(services.postgres_dsn, dbname=name), name, name, schema_registry_url
    )
    try:
        yield source
    finally:
        for connector in source.connectors:
            debezium.delete_connector(debezium_connect.url, connector)
        for slot in source.connectors or [name]:
            debezium.drop_replication_slot(source.dsn, slot)
        with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession with cdcsync's defaults (ANSI mode, UTC) and its jars (Kafka connector, Delta Lake):
    for tests of generated Spark SQL over small DataFrames and of Delta sinks. One per test session; starting the
    JVM is the slow part."""
    import sys

    from pyspark.sql import SparkSession

    from cdcsync.runtime.cds import driver_java_options
    from cdcsync.runtime.jars import spark_jars_conf
    from cdcsync.runtime.spark import DEFAULT_SPARK_CONF, DELTA_SPARK_CONF

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]").appName("cdcsync-tests")
    java_options = f"{driver_java_options(True)} {TEST_SPARK_CONF['spark.driver.extraJavaOptions']}".strip()
    conf = {
        **DEFAULT_SPARK_CONF,
        **spark_jars_conf(),
        **DELTA_SPARK_CONF,
        "spark.driver.memory": "1g",
        **TEST_SPARK_CONF,
        "spark.driver.extraJavaOptions": java_options,
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
