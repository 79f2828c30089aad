"""The dev stack's schema registry: the real Apicurio Registry 2.6 server, on the local JVM.

What runs: ``io.apicurio:apicurio-registry-app`` (classifier ``all``, a ``tar.gz`` on Maven Central, resolved by
Ivy into the cdcsync cache and unpacked there once, :func:`cdcsync.runtime.jars.apicurio_registry_runner`), started
as ``java -jar apicurio-registry-app-<version>-runner.jar``. One server, two APIs:

* ``/apis/ccompat/v7``, Confluent's Schema Registry API: what cdcsync, confluent-kafka's ``SchemaRegistryClient``
  and ``CDCSYNC__SCHEMA_REGISTRY__URL`` use (:func:`url`);
* ``/apis/registry/v2``, Apicurio's own: what Apicurio's Kafka Connect ``AvroConverter`` (the dev stack's Debezium
  in Avro) registers through (:func:`v2_url`).

Both serve one id space: a Confluent schema id is Apicurio's ``contentId`` (the ccompat API's default id mode), and
the converter writes ``contentId`` too (``apicurio.registry.use-id``), so cdcsync fetches by id exactly the schema
the converter registered. Artifacts of Apicurio's ``default`` group are the Confluent subjects.

Storage: the application's SQL storage on H2, pointed at a file database under ``<state_dir>/devstack/
schema-registry/data`` (``REGISTRY_DATASOURCE_URL``, given as a system property), so schemas and ids survive
``dev down`` / ``dev up``. A development server: loopback only, no authentication.
"""

from __future__ import annotations

from pathlib import Path

from cdcsync.devstack.common import LOOPBACK, DevStackConfig, ServiceStatus
from cdcsync.devstack.service import Service, http_probe
from cdcsync.runtime.ivy import java_executable

NAME = "schema-registry"
CCOMPAT_PATH = "/apis/ccompat/v7"
V2_PATH = "/apis/registry/v2"
_CCOMPAT_SUFFIXES = ("/apis/ccompat/v7", "/apis/ccompat/v6")

# A registry for development holds a few hundred schemas: a small heap, the serial collector and C1 only keep its
# footprint and CPU low on a shared machine. Quarkus' default pool keeps 20 H2 connections open; a few do.
JVM_OPTIONS = ["-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]
POOL_OPTIONS = {
    "%prod.quarkus.datasource.jdbc.initial-size": "1",
    "%prod.quarkus.datasource.jdbc.min-size": "1",
    "%prod.quarkus.datasource.jdbc.max-size": "10",
}


def home(cfg: DevStackConfig) -> Path:
    return cfg.root / NAME


def database(cfg: DevStackConfig) -> Path:
    """H2's file database (H2 adds ``.mv.db``)."""
    return home(cfg) / "data" / "registry"


def base_url(cfg: DevStackConfig) -> str:
    return f"http://{LOOPBACK}:{cfg.schema_registry_port}"


def url(cfg: DevStackConfig) -> str:
    """The Confluent-compatible API: what ``CDCSYNC__SCHEMA_REGISTRY__URL`` and confluent-kafka's client take."""
    return base_url(cfg) + CCOMPAT_PATH


def v2_url(registry_url: str) -> str:
    """Apicurio's v2 API of the server whose ccompat API (or root) is ``registry_url``."""
    root = registry_url.rstrip("/")
    for suffix in _CCOMPAT_SUFFIXES:
        if root.endswith(suffix):
            root = root.removesuffix(suffix)
            break
    return root + V2_PATH


class ApicurioRegistry(Service):
    name = NAME
    log_name = "registry.log"

    def __init__(self, cfg: DevStackConfig) -> None:
        super().__init__(cfg, marker=str(database(cfg)), port=cfg.schema_registry_port, address=url(cfg))

    def launch(self) -> ServiceStatus:
        """Resolve and unpack the application (cached after the first run) and launch it detached."""
        from cdcsync.runtime.jars import APICURIO_VERSION, apicurio_registry_runner

        runner = apicurio_registry_runner(self.cfg.cache_dir)
        database(self.cfg).parent.mkdir(parents=True, exist_ok=True)
        properties = {
            "quarkus.http.host": LOOPBACK,
            "quarkus.http.port": str(self.cfg.schema_registry_port),
            "REGISTRY_DATASOURCE_URL": f"jdbc:h2:file:{database(self.cfg)}",
            **POOL_OPTIONS,
        }
        argv = [
            java_executable("Apicurio Registry"),
            *JVM_OPTIONS,
            *(f"-D{key}={value}" for key, value in properties.items()),
            "-jar",
            str(runner),
        ]
        return self.spawn(argv, detail=f"Apicurio Registry {APICURIO_VERSION}")

    def probe(self) -> str | None:
        """Ready when the ccompat API lists subjects: HTTP is up and the database open."""
        return http_probe(url(self.cfg) + "/subjects", expect=b"[")
