"""The JVM classpaths cdcsync needs beyond what pyspark ships, resolved through :mod:`cdcsync.runtime.maven`.

Versions are pinned here, in one place, so that a cold cache resolves the same jars on every machine.
"""

from __future__ import annotations

import re
from pathlib import Path

from cdcsync.runtime.maven import MavenResolver

SCALA_BINARY_VERSION = "2.13"

# The Kafka broker of the dev stack. 4.x is KRaft-only; Spark 4.2's client (kafka-clients 3.9) talks to it fine.
KAFKA_VERSION = "4.1.2"
# log4j 2 is what Kafka 4.1's own distribution logs with; the binding matches its slf4j-api 1.7.
LOG4J_VERSION = "2.25.3"

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
DEBEZIUM_POSTGRES_COORDINATES = [f"io.debezium:debezium-connector-postgres:{DEBEZIUM_VERSION}"]
# Avro for the dev stack's Debezium: Confluent's AvroConverter is not on Maven Central, Apicurio's is, and writes
# the Confluent wire format against the dev registry's Apicurio v2 subset (cdcsync.devstack.schema_registry).
# 2.6.x is the last line with the v2 REST client and `as-confluent`; it goes into the connector's own plugin
# directory, as Debezium's container images put it.
APICURIO_VERSION = "2.6.13.Final"
APICURIO_CONVERTER_COORDINATES = [f"io.apicurio:apicurio-registry-utils-converter:{APICURIO_VERSION}"]
# What the Connect worker already provides (Connect's API, the Kafka client, slf4j, Jackson) or what only the
# client needs: kept out of the plugin directory so the plugin sees the worker's copies. Jackson matters: with
# a second copy in the plugin, Debezium's converters cannot call the worker's JsonConverter (JsonNode differs).
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

    pyspark's jars/ holds bare file names (no group, version glued on with a hyphen), and artifact ids may
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


def spark_kafka_jars(cache_dir: Path | None = None, *, resolver: MavenResolver | None = None) -> list[Path]:
    """Jars to add to Spark for the Kafka source: the connector and its dependencies minus pyspark's own jars.

    Pruning during resolution (rather than filtering afterwards) also avoids downloading the large Hadoop
    client jars that the connector declares but pyspark already bundles.
    """
    resolver = resolver or MavenResolver(cache_dir)
    return resolver.resolve([spark_kafka_connector_coordinate()], shipped_exclusions(pyspark_jars_dir()))


def kafka_broker_jars(cache_dir: Path | None = None, *, resolver: MavenResolver | None = None) -> list[Path]:
    """The full classpath of a standalone KRaft broker, storage formatting tool included (it lives in core)."""
    resolver = resolver or MavenResolver(cache_dir)
    return resolver.resolve(KAFKA_BROKER_COORDINATES)


def kafka_connect_jars(cache_dir: Path | None = None, *, resolver: MavenResolver | None = None) -> list[Path]:
    """The classpath of a Kafka Connect standalone worker (REST server, JsonConverter, logging)."""
    resolver = resolver or MavenResolver(cache_dir)
    return resolver.resolve(KAFKA_CONNECT_COORDINATES)


def debezium_postgres_plugin_jars(
    cache_dir: Path | None = None, *, resolver: MavenResolver | None = None
) -> list[Path]:
    """The Debezium Postgres connector, Apicurio's Avro converter and their own dependencies, resolved together
    (one version of each library): one plugin directory's worth of jars."""
    resolver = resolver or MavenResolver(cache_dir)
    return resolver.resolve(
        [*DEBEZIUM_POSTGRES_COORDINATES, *APICURIO_CONVERTER_COORDINATES], DEBEZIUM_PLUGIN_EXCLUSIONS
    )


def prefetch(*, with_debezium: bool = False) -> None:
    """Resolve every jar cdcsync needs into the cache now (``make`` runs this once), so later runs are offline."""
    wanted = [("spark kafka connector", spark_kafka_jars), ("kafka broker", kafka_broker_jars)]
    if with_debezium:
        wanted += [
            ("kafka connect", kafka_connect_jars),
            ("debezium postgres + apicurio converter", debezium_postgres_plugin_jars),
        ]
    for name, resolve in wanted:
        print(f"{name}: {len(resolve())} jar(s) cached")


if __name__ == "__main__":
    import sys

    prefetch(with_debezium="--with-debezium" in sys.argv[1:])
