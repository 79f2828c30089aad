"""An Apache Kafka broker for the dev stack: KRaft combined mode (broker + controller), one node, on the local JVM.

The broker jars come from Maven Central through Apache Ivy (:func:`cdcsync.runtime.jars.kafka_broker_jars`),
the resolver Spark uses for its connector jars, so the only system requirement is Java 17+. Storage is formatted once
with a cluster id generated once and kept next to it; later starts reuse both, so topics and offsets survive
``dev down`` / ``dev up``.
"""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from pathlib import Path

from cdcsync.devstack.common import LOOPBACK, DevStackConfig, ServiceStatus, port_open, startup_failure
from cdcsync.devstack.service import Service
from cdcsync.runtime.ivy import java_executable

NAME = "kafka"
NODE_ID = 1
HEAP = ["-Xms256m", "-Xmx512m"]

LOG4J2_PROPERTIES = """\
# cdcsync dev stack: broker logs to stdout, which the dev stack appends to kafka.log.
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.server.name = kafka.server
logger.server.level = INFO
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
logger.storage.name = kafka.tools.StorageTool
logger.storage.level = INFO
"""


def home(cfg: DevStackConfig) -> Path:
    return cfg.root / NAME


def log_file(cfg: DevStackConfig) -> Path:
    return home(cfg) / "kafka.log"


def config_file(cfg: DevStackConfig) -> Path:
    return home(cfg) / "server.properties"


def data_dir(cfg: DevStackConfig) -> Path:
    return home(cfg) / "data"


def bootstrap_servers(cfg: DevStackConfig) -> str:
    return f"{LOOPBACK}:{cfg.kafka_port}"


def server_properties(cfg: DevStackConfig) -> str:
    """Single-node settings: replication factors of 1, instant group rebalances, topics created on first use."""
    props = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@{LOOPBACK}:{cfg.kafka_controller_port}",
        "listeners": f"PLAINTEXT://{LOOPBACK}:{cfg.kafka_port},CONTROLLER://{LOOPBACK}:{cfg.kafka_controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{cfg.kafka_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir(cfg)),
        "num.partitions": "4",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "log.retention.hours": "168",
    }
    return "".join(f"{key}={value}\n" for key, value in props.items())


def _new_cluster_id() -> str:
    """Kafka's own format: URL-safe base64 of a random UUID, never starting with '-' (it would parse as a flag)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def cluster_id(cfg: DevStackConfig) -> str:
    path = home(cfg) / "cluster.id"
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    value = _new_cluster_id()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(value + "\n")
    os.replace(tmp, path)
    return value


def _classpath(cfg: DevStackConfig) -> str:
    from cdcsync.runtime.jars import kafka_broker_jars

    return os.pathsep.join(str(p) for p in kafka_broker_jars(cfg.cache_dir))


def _write_configs(cfg: DevStackConfig) -> None:
    home(cfg).mkdir(parents=True, exist_ok=True)
    files = {config_file(cfg): server_properties(cfg), home(cfg) / "log4j2.properties": LOG4J2_PROPERTIES}
    for path, text in files.items():
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def _jvm(cfg: DevStackConfig, classpath: str) -> list[str]:
    return [
        java_executable("the Kafka broker"),
        *HEAP,
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={(home(cfg) / 'log4j2.properties').as_uri()}",
        f"-Dkafka.logs.dir={home(cfg)}",
        "-cp",
        classpath,
    ]


def _format_storage(cfg: DevStackConfig, classpath: str) -> None:
    """Format once; ``meta.properties`` in the log dir is Kafka's own marker that it was done."""
    if (data_dir(cfg) / "meta.properties").is_file():
        return
    from cdcsync.runtime.jars import KAFKA_STORAGE_TOOL_CLASS

    argv = [
        *_jvm(cfg, classpath),
        KAFKA_STORAGE_TOOL_CLASS,
        "format",
        "--cluster-id",
        cluster_id(cfg),
        "--config",
        str(config_file(cfg)),
        "--ignore-formatted",
    ]
    with open(log_file(cfg), "ab") as out:
        try:
            result = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=180, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise startup_failure(NAME, log_file(cfg), f"formatting storage failed to run: {exc}") from exc
    if result.returncode != 0:
        raise startup_failure(NAME, log_file(cfg), f"formatting storage exited with {result.returncode}")


class KafkaBroker(Service):
    name = NAME
    log_name = "kafka.log"
    # SIGTERM makes the broker flush and close its logs cleanly; SIGKILL only if that takes too long.
    stop_timeout_s = 45.0

    def __init__(self, cfg: DevStackConfig) -> None:
        super().__init__(cfg, marker=str(config_file(cfg)), port=cfg.kafka_port, address=bootstrap_servers(cfg))

    def ports(self) -> dict[str, int]:
        return {NAME: self.cfg.kafka_port, f"{NAME} controller": self.cfg.kafka_controller_port}

    def launch(self) -> ServiceStatus:
        """Resolve the broker jars (cached after the first run), format once, launch detached."""
        from cdcsync.runtime.jars import KAFKA_MAIN_CLASS

        classpath = _classpath(self.cfg)
        _write_configs(self.cfg)
        _format_storage(self.cfg, classpath)
        return self.spawn([*_jvm(self.cfg, classpath), KAFKA_MAIN_CLASS, str(config_file(self.cfg))])

    def probe(self) -> str | None:
        """Ready means a client can fetch cluster metadata, not merely that the port is bound."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        if not port_open(self.cfg.kafka_port):
            return "port not open yet"
        # librdkafka logs every refused connection while the broker boots; those are expected, not news.
        admin = AdminClient({"bootstrap.servers": self.address, "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=3)
        except KafkaException as exc:
            return str(exc)
        return None if metadata.brokers else "no brokers in metadata yet"
