"""Which failed Spark jobs are the Kafka broker's outage: by the Java classes of the causes, never by text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdcsync.sources.kafka import BrokerUnavailable, broker_failure


@dataclass
class JavaClass:
    name: str
    parent: JavaClass | None = None

    def getName(self) -> str:  # py4j spells them so
        return self.name

    def getSuperclass(self) -> JavaClass | None:
        return self.parent


@dataclass
class Frame:
    cls: str

    def getClassName(self) -> str:
        return self.cls


@dataclass
class Throwable:
    cls: JavaClass
    message: str
    cause: Throwable | None = None
    frames: list[Frame] = field(default_factory=list)

    def getClass(self) -> JavaClass:
        return self.cls

    def getMessage(self) -> str:
        return self.message

    def getCause(self) -> Throwable | None:
        return self.cause

    def getStackTrace(self) -> list[Frame]:
        return self.frames


THROWABLE = JavaClass("java.lang.Throwable")
EXCEPTION = JavaClass("java.lang.Exception", THROWABLE)
KAFKA = JavaClass("org.apache.kafka.common.KafkaException", JavaClass("java.lang.RuntimeException", EXCEPTION))
RETRIABLE = JavaClass("org.apache.kafka.common.errors.RetriableException", KAFKA)
SPARK = JavaClass("org.apache.spark.SparkException", EXCEPTION)


class Captured(Exception):
    """A PySpark captured exception: the Java throwable is its ``_origin``."""

    def __init__(self, origin: Any) -> None:
        super().__init__("Job aborted due to stage failure")
        self._origin = origin


def job_failing_with(cause: Throwable) -> Captured:
    return Captured(Throwable(SPARK, "Job aborted due to stage failure: Task 0 failed", cause=cause))


def test_a_kafka_retriable_exception_among_the_causes_is_the_broker_away() -> None:
    timeout = Throwable(
        JavaClass("org.apache.kafka.common.errors.TimeoutException", RETRIABLE),
        "Timeout of 4000ms expired before the position for partition t-0 could be determined\nmore",
    )
    found = broker_failure(job_failing_with(timeout))
    assert isinstance(found, BrokerUnavailable) and found.retriable
    assert (
        found.detail
        == "TimeoutException: Timeout of 4000ms expired before the position for partition t-0 could be determined"
    )
    named = found.add_context("staging batch 3")
    assert isinstance(named, BrokerUnavailable)
    assert str(named.naming("b1:9092")) == (
        "staging batch 3: the Kafka broker at b1:9092 did not answer: " + found.detail
    )


def test_the_readers_own_poll_timeout_counts_only_when_thrown_by_spark_kafka() -> None:
    timeout = JavaClass("java.util.concurrent.TimeoutException", EXCEPTION)
    polled = Throwable(timeout, "Cannot fetch record for offset 7 in 2000 milliseconds")
    polled.frames = [Frame("org.apache.spark.sql.kafka010.consumer.InternalKafkaConsumer")]
    assert broker_failure(job_failing_with(polled)) is not None
    elsewhere = Throwable(timeout, "some other wait", frames=[Frame("org.apache.spark.rpc.RpcTimeout")])
    assert broker_failure(job_failing_with(elsewhere)) is None


def test_other_failures_and_plain_python_errors_are_not() -> None:
    auth = Throwable(JavaClass("org.apache.kafka.common.errors.SaslAuthenticationException", KAFKA), "bad password")
    assert broker_failure(job_failing_with(auth)) is None
    assert broker_failure(ValueError("no Java here")) is None


def test_a_java_throwable_itself_is_read_too() -> None:
    """A query's failure: PySpark keeps only the text of a Kafka cause, so the throwable is asked for directly."""
    node = Throwable(
        JavaClass("org.apache.kafka.common.errors.TimeoutException", RETRIABLE),
        "Timed out waiting for a node assignment. Call: listNodes",
    )
    found = broker_failure(Throwable(JavaClass("org.apache.spark.sql.streaming.StreamingQueryException"), "", node))
    assert found is not None and found.detail.startswith("TimeoutException: Timed out waiting for a node")
