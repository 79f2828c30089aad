"""Avro writer schemas from a schema registry: how executors reach it, and the schemas they fetch.

Writer schemas are fetched by id through confluent-kafka's ``SchemaRegistryClient`` and kept per executor process,
keyed by registry URL and id (ids are immutable, so one fetch per id for the life of the process). They are parsed
once with fastavro, with ``logicalType`` annotations stripped so that fastavro hands over the raw ints and bytes;
the annotations decide the mapping instead (:mod:`cdcsync.sources.debezium.avro_values`).

* A schema id the registry does not know (HTTP 404 with Confluent's error code 40403) is asked again in the next
  task, never cached; the messages written with it are dead letters.
* An HTTP 404 with any other error code is not about the id: the URL does not serve the Schema Registry API (a
  wrong path: Apicurio serves it under ``/apis/ccompat/v7``). That is the configuration's fault, so, like a
  refusal, the task fails and nothing is dead-lettered: otherwise every message would be.
* The registry being unreachable (connection refused or reset, timeouts, HTTP 408/429/5xx) is retried with
  exponential backoff for ``retry_timeout_s``; then, as when it refuses the credentials (HTTP 401/403), the task
  fails with a ``service_unavailable`` report: an infrastructure fault is never a dead letter, the driver retries
  the batch and in the end stops the run (exit 1), and the batch is read again by the next run.
* Registry credentials (``basic.auth.user.info``, a password in the URL, password-like client options) never
  appear in ``repr``, logs or dead-letter reasons.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from cdcsync.core.errors import DependencyError
from cdcsync.sources.debezium.avro_schema import collect_names, full_name

if TYPE_CHECKING:
    from cdcsync.config.settings import Settings

MAX_REASON = 400
"""Reasons about a registry or a writer schema are cut to this length (a proxy's error page can be long)."""
_FIRST_BACKOFF_S = 0.2
_MAX_BACKOFF_S = 5.0
_RETRIABLE_HTTP = frozenset({408, 429, 500, 502, 503, 504})
_SECRET_OPTION_WORDS = ("password", "secret", "token", "user.info", "credentials")


def redact_url(url: str) -> str:
    """The URL(s) with any ``user:password@`` replaced by ``***@``, for messages and logs."""
    shown = []
    for one in url.split(","):
        parts = urlsplit(one.strip())
        if "@" in parts.netloc:
            parts = parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1])
        shown.append(urlunsplit(parts))
    return ",".join(shown)


@dataclass(frozen=True)
class SchemaRegistryAccess:
    """How executors reach the schema registry. ``repr`` shows the redacted URL only."""

    url: str
    basic_auth_user_info: str | None = field(default=None, repr=False)
    """``user:password`` (the client's ``basic.auth.user.info``)."""
    options: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """Other native ``SchemaRegistryClient`` keys (``ssl.ca.location`` ...), verbatim."""
    retry_timeout_s: float = 60.0
    """How long an unreachable registry is retried before the message is given up on."""

    def __repr__(self) -> str:
        return f"SchemaRegistryAccess(url={redact_url(self.url)!r}, retry_timeout_s={self.retry_timeout_s!r})"

    @classmethod
    def from_settings(cls, settings: Settings) -> SchemaRegistryAccess:
        section = settings.schema_registry
        secret = section.basic_auth_user_info
        return cls(
            url=settings.schema_registry_url,
            basic_auth_user_info=secret.get_secret_value() if secret is not None else None,
            options=tuple(sorted(section.options.items())),
            retry_timeout_s=section.retry_timeout_s,
        )

    @property
    def shown_url(self) -> str:
        return redact_url(self.url)

    def client_config(self) -> dict[str, Any]:
        """``SchemaRegistryClient`` configuration: its own retries off (ours are bounded by time instead)."""
        config: dict[str, Any] = {
            "url": self.url,
            "max.retries": 0,
            "timeout": max(1.0, min(10.0, self.retry_timeout_s)),
        }
        config.update(dict(self.options))
        if self.basic_auth_user_info:
            config["basic.auth.user.info"] = self.basic_auth_user_info
        return config

    def scrub(self, text: str) -> str:
        """``text`` with every secret this access holds replaced by ``***``."""
        secrets: list[str] = []
        if self.basic_auth_user_info:
            secrets.append(self.basic_auth_user_info)
            secrets.append(self.basic_auth_user_info.split(":", 1)[-1])
        for one in self.url.split(","):
            password = urlsplit(one.strip()).password
            if password:
                secrets.append(password)
        secrets += [value for key, value in self.options if any(w in key.lower() for w in _SECRET_OPTION_WORDS)]
        text = text.replace(self.url, self.shown_url)
        for secret in sorted((s for s in secrets if s), key=len, reverse=True):
            text = text.replace(secret, "***")
        return text


# --------------------------------------------------------------------------------------------------------------
# Writer schemas: fetched once per (registry, id) and executor process
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Writer:
    """A registry schema, parsed: the original JSON (with its annotations) and fastavro's form without logical
    types (so fastavro yields raw ints and bytes and the annotations decide)."""

    schema_id: int
    original: Any
    parsed: Any
    names: dict[str, Any]
    """Named types (records, enums, fixed) by full and short name, for resolving references by name."""

    @property
    def name(self) -> str:
        if isinstance(self.original, dict) and isinstance(self.original.get("name"), str):
            return full_name(self.original, "")[0]
        return json.dumps(self.original)[:40]


NOT_FOUND_CODES = frozenset({40401, 40402, 40403})
"""Confluent's error codes (Apicurio's Confluent-compatible API gives the same) for a subject, a version or a
schema id the registry does not have: the only HTTP 404 answers that are about what was asked for."""

WRONG_URL_HINT = (
    "check CDCSYNC__SCHEMA_REGISTRY__URL: it must be the base URL of a Confluent-compatible Schema Registry API "
    "(Apicurio Registry serves one under /apis/ccompat/v7)"
)


def is_not_found(error: Any) -> bool:
    """A registry's answer that it has no such subject, version or id (not a URL that serves no registry)."""
    return getattr(error, "http_status_code", None) == 404 and getattr(error, "error_code", None) in NOT_FOUND_CODES


class NotFound(Exception):
    """The registry answered that it has no such schema id (or refused the request): this task only."""


class Unavailable(Exception):
    """The registry could not be reached within the retry budget, or refused the credentials."""


_CLIENTS: dict[SchemaRegistryAccess, Any] = {}
_WRITERS: dict[tuple[str, int], Writer | str] = {}
"""(registry URL, schema id) -> parsed writer schema, or the permanent reason it cannot be used."""
_FETCH_LOCK = threading.Lock()


def registry_client(access: SchemaRegistryAccess) -> Any:
    client = _CLIENTS.get(access)
    if client is None:
        try:
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError as error:
            raise DependencyError(
                f"the schema registry client cannot be imported ({error})",
                hint="install its extra: pip install 'confluent-kafka[schemaregistry]'",
            ) from None

        client = SchemaRegistryClient(access.client_config())
        _CLIENTS[access] = client
    return client


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Network-level failures of the registry client: httpx2 / httpx ``TransportError`` and OS errors."""
    found: list[type[BaseException]] = [OSError, TimeoutError]
    for module in ("httpx2", "httpx"):
        try:
            found.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def writer_schema(access: SchemaRegistryAccess, schema_id: int) -> Writer | str:
    """The writer schema, or a permanent reason it cannot be used; raises :class:`NotFound` /
    :class:`Unavailable` (reasons scrubbed of secrets) for what a later task may see differently."""
    key = (access.url, schema_id)
    found = _WRITERS.get(key)
    if found is not None:
        return found
    with _FETCH_LOCK:
        found = _WRITERS.get(key)
        if found is None:
            found = parse_writer(schema_id, _fetch(access, schema_id))
            _WRITERS[key] = found
    return found


def _fetch(access: SchemaRegistryAccess, schema_id: int) -> Any:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    transport = _transport_errors()
    client = registry_client(access)
    started = time.monotonic()
    deadline = started + access.retry_timeout_s
    delay = _FIRST_BACKOFF_S
    attempts = 0
    while True:
        attempts += 1
        try:
            return client.get_schema(schema_id)
        except SchemaRegistryError as error:
            status = error.http_status_code
            if is_not_found(error):
                raise NotFound(
                    f"writer schema id {schema_id} is not in the schema registry at {access.shown_url} "
                    f"(HTTP 404, error code {error.error_code}): the message was written against another "
                    "registry, or the schema was deleted"
                ) from None
            if status == 404:  # not about the id: no registry API at this URL, so no message's fault either
                raise Unavailable(
                    access.scrub(
                        f"the schema registry URL {access.shown_url} does not answer as a schema registry "
                        f"({WRONG_URL_HINT}): writer schema id {schema_id} gave HTTP 404, error code "
                        f"{error.error_code}: {error.error_message}"
                    )[:MAX_REASON]
                ) from None
            if status in (401, 403):  # a retry will not help; neither is it the message's fault
                raise Unavailable(
                    access.scrub(
                        f"the schema registry at {access.shown_url} refused writer schema id {schema_id}: "
                        f"HTTP {status}, error code {error.error_code}: {error.error_message} (check "
                        "CDCSYNC__SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO and the registry's permissions)"
                    )
                ) from None
            if status not in _RETRIABLE_HTTP:
                raise NotFound(
                    access.scrub(
                        f"the schema registry at {access.shown_url} refused writer schema id {schema_id}: "
                        f"HTTP {status}, error code {error.error_code}: {error.error_message}"
                    )
                ) from None
            last = f"HTTP {status}: {error.error_message}"
        except transport as error:
            last = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        except Exception as error:  # an answer the client cannot read (a proxy's HTML page...): not transient
            raise NotFound(
                access.scrub(
                    f"the schema registry at {access.shown_url} gave an unusable answer for writer schema id "
                    f"{schema_id}: {type(error).__name__}: {error}"
                )[:MAX_REASON]
            ) from None
        waited = time.monotonic() - started
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Unavailable(
                access.scrub(
                    f"schema registry at {access.shown_url} unreachable: writer schema id {schema_id} could not "
                    f"be fetched in {attempts} attempts over {waited:.1f}s (retry_timeout_s "
                    f"{access.retry_timeout_s:g}): {last}"
                )
            )
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _MAX_BACKOFF_S)


def parse_writer(schema_id: int, schema: Any) -> Writer | str:
    import fastavro

    kind = (getattr(schema, "schema_type", None) or "AVRO").upper()
    if kind != "AVRO":
        return f"writer schema id {schema_id} is a {kind} schema, not Avro (is the source's format right?)"
    if getattr(schema, "references", None):
        return f"writer schema id {schema_id} uses schema references, which cdcsync does not resolve yet"
    try:
        original = json.loads(schema.schema_str)
    except (TypeError, ValueError) as error:
        return f"writer schema id {schema_id} from the registry is not JSON: {error}"
    try:
        parsed = fastavro.parse_schema(strip_logical_types(original))
    except Exception as error:
        return f"writer schema id {schema_id} is not a valid Avro schema: {error}"[:MAX_REASON]
    names: dict[str, Any] = {}
    collect_names(original, "", names)
    return Writer(schema_id=schema_id, original=original, parsed=parsed, names=names)


def strip_logical_types(schema: Any) -> Any:
    """A copy without ``logicalType`` keys (``default`` values are data and are kept as they are)."""
    if isinstance(schema, list):
        return [strip_logical_types(branch) for branch in schema]
    if isinstance(schema, dict):
        return {
            key: value if key == "default" else strip_logical_types(value)
            for key, value in schema.items()
            if key != "logicalType"
        }
    return schema
