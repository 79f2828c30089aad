"""Sinks that own no table: ``print``, ``blackhole``, ``webhook`` and ``kafka`` (Streamling's names and keys).

They need no migration and no target database; their driver side still records every batch in the ledger, so a
checkpoint is checked against them like any sink's, and a replayed batch that landed is skipped. What each
guarantees is stated in docs/sinks.md.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from cdcsync.config.base import StrictModel, as_key_list


class PrintSink(StrictModel):
    """Each change as one JSON line on the executors' standard output, prefixed with its op: for debugging."""

    type: Literal["print"]
    from_: str = Field(alias="from", min_length=1)
    primary_key: list[str] | None = None
    """Accepted for symmetry with other sinks; nothing is keyed."""
    sample_every: int = Field(default=1, gt=0)
    """Print one change in this many (per task, in offset order); 1 prints every change."""

    _normalise_pk = field_validator("primary_key", mode="before")(as_key_list)


class BlackholeSink(StrictModel):
    """Counts the changes and drops them: its throughput is the engine's own ceiling (read, decode, transform)."""

    type: Literal["blackhole"]
    from_: str = Field(alias="from", min_length=1)
    primary_key: list[str] | None = None

    _normalise_pk = field_validator("primary_key", mode="before")(as_key_list)


_SECRET_HEADER_WORDS = ("auth", "token", "key", "secret", "password", "cookie", "signature")


def is_secret_header(name: str) -> bool:
    """Header names whose values are never logged or shown (``Authorization``, ``X-Api-Key``, ...)."""
    folded = name.lower()
    return any(word in folded for word in _SECRET_HEADER_WORDS)


def http_url(url: str) -> str:
    """Validator of a ``url:`` that cdcsync POSTs to (the webhook sink, the handler transform)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    return url


def http_headers(headers: dict[str, str]) -> dict[str, str]:
    """Validator of ``headers:``: names are single words, values one line of text."""
    for name, value in headers.items():
        if not name or any(ch in name for ch in ":\r\n ") or not isinstance(value, str) or "\n" in value:
            raise ValueError(f"'{name}': header names are single words and values one line of text")
    return headers


class WebhookSink(StrictModel):
    """Batches of changes POSTed as JSON to ``url``, each request carrying an idempotency key."""

    type: Literal["webhook"]
    from_: str = Field(alias="from", min_length=1)
    url: str = Field(min_length=1)
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request; values of secret-looking names (see :func:`is_secret_header`) are never logged."""
    timeout_s: float = Field(default=10.0, gt=0)
    """Per request: connect, send and wait for the answer."""
    batch_size: int = Field(default=500, gt=0)
    """Changes per request, at most (a task's partition is split into parts of this size)."""
    primary_key: list[str] | None = None

    _normalise_pk = field_validator("primary_key", mode="before")(as_key_list)

    _http_url = field_validator("url")(http_url)

    @field_validator("headers")
    @classmethod
    def _header_names(cls, headers: dict[str, str]) -> dict[str, str]:
        for name in http_headers(headers):
            if name.lower() == IDEMPOTENCY_HEADER.lower():
                raise ValueError(f"'{name}' is set by cdcsync itself on every request")
        return headers


IDEMPOTENCY_HEADER = "Idempotency-Key"
"""The request header naming (pipeline, sink, checkpoint, batch, part): the same on every replay of that part."""

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
KAFKA_SINK_OWN_OPTIONS = frozenset(
    {"bootstrap.servers", "transactional.id", "enable.idempotence", "acks", "isolation.level", "group.id"}
)
"""Producer keys cdcsync sets itself: the transactions the sink's guarantee rests on need them as they are."""


class KafkaSink(StrictModel):
    """Changes written to ``topic`` as Debezium change events, keyed by the primary key, one Kafka transaction
    per task of a micro-batch (see :mod:`cdcsync.sinks.kafka`)."""

    type: Literal["kafka"]
    from_: str = Field(alias="from", min_length=1)
    topic: str = Field(min_length=1)
    data_format: Literal["json", "avro"] = "json"
    """``json``: Kafka Connect's JsonConverter shape; ``avro``: the Confluent wire format, schemas registered in the
    schema registry the sources use (``CDCSYNC__SCHEMA_REGISTRY__*``), subjects ``<topic>-key`` / ``<topic>-value``."""
    json_schemas: bool = True
    """``json`` only: wrap each key and value as ``{"schema", "payload"}`` (JsonConverter's ``schemas.enable``, its
    default), so a consumer reads exact types (decimal scale, timestamp units) without being told the columns."""
    topic_partitions: int = Field(default=1, gt=0)
    """Partitions of the topic when ``run`` creates it; an existing topic with fewer is refused."""
    tombstones_after_delete: bool = True
    """Follow each delete with a tombstone (the key, a null value), as Debezium's ``tombstones.on.delete``."""
    primary_key: list[str] | None = None
    """The message key's columns; defaults to the input's primary key."""
    bootstrap_servers: str | None = None
    """Defaults to ``CDCSYNC__KAFKA__BOOTSTRAP_SERVERS`` (the brokers the sources read)."""
    options: dict[str, str] = Field(default_factory=dict)
    """Native producer keys (``security.protocol``, ``compression.type`` ...), verbatim, over the settings'
    ``kafka.options``; not the keys in :data:`KAFKA_SINK_OWN_OPTIONS`."""

    _normalise_pk = field_validator("primary_key", mode="before")(as_key_list)

    @field_validator("topic")
    @classmethod
    def _topic_name(cls, topic: str) -> str:
        if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
            raise ValueError(f"{topic!r} is not a Kafka topic name (letters, digits, '.', '_', '-'; at most 249)")
        return topic

    @field_validator("options")
    @classmethod
    def _own_options(cls, options: dict[str, str]) -> dict[str, str]:
        for name in options:
            if name in KAFKA_SINK_OWN_OPTIONS:
                raise ValueError(f"'{name}' is set by cdcsync itself (its transactions rest on it)")
        return options


OperatorSink = PrintSink | BlackholeSink | WebhookSink | KafkaSink
OPERATOR_SINK_TYPES: dict[str, type[StrictModel]] = {
    "print": PrintSink,
    "blackhole": BlackholeSink,
    "webhook": WebhookSink,
    "kafka": KafkaSink,
}
