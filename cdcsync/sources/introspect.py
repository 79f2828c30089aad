"""Read a source's columns from its topic's schema, for ``cdcsync init``: users never type column lists by hand.

* ``format: avro``: the latest version of subject ``<topic>-value`` in the schema registry (and ``<topic>-key``
  for the key), read through :mod:`cdcsync.sources.debezium.avro_schema` as Connect schemas.
* ``format: json``: the ``schema`` of the newest JsonConverter messages of the topic (the last few of every
  partition, fields of later messages winning), and the key's ``schema`` for the key. Messages without the
  wrapper (``schemas.enable=false``) carry no types: the user declares ``columns:`` then.

Types come from :func:`cdcsync.sources.debezium.connect.connect_pg_type`, the inverse of the decoder. The result is
merged with what the migrations recorded before (:func:`merge`): recorded columns keep their place, a column the
schema no longer has stays (Debezium stops sending a dropped column; the mirror keeps it, NULL from then on), new
ones go last. Only ``init`` (and ``run`` under ``schema_evolution: auto``, from the message itself) reads schemas;
``validate`` and ``run`` use the recorded ones (:func:`cdcsync.migrations.recorded.recorded_lookup`).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcsync.config.pipeline import KafkaSource, Pipeline, SchemaLookup, SourceSchema, TopicSchemas
from cdcsync.sources.debezium.connect import connect_pg_type, row_fields, struct_fields

if TYPE_CHECKING:
    from cdcsync.config.settings import Settings

TAIL_MESSAGES = 20
"""Messages read from the end of each partition of a JSON topic."""
TIMEOUT_S = 8.0


def schema_from_fields(
    fields: list[dict[str, Any]], key_fields: list[dict[str, Any]] | None, origin: str
) -> SourceSchema:
    """A :class:`SourceSchema` from Connect field schemas: each field's type, or why it has none."""
    columns: list[tuple[str, str]] = []
    unmapped: list[tuple[str, str]] = []
    for field_schema in fields:
        pg = connect_pg_type(field_schema)
        if isinstance(pg, str):
            unmapped.append((field_schema["field"], f"the schema in {origin} types it as {pg}"))
        else:
            columns.append((field_schema["field"], pg.sql))
    key = tuple(f["field"] for f in key_fields) if key_fields else None
    return SourceSchema(tuple(columns), key, tuple(unmapped), origin)


def merge(recorded: SourceSchema | None, fresh: SourceSchema) -> SourceSchema:
    """``fresh`` on top of ``recorded``: recorded columns first (fresh types win, so a type change shows as one),
    then the new ones; a recorded column ``fresh`` lacks stays."""
    if recorded is None:
        return fresh
    fresh_types = dict(fresh.columns)
    columns = [(name, fresh_types.get(name, type_text)) for name, type_text in recorded.columns]
    known = {name for name, _ in columns}
    columns += [(name, type_text) for name, type_text in fresh.columns if name not in known]
    known |= {name for name, _ in fresh.columns}
    unmapped = tuple((name, why) for name, why in fresh.unmapped if name not in known)
    return SourceSchema(tuple(columns), fresh.primary_key or recorded.primary_key, unmapped, fresh.origin)


def introspect(source: KafkaSource, settings: Settings, timeout_s: float = TIMEOUT_S) -> SourceSchema | str:
    """The source's schema, or why it cannot be read (a sentence naming the topic or registry subject)."""
    assert source.topic is not None, "a topic_pattern source is introspected topic by topic"
    if source.format == "avro":
        return _from_registry(source.topic, settings)
    return _from_topic(source.topic, settings, timeout_s)


# ---- Avro: the schema registry ------------------------------------------------------------------------------


def _from_registry(topic: str, settings: Settings) -> SourceSchema | str:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from cdcsync.sources.debezium.avro_registry import WRONG_URL_HINT, SchemaRegistryAccess, is_not_found
    from cdcsync.sources.debezium.avro_schema import collect_names, envelope_row_fields, row_fields_of_record

    access = SchemaRegistryAccess.from_settings(settings)
    where = f"the schema registry at {access.shown_url}"

    def latest(subject: str) -> Any:
        try:
            registered = client.get_latest_version(subject)
        except SchemaRegistryError as error:
            if is_not_found(error):
                return None
            raise
        return json.loads(registered.schema.schema_str or "null")

    try:
        client = SchemaRegistryClient(access.client_config())
        value = latest(f"{topic}-value")
        key = latest(f"{topic}-key") if value is not None else None
    except Exception as error:  # unreachable, refused, a bad answer: all say the same to the user
        hint = f" ({WRONG_URL_HINT})" if getattr(error, "http_status_code", None) == 404 else ""
        return access.scrub(f"{where} could not be read{hint}: {type(error).__name__}: {error}")[:500]
    if value is None:
        return f"{where} has no subject '{topic}-value' (nothing was published to topic {topic} in Avro yet?)"
    origin = f"subject '{topic}-value' of {where}"
    names: dict[str, Any] = {}
    collect_names(value, "", names)
    fields = envelope_row_fields(value, names)
    if fields is None:
        return f"the latest schema of {origin} is not a Debezium envelope (no 'after' or 'before' record)"
    key_fields = None
    if key is not None:
        key_names: dict[str, Any] = {}
        collect_names(key, "", key_names)
        key_fields = row_fields_of_record(key, key_names)
    return schema_from_fields(fields, key_fields, origin)


# ---- JSON: the newest messages of the topic ------------------------------------------------------------------


def _from_topic(topic: str, settings: Settings, timeout_s: float) -> SourceSchema | str:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    if not _any_reachable(settings.bootstrap_servers, min(timeout_s, 3.0)):
        return f"Kafka at {settings.bootstrap_servers} cannot be reached"
    config: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka.options}
    config.update({"group.id": "cdcsync-init", "enable.auto.commit": False, "log_level": 0})
    try:
        consumer = Consumer(config)
    except (KafkaException, ValueError, TypeError) as error:
        return f"reading topic {topic}: the Kafka client refused its configuration: {error}"
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout_s)
        except KafkaException as error:
            return f"Kafka at {settings.bootstrap_servers} did not answer within {timeout_s:.0f}s ({error.args[0]})"
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return f"topic {topic} does not exist (yet)"
        ends: dict[int, int] = {}
        starts = []
        for partition in sorted(found.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
            if high > low:
                ends[partition] = high
                starts.append(TopicPartition(topic, partition, max(low, high - TAIL_MESSAGES)))
        if not starts:
            return f"topic {topic} has no messages yet"
        consumer.assign(starts)
        messages = []
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            messages.append(message)
            partition, offset = message.partition() or 0, message.offset() or 0
            if offset >= ends.get(partition, 0) - 1:
                ends.pop(partition, None)
    finally:
        consumer.close()
    return _schema_of_messages(topic, messages)


def _any_reachable(bootstrap_servers: str, timeout_s: float) -> bool:
    """Whether any bootstrap server accepts a TCP connection: librdkafka would wait out its whole timeout for a
    refused one, and ``init`` should fall back to declared columns at once."""
    for address in bootstrap_servers.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            continue
    return False


def _schema_of_messages(topic: str, messages: list[Any]) -> SourceSchema | str:
    """Union of the row fields of the messages' envelope schemas, oldest first (a later type wins)."""
    fields: dict[str, dict[str, Any]] = {}
    key_fields: list[dict[str, Any]] | None = None
    bare = 0
    for message in sorted(messages, key=lambda m: (m.timestamp()[1], m.offset())):
        value = _wrapped(message.value())
        if value is None:
            bare += message.value() is not None
            continue
        for field_schema in row_fields(value) or []:
            fields[field_schema["field"]] = field_schema
        key = _wrapped(message.key())
        if key is not None:
            key_fields = struct_fields(key) or key_fields
    if not fields:
        if bare:
            return (
                f"the newest messages of topic {topic} have no schema wrapper (JsonConverter with "
                "schemas.enable=false), so their column types cannot be read"
            )
        return f"the newest messages of topic {topic} are not Debezium change events with a schema"
    return schema_from_fields(list(fields.values()), key_fields, f"topic {topic}")


def _wrapped(raw: bytes | None) -> dict[str, Any] | None:
    """The ``schema`` of a JsonConverter message with the schema/payload wrapper, else None."""
    if not raw:
        return None
    try:
        document = json.loads(raw)
    except ValueError:
        return None
    if type(document) is dict and type(document.get("schema")) is dict and "payload" in document:
        return document["schema"]
    return None


# ---- init's lookup -------------------------------------------------------------------------------------------


def init_lookup(settings: Settings, migrations_dir: Path | str, notes: list[str]) -> SchemaLookup:
    """The ``schema_for`` of ``cdcsync init``: each source's schema read now, merged with the recorded one.

    When it cannot be read, the recorded schema (else the declared columns) is used and a note says why; a
    source with neither is a validation problem naming the reason."""
    from cdcsync.migrations.recorded import recorded_schemas

    def lookup(pipeline_name: str, source_id: str, source: KafkaSource) -> SourceSchema | TopicSchemas | str | None:
        if source.topic_pattern is not None:
            return _tables(recorded_schemas(migrations_dir, pipeline_name), source_id, source, settings, notes)
        topic, recorded = recorded_schemas(migrations_dir, pipeline_name).get(source_id, (None, None))
        if topic != source.topic:
            recorded = None
        fresh = introspect(source, settings)
        if isinstance(fresh, SourceSchema):
            return merge(recorded, fresh)
        if recorded is not None:
            notes.append(f"source '{source_id}': {fresh}; kept the columns recorded in {recorded.origin}")
            return recorded
        if source.columns:
            notes.append(f"source '{source_id}': {fresh}; using the declared columns")
            return None
        return f"cannot be read: {fresh}; declare them here (name: Postgres type)"

    return lookup


# ---- topic_pattern sources -----------------------------------------------------------------------------------


def _tables(
    recorded: dict[str, tuple[str, SourceSchema]],
    source_id: str,
    source: KafkaSource,
    settings: Settings,
    notes: list[str],
) -> TopicSchemas | str:
    """Each table of a ``topic_pattern`` source: the matching topics Kafka lists now, each introspected and merged
    with what was recorded, plus recorded ones Kafka no longer lists (their mirrors stay). A listed topic whose
    schema cannot be read yet (no message) is left for a later ``init``, with a note."""
    from cdcsync.migrations.recorded import recorded_tables

    assert source.topic_pattern is not None
    tables: TopicSchemas = dict(recorded_tables(recorded, source_id, source.topic_pattern))
    listed = matching_topics(source.topic_pattern, settings)
    if isinstance(listed, str):
        if not tables:
            return f"cannot list the topics matching it: {listed}"
        notes.append(f"source '{source_id}': {listed}; kept the tables recorded before")
        return tables
    for topic in listed:
        fresh = introspect(source.model_copy(update={"topic": topic, "topic_pattern": None}), settings)
        known = tables.get(topic)
        if isinstance(fresh, SourceSchema):
            tables[topic] = merge(known if isinstance(known, SourceSchema) else None, fresh)
        elif known is None:
            notes.append(f"source '{source_id}': skipped topic {topic} for now: {fresh}; run init again later")
    if not tables:
        notes.append(f"source '{source_id}': no topic matching '{source.topic_pattern}' has messages yet")
    return tables


def matching_topics(pattern: str, settings: Settings, timeout_s: float = TIMEOUT_S) -> list[str] | str:
    """The topics whose whole name matches ``pattern``, sorted (Kafka's internal ``__`` topics never match), or
    why Kafka could not list them."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from cdcsync.config.routing import matches

    if not _any_reachable(settings.bootstrap_servers, min(timeout_s, 3.0)):
        return f"Kafka at {settings.bootstrap_servers} cannot be reached"
    config: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka.options}
    config["log_level"] = 0
    try:
        metadata = AdminClient(config).list_topics(timeout=timeout_s)
    except (KafkaException, ValueError, TypeError) as error:
        return f"Kafka at {settings.bootstrap_servers} did not list its topics: {error}"
    return sorted(topic for topic in metadata.topics if not topic.startswith("__") and matches(pattern, topic))


def truncate_note(pipeline: Pipeline) -> str | None:
    """What ``init`` reminds a user of when sinks apply truncates: Debezium publishes none unless told to."""
    applying = sorted(
        sink_id for sink_id, sink in pipeline.postgres_sinks().items() if getattr(sink, "on_truncate", "") == "apply"
    )
    if not applying:
        return None
    return (
        f"sink(s) {', '.join(applying)} apply source TRUNCATEs (on_truncate: apply), but Debezium's Postgres "
        "connector skips them unless its config sets skipped.operations=none (its default is t); set it, or set "
        "on_truncate: ignore to say that truncates are not expected"
    )
