"""Sinks that own no table: ``print``, ``blackhole`` and ``webhook`` (Streamling's names and keys).

They need no migration and no target database; their driver side still records every batch in the ledger, so a
checkpoint is checked against them like any sink's, and a replayed batch that landed is skipped. What each
guarantees is stated in docs/sinks.md.
"""

from __future__ import annotations

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

OperatorSink = PrintSink | BlackholeSink | WebhookSink
OPERATOR_SINK_TYPES: dict[str, type[StrictModel]] = {
    "print": PrintSink,
    "blackhole": BlackholeSink,
    "webhook": WebhookSink,
}
