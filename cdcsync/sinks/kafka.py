"""The ``kafka`` sink: changes written to a topic as Debezium change events, exactly once for ``read_committed``
consumers.

How a micro-batch lands (orchestrated by :mod:`cdcsync.engine.batch`, like every sink):

1. the driver looks the batch up in the ledger; a batch recorded there is skipped (before the first batch it
   creates the topic with ``topic_partitions`` partitions, or checks that it has at least that many);
2. each executor task writes its rows in **one Kafka transaction**, with a transactional id named after the
   pipeline, the sink and the source partition(s) the task read, so a zombie attempt of the same task is fenced
   by the broker. The transaction also commits, for a consumer group of the sink's own
   (``cdcsync.<pipeline>.<sink>.<checkpoint id>``), the source offset after the last row it wrote
   (``send_offsets_to_transaction``, Kafka's consume-transform-produce pattern). Before writing, the task reads
   that group's committed offsets and leaves out the rows below them: those are in the topic already;
3. the driver records the batch in the ledger.

A crash between 2 and 3 replays the batch: its tasks find their offsets committed and write nothing again; a task
killed mid-transaction leaves an open transaction that the next ``init_transactions`` of its id aborts. So a
``read_committed`` consumer reads each change exactly once. A ``read_uncommitted`` consumer can also see the
messages of aborted transactions: at least once, which a downstream cdcsync mirror absorbs (versions).

The offsets are kept per source partition, so a task must hold whole partitions: a source's own batch does
(one task per Kafka partition), and a transform's rows are repartitioned by source partition before a kafka sink
is staged (:func:`cdcsync.engine.graph.land_graph_batch`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import ServiceError, UserError
from cdcsync.core.reports import ReportedFailure, refused, write_failed
from cdcsync.sinks.kafka_envelope import OP_HEADER, EventShape
from cdcsync.sinks.recorded import RecordedSink
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.config.operators import KafkaSink
    from cdcsync.config.pipeline import Pipeline
    from cdcsync.config.settings import Settings

TIMEOUT_S = 30.0
"""Per Kafka call of a task (init, offsets, commit): a broker away that long fails the batch as retriable."""


def marker_group(pipeline: str, sink_id: str, checkpoint_id: str) -> str:
    """The consumer group whose committed offsets say which source offsets the sink's topic already holds."""
    return f"cdcsync.{pipeline}.{sink_id}.{checkpoint_id}"


def source_ranges(table: pa.Table) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (first, last) source offset of ``table``'s rows."""
    grouped = table.group_by(["_cdc_topic", "_cdc_partition"]).aggregate(
        [("_cdc_offset", "min"), ("_cdc_offset", "max")]
    )
    return {
        (row["_cdc_topic"], row["_cdc_partition"]): (row["_cdc_offset_min"], row["_cdc_offset_max"])
        for row in grouped.to_pylist()
    }


def transactional_id(pipeline: str, sink_id: str, partitions: list[tuple[str, int]]) -> str:
    """The same for every attempt at the same source partitions, so the broker fences an older attempt."""
    named = ",".join(f"{topic}-{partition}" for topic, partition in sorted(partitions))
    if len(partitions) > 1 or len(named) > 120:
        named = hashlib.sha256(named.encode()).hexdigest()[:24]
    return f"cdcsync.{pipeline}.{sink_id}.{named}"


def unwritten(table: pa.Table, committed: dict[tuple[str, int], int]) -> pa.Table:
    """The rows at or after the committed offset of their source partition: those not in the topic yet."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not committed:
        return table
    topics = table.column("_cdc_topic").to_pylist()
    partitions = table.column("_cdc_partition").to_pylist()
    floors = pa.array([committed.get((t, p), -1) for t, p in zip(topics, partitions, strict=True)], pa.int64())
    return table.filter(pc.greater_equal(table.column("_cdc_offset"), floors))


@dataclass(frozen=True)
class KafkaWriter:
    """Executor side (picklable): one task's changes in one fenced Kafka transaction."""

    topic: str
    data_format: str
    json_schemas: bool
    tombstones: bool
    key: tuple[str, ...]
    client: tuple[tuple[str, str], ...] = field(repr=False)
    """``bootstrap.servers`` and the native client keys (may hold credentials: never shown)."""
    registry: SchemaRegistryAccess | None
    pipeline: str
    sink_id: str
    input_id: str
    checkpoint_id: str
    batch_id: int

    def stage(self, table: pa.Table) -> int:
        if table.num_rows == 0:
            return 0
        table = table.sort_by([(name, "ascending") for name in ("_cdc_topic", "_cdc_partition", "_cdc_offset")])
        doing = f"sink '{self.sink_id}': writing batch {self.batch_id} to topic {self.topic}"
        try:
            self._transact(table)
        except ReportedFailure:
            raise
        except Exception as error:  # confluent_kafka.KafkaException and what the registry client raises
            if _refused(error):
                raise ReportedFailure(refused(f"{doing}: {_reason(error)}")) from None
            raise ReportedFailure(write_failed(f"{doing}: {_reason(error)}", retriable=True)) from None
        return table.num_rows

    def _transact(self, table: pa.Table) -> None:
        from confluent_kafka import KafkaException

        ranges = source_ranges(table)
        txn_id = transactional_id(self.pipeline, self.sink_id, list(ranges))
        reused = (self.client, txn_id) in _PRODUCERS
        try:
            self._transact_with(_producer(self.client, txn_id), table)
        except KafkaException:
            _forget(self.client, txn_id)
            if not reused:
                raise
            # The process's producer may have been fenced by another worker's attempt at these partitions since
            # its last batch; a new one (a new epoch) resolves what that attempt left, then reads the offsets.
            self._transact_with(_producer(self.client, txn_id), table)

    def _transact_with(self, producer: Any, table: pa.Table) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        consumer = _consumer(self.client, marker_group(self.pipeline, self.sink_id, self.checkpoint_id))
        marks = consumer.committed([TopicPartition(t, p) for t, p in source_ranges(table)], timeout=TIMEOUT_S)
        committed = {(m.topic, m.partition): m.offset for m in marks if m.offset >= 0}
        rows = unwritten(table, committed)
        if rows.num_rows == 0:
            return  # an earlier attempt committed this task's changes
        producer.begin_transaction()
        try:
            for key, value, op in self._messages(rows):
                _produce(producer, self.topic, key, value, [(OP_HEADER, op.encode())])
            after = [TopicPartition(t, p, last + 1) for (t, p), (_, last) in source_ranges(rows).items()]
            producer.send_offsets_to_transaction(after, consumer.consumer_group_metadata(), TIMEOUT_S)
            producer.commit_transaction(TIMEOUT_S)
        except KafkaException as error:
            if error.args and error.args[0].txn_requires_abort():
                producer.abort_transaction(TIMEOUT_S)
            raise

    def _messages(self, rows: pa.Table) -> list[tuple[bytes | None, bytes | None, str]]:
        shape = EventShape.of(
            rows.schema,
            self.key,
            topic=self.topic,
            pipeline=self.pipeline,
            sink_id=self.sink_id,
            input_id=self.input_id,
            schemas=self.json_schemas,
        )
        if self.data_format == "json":
            return shape.json_messages(rows, self.tombstones)
        key_id, value_id = self._register(shape)
        return shape.avro_messages(rows, self.tombstones, key_id, value_id)

    def _register(self, shape: EventShape) -> tuple[int, int]:
        """Schema ids of the key and value schemas (the client caches them per process)."""
        import json

        from confluent_kafka.schema_registry import Schema

        from cdcsync.sources.debezium.avro_registry import registry_client

        assert self.registry is not None, "avro sinks carry the registry"
        client = registry_client(self.registry)
        key = registered(client, f"{self.topic}-key", Schema(json.dumps(shape.avro_key_schema()), "AVRO"))
        value = registered(client, f"{self.topic}-value", Schema(json.dumps(shape.avro_value_schema()), "AVRO"))
        return key, value


def registered(client: Any, subject: str, schema: Any) -> int:
    """The id of ``schema`` under ``subject``, registering it if need be. The tasks of a batch register the same
    new subject at once; a registry may answer all but one of them 409 (Apicurio: "already exists"), which a
    second try turns into the id. An incompatible schema is refused again (409), and stays refused."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return int(client.register_schema(subject, schema))
    except SchemaRegistryError as error:
        if error.http_status_code != 409:
            raise
        return int(client.register_schema(subject, schema))


TRANSACTION_TIMEOUT_MS = 300_000
"""How long a task's transaction may stay open before the broker aborts it (librdkafka's default is 60 s, short for a
large batch on a loaded executor; the broker's ``transaction.max.timeout.ms`` defaults to 15 minutes)."""

_PRODUCERS: dict[tuple[tuple[tuple[str, str], ...], str], Any] = {}
"""Transactional producers of this executor process by (client, transactional id): ``init_transactions`` costs
round trips to the coordinator, so a task reuses the one of the previous batch at its partitions."""
_CONSUMERS: dict[tuple[tuple[tuple[str, str], ...], str], Any] = {}
"""Consumers of this process by (client, group), for reading the committed offsets and the group's metadata."""


def _producer(client: tuple[tuple[str, str], ...], txn_id: str) -> Any:
    from confluent_kafka import Producer

    producer = _PRODUCERS.get((client, txn_id))
    if producer is None:
        config = {
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,  # under the options: a user's own value wins
            **dict(client),
            "transactional.id": txn_id,
            "enable.idempotence": True,
            "acks": "all",
        }
        producer = Producer({**config, "linger.ms": 20})
        producer.init_transactions(TIMEOUT_S)  # fences older attempts, aborts what they left open
        _PRODUCERS[(client, txn_id)] = producer
    return producer


def _forget(client: tuple[tuple[str, str], ...], txn_id: str) -> None:
    _PRODUCERS.pop((client, txn_id), None)


def _consumer(client: tuple[tuple[str, str], ...], group: str) -> Any:
    from confluent_kafka import Consumer

    consumer = _CONSUMERS.get((client, group))
    if consumer is None:
        config = {**dict(client), "group.id": group, "enable.auto.commit": False}
        consumer = Consumer({**config, "isolation.level": "read_committed"})
        _CONSUMERS[(client, group)] = consumer
    return consumer


def _produce(producer: Any, topic: str, key: bytes | None, value: bytes | None, headers: list[Any]) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, headers=headers)
            return
        except BufferError:  # the local queue is full: let librdkafka send some first
            producer.poll(0.05)


def _reason(error: BaseException) -> str:
    detail = error.args[0] if error.args else error
    return str(detail.str()) if hasattr(detail, "str") else str(detail)


def _refused(error: BaseException) -> bool:
    """Whether trying again cannot help: a producer setting librdkafka rejects, the broker's authorization, or a
    schema the registry will not take (incompatible with the subject's). Anything else (a broker or registry
    away, a fenced or aborted transaction) may well pass on the next attempt, with a new producer."""
    from confluent_kafka import KafkaError
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(error, SchemaRegistryError):
        return error.http_status_code in (401, 403, 409, 422)
    detail = error.args[0] if error.args else None
    if isinstance(detail, KafkaError):
        return detail.code() in (
            KafkaError._INVALID_ARG,
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.GROUP_AUTHORIZATION_FAILED,
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        )
    return isinstance(error, ValueError | TypeError)


class KafkaTableSink(RecordedSink):
    """Driver side of one ``type: kafka`` sink."""

    def __init__(self, pipeline: Pipeline, sink_id: str, sink: KafkaSink, dsn: str, settings: Settings) -> None:
        super().__init__(pipeline, sink_id, dsn)
        self.sink = sink
        self.client: dict[str, str] = {
            "bootstrap.servers": sink.bootstrap_servers or settings.bootstrap_servers,
            **settings.kafka.options,
            **sink.options,
        }
        self.registry = SchemaRegistryAccess.from_settings(settings) if sink.data_format == "avro" else None
        self._topic_checked = False

    @property
    def target_name(self) -> str:
        return f"topic {self.sink.topic}"

    def prepare(self, ledger_key: dict[str, Any]) -> bool:
        if not self._topic_checked:
            ensure_topic(self.client, self.sink.topic, self.sink.topic_partitions, self.sink_id)
            self._topic_checked = True
        return super().prepare(ledger_key)

    def stage_writer(self, batch_id: int, checkpoint_id: str = "") -> KafkaWriter:
        return KafkaWriter(
            topic=self.sink.topic,
            data_format=self.sink.data_format,
            json_schemas=self.sink.json_schemas,
            tombstones=self.sink.tombstones_after_delete,
            key=tuple(self.pipeline.sink_primary_key(self.sink)),
            client=tuple(sorted(self.client.items())),
            registry=self.registry,
            pipeline=self.pipeline.name,
            sink_id=self.sink_id,
            input_id=self.sink.from_,
            checkpoint_id=checkpoint_id,
            batch_id=batch_id,
        )


def _known_partitions(metadata: Any, topic: str) -> int | None:
    """The partitions the cluster's ``metadata`` gives ``topic``; None while it does not show them. A topic just
    created can be listed for a moment with an error or with no partitions (the brokers' metadata catches up), which
    is not a topic with too few partitions."""
    described = metadata.topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        return None
    return len(described.partitions)


def ensure_topic(client: dict[str, Any], topic: str, partitions: int, sink_id: str) -> None:
    """Create ``topic`` with ``partitions`` partitions when it is missing; refuse one with fewer (adding
    partitions would move keys to other partitions, and with them the order consumers rely on)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    doing = f"sink '{sink_id}': topic {topic}"
    admin = AdminClient(client)
    try:
        # no topic argument: asking for a missing topic by name may make the broker create it with its defaults
        has = _known_partitions(admin.list_topics(timeout=TIMEOUT_S), topic)
        if has is None:
            future = admin.create_topics([NewTopic(topic, num_partitions=partitions)], operation_timeout=TIMEOUT_S)
            try:
                future[topic].result(TIMEOUT_S)
            except KafkaException as error:
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            deadline = time.monotonic() + TIMEOUT_S
            while (has := _known_partitions(admin.list_topics(topic, timeout=TIMEOUT_S), topic)) is None:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
    except KafkaException as error:
        raise ServiceError(f"{doing}: {_reason(error)}", retriable=True) from None
    if has is None:
        raise ServiceError(f"{doing}: the brokers' metadata does not show its partitions yet", retriable=True)
    if has < partitions:
        raise UserError(
            f"{doing} has {has} partition(s), fewer than topic_partitions: {partitions}",
            hint="lower topic_partitions, or add partitions to the topic yourself (keys then move partition)",
        )
