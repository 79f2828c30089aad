"""The JVM artifacts cdcsync needs beyond what pyspark ships, resolved by Apache Ivy (:mod:`cdcsync.runtime.ivy`).

Spark's Kafka connector comes through Spark's own ``spark.jars.packages`` (Ivy inside ``spark-submit``), with its
Ivy home under the cdcsync cache; the dev stack's broker, Kafka Connect, Debezium's connector (its official plugin
tarball) and Apicurio Registry (its ``all`` tarball) come through the same Ivy, run on its own. Versions are pinned
here, in one place, so that a cold cache resolves the same artifacts on every machine.
"""

from __future__ import annotations

import re
from pathlib import Path

from cdcsync.runtime.ivy import Artifact, cache_root, resolve, unpacked

SCALA_BINARY_VERSION = "2.13"

# The Kafka broker of the dev stack. 4.x is KRaft-only; Spark 4.2's client (kafka-clients 3.9) talks to it fine.
KAFKA_VERSION = "4.1.2"
# log4j 2 is what Kafka 4.1's own distribution logs with; the binding matches its slf4j-api 1.7.
LOG4J_VERSION = "2.25.3"

# Delta Lake's JVM side for ``type: delta`` sinks. The Python package (delta-spark 4.4.1) only wraps it; Maven
# Central's newest release of the jars is 4.4.0, built against Spark 4.2.0 (its POM's `provided` Spark), which is
# the pyspark cdcsync pins. delta-spark_2.13 brings delta-storage of the same version.
DELTA_VERSION = "4.4.0"
DELTA_COORDINATE = f"io.delta:delta-spark_{SCALA_BINARY_VERSION}:{DELTA_VERSION}"

KAFKA_BROKER_COORDINATES = [
    f"org.apache.kafka:kafka_{SCALA_BINARY_VERSION}:{KAFKA_VERSION}",
    f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
    f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
]
KAFKA_MAIN_CLASS = "kafka.Kafka"
KAFKA_STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"

# Kafka Connect standalone for the dev stack's Debezium, of the broker's own Kafka version. connect-json brings
# the JsonConverter; the log4j binding is the broker's.
KAFKA_CONNECT_COORDINATES = [
    f"org.apache.kafka:connect-runtime:{KAFKA_VERSION}",
    f"org.apache.kafka:connect-json:{KAFKA_VERSION}",
    f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
    f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
]
KAFKA_CONNECT_MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"

# The newest Debezium 3.x built against Kafka 4.1 (its `version.kafka` is 4.1.1), so it runs on a 4.1.2 Connect
# worker as tested upstream. 3.6.x is built against Kafka 4.3 and would need a newer worker.
DEBEZIUM_VERSION = "3.5.0.Final"
# The plugin tarball is what Debezium's own container images unpack into Connect's plugin path.
DEBEZIUM_POSTGRES_PLUGIN = Artifact(
    "io.debezium", "debezium-connector-postgres", DEBEZIUM_VERSION, classifier="plugin", ext="tar.gz", transitive=False
)
# Debezium's JDBC sink connector, only for the side-by-side benchmark (``make bench-peer``): the peer cdcsync is
# measured against. 3.6.0 is the version that comparison was first made with; its plugin tarball carries Kafka 4.3's
# client and Connect API jars, but Connect's plugin isolation loads those classes from the 4.1.2 worker.
DEBEZIUM_JDBC_SINK_VERSION = "3.6.0.Final"
DEBEZIUM_JDBC_SINK_PLUGIN = Artifact(
    "io.debezium",
    "debezium-connector-jdbc",
    DEBEZIUM_JDBC_SINK_VERSION,
    classifier="plugin",
    ext="tar.gz",
    transitive=False,
)
# Avro for the dev stack's Debezium: Confluent's AvroConverter is not on Maven Central, Apicurio's is, and writes
# the Confluent wire format through Apicurio Registry's v2 API (the dev stack runs that registry).
# 2.6.x is the last line with the v2 REST client and `as-confluent`; it goes into the connector's own plugin
# directory, as Debezium's container images put it.
APICURIO_VERSION = "2.6.13.Final"
# Its own modules are pinned to its version: Ivy reads the parent POM's dependencyManagement of this release as
# asking for 2.6.2 of the serdes and the client (Maven takes 2.6.13), and a mix of the two must not happen.
APICURIO_CONVERTER_COORDINATES = [
    f"io.apicurio:{module}:{APICURIO_VERSION}"
    for module in (
        "apicurio-registry-utils-converter",
        "apicurio-registry-serdes-avro-serde",
        "apicurio-registry-serdes-jsonschema-serde",
        "apicurio-registry-serde-common",
        "apicurio-registry-schema-resolver",
        "apicurio-registry-client",
        "apicurio-registry-common",
    )
]
# The registry itself, the Quarkus application with its libraries: ``java -jar <runner jar>`` on Java 17.
APICURIO_REGISTRY_APP = Artifact(
    "io.apicurio", "apicurio-registry-app", APICURIO_VERSION, classifier="all", ext="tar.gz", transitive=False
)
# What the Connect worker already provides (Connect's API, the Kafka client, slf4j, Jackson) or what only the
# client needs: kept out of the converter's jars in the plugin directory so the plugin sees the worker's copies.
# Jackson matters: with a second copy in the plugin, Debezium's converters cannot call the worker's JsonConverter
# (JsonNode differs).
DEBEZIUM_PLUGIN_EXCLUSIONS = [
    "org.apache.kafka:*",
    "org.slf4j:*",
    "com.fasterxml.jackson.core:*",
    "com.github.luben:zstd-jni",
    "org.lz4:lz4-java",
    "org.xerial.snappy:snappy-java",
    "jakarta.ws.rs:jakarta.ws.rs-api",
]


def spark_kafka_connector_coordinate(spark_version: str | None = None) -> str:
    """The connector must match the running Spark exactly; its internals are not binary compatible across minors."""
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}:{spark_version}"


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def shipped_exclusions(jars_dir: Path) -> set[str]:
    """``*:artifactId`` exclusions for every jar in ``jars_dir``, so the resolver prunes what is already there.

    Jar directories hold bare file names (no group, version glued on with a hyphen), and artifact ids may
    contain ``-<digit>`` themselves (``spark-sql-kafka-0-10_2.13-4.2.0.jar``). Every prefix that ends before a
    ``-<digit>`` is therefore a candidate artifact id. Over-matching costs nothing in practice (no real artifact
    is named like a truncated one), and a different version of a shipped artifact is excluded on purpose: two
    scala-library or slf4j jars on one classpath is exactly what must not happen.
    """
    exclusions: set[str] = set()
    for jar in jars_dir.glob("*.jar"):
        stem = jar.name.removesuffix(".jar")
        for match in re.finditer(r"-\d", stem):
            exclusions.add(f"*:{stem[: match.start()]}")
    return exclusions


def spark_ivy_home(cache_dir: Path | None = None) -> Path:
    return (cache_dir or cache_root()) / "spark-ivy"


def spark_jars_conf(cache_dir: Path | None = None) -> dict[str, str]:
    """Spark settings that put the Kafka connector and Delta Lake, resolved ahead of time into the cdcsync cache,
    on the classpath of the driver and the executors.

    ``spark.jars`` with local paths rather than ``spark.jars.packages``: Spark would run Ivy again at every
    start (about a second on this 2-core machine, every ``cdcsync run``) only to find the same files; the driver
    serves these jars to executors in other JVMs just the same. Delta is always there: its two jars add nothing
    measurable to a start (docs/delta.md), and one classpath for every pipeline keeps tests and runs alike.
    """
    return {"spark.jars": ",".join(str(path) for path in spark_kafka_jars(cache_dir))}


def spark_kafka_jars(cache_dir: Path | None = None) -> list[Path]:
    """Spark's Kafka connector and Delta Lake, with what they need beyond pyspark's own jars, resolved (once)
    into the cdcsync cache."""
    return resolve(
        [Artifact.parse(spark_kafka_connector_coordinate()), Artifact.parse(DELTA_COORDINATE)],
        sorted(shipped_exclusions(pyspark_jars_dir())),
        home=spark_ivy_home(cache_dir),
    )


def _ivy_home(cache_dir: Path | None) -> Path:
    return (cache_dir or cache_root()) / "ivy"


def kafka_broker_jars(cache_dir: Path | None = None) -> list[Path]:
    """The full classpath of a standalone KRaft broker, storage formatting tool included (it lives in core)."""
    return resolve([Artifact.parse(c) for c in KAFKA_BROKER_COORDINATES], home=_ivy_home(cache_dir))


def kafka_connect_jars(cache_dir: Path | None = None) -> list[Path]:
    """The classpath of a Kafka Connect standalone worker (REST server, JsonConverter, logging)."""
    return resolve([Artifact.parse(c) for c in KAFKA_CONNECT_COORDINATES], home=_ivy_home(cache_dir))


def _unpacked(artifact: Artifact, cache_dir: Path | None) -> Path:
    (tarball,) = resolve([artifact], home=_ivy_home(cache_dir))
    return unpacked(tarball, (cache_dir or cache_root()) / "unpacked")


def debezium_postgres_plugin_jars(cache_dir: Path | None = None) -> list[Path]:
    """One plugin directory's worth of jars: Debezium's official plugin tarball as it is, plus Apicurio's Avro
    converter and those of its dependencies that neither the tarball nor the worker already has."""
    plugin = _unpacked(DEBEZIUM_POSTGRES_PLUGIN, cache_dir) / "debezium-connector-postgres"
    connector_jars = sorted(plugin.glob("*.jar"))
    converter_jars = resolve(
        [Artifact.parse(c) for c in APICURIO_CONVERTER_COORDINATES],
        [*DEBEZIUM_PLUGIN_EXCLUSIONS, *shipped_exclusions(plugin)],
        home=_ivy_home(cache_dir),
    )
    return [*connector_jars, *converter_jars]


def debezium_jdbc_sink_plugin_jars(cache_dir: Path | None = None) -> list[Path]:
    """Debezium's JDBC sink plugin tarball as it is (its own ServiceLoader manifests, the Postgres JDBC driver)."""
    return sorted((_unpacked(DEBEZIUM_JDBC_SINK_PLUGIN, cache_dir) / "debezium-connector-jdbc").glob("*.jar"))


def apicurio_registry_runner(cache_dir: Path | None = None) -> Path:
    """The Apicurio Registry application's runner jar, next to its ``lib/`` in the unpacked tarball."""
    root = _unpacked(APICURIO_REGISTRY_APP, cache_dir)
    runners = sorted(root.rglob("*-runner.jar"))
    if not runners:
        from cdcsync.core.errors import DependencyError

        raise DependencyError(f"no *-runner.jar in {root}", hint=f"remove {root} so it is unpacked again")
    return runners[0]


def prefetch(*, with_debezium: bool = False) -> None:
    """Resolve every artifact cdcsync needs into the cache now (``make`` runs this once), so later runs are offline;
    and build the class-data-sharing archive that makes Spark start faster (:mod:`cdcsync.runtime.cds`)."""
    from cdcsync.runtime.cds import build_archive

    def cds_archive() -> list[Path]:
        archive = build_archive()
        return [] if archive is None else [archive]

    wanted = [
        ("spark kafka connector + delta lake", spark_kafka_jars),
        ("spark class-data-sharing archive", cds_archive),
        ("kafka broker", kafka_broker_jars),
        ("apicurio registry", lambda: [apicurio_registry_runner()]),
    ]
    if with_debezium:
        wanted += [
            ("kafka connect", kafka_connect_jars),
            ("debezium postgres + apicurio converter", debezium_postgres_plugin_jars),
        ]
    for name, fetch in wanted:
        print(f"{name}: {len(fetch())} file(s) cached")


if __name__ == "__main__":
    import sys

    prefetch(with_debezium="--with-debezium" in sys.argv[1:])
