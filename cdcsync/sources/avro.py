"""Decode Debezium change events in Avro: Confluent wire format, writer schemas from a schema registry.

``format: avro`` sources reach this module through :func:`cdcsync.sources.debezium.decode_batches`; the output
is exactly the JSON decoder's (same columns, ``_cdc_*`` metadata and dead-letter rows), because the values end in
the same per-type converters: this module only turns each Avro value into what JsonConverter would have written
for it, then lets :class:`~cdcsync.sources.debezium._Plan`'s generated row decoder do the rest.

A message is ``0x00`` (magic byte), a 4-byte big-endian schema id, and the Avro binary body written with that
schema. Everything runs on executors:

* Writer schemas are fetched by id through confluent-kafka's ``SchemaRegistryClient`` and kept per executor
  process, keyed by registry URL and id (ids are immutable, so one fetch per id for the life of the process).
  They are parsed once with fastavro, with ``logicalType`` annotations stripped so that fastavro hands over the
  raw ints and bytes; the annotations (``connect.name`` first, then ``logicalType``) decide the mapping instead:
  ``io.debezium.time.{Date, Timestamp, MicroTimestamp, NanoTimestamp, Time, MicroTime, NanoTime}`` and the
  Connect / Avro ``date``, ``timestamp-*``, ``time-*`` types are scaled to what the column holds; Connect
  ``Decimal`` / Avro ``decimal`` bytes and ``io.debezium.data.VariableScaleDecimal`` records become exact
  decimals; ``ZonedTimestamp``, ``ZonedTime``, ``Json``, ``Uuid``, ``Enum`` and ``Interval`` are strings as in
  JSON; bytes (``Bits`` too) stay binary for ``bytea`` and become base64 text elsewhere, as JsonConverter writes
  them; arrays, maps and records become JSON text for ``text`` / ``json`` columns. Avro ``float`` values are read
  as the shortest decimal that round-trips through 32 bits (``0.1``, not ``0.10000000149011612``), as Connect's
  JsonConverter prints them.
* Each writer schema is read as written: a stream whose schema evolved (a column added with a default) decodes
  message by message with its own writer schema, and a declared column that a message's writer schema lacks is
  null, like a field missing from a JSON message. No reader schema is applied.
* Per-message failures are dead letters with a ``_dlq_reason``: a bad magic byte, a schema id the registry does
  not know (HTTP 404; asked again in the next task, never cached), a body that does not decode with its writer
  schema (or leaves bytes over), a writer schema that is not Avro or uses references, and values that do not fit
  the declared type (the JSON decoder's own checks).
* The registry being unreachable (connection refused or reset, timeouts, HTTP 408/429/5xx) is retried with
  exponential backoff for ``retry_timeout_s``; then the message is dead-lettered with a reason that says the
  registry was unreachable (under ``on_decode_error: fail`` that stops the run, through the usual decode-failure
  path). Within one task the registry is not waited for twice: later unknown ids fail at once.
* Registry credentials (``basic.auth.user.info``, a password in the URL, password-like client options) never
  appear in ``repr``, logs or dead-letter reasons.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from io import BytesIO
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from cdcsync.config.types import PgType
from cdcsync.core.errors import DecodeError, DependencyError
from cdcsync.sources.debezium import (
    _INT_RANGES,
    _TIME_UNITS,
    _TIMESTAMP_UNITS,
    _US_PER_DAY,
    DecodeSpec,
    _dumps_exact,
    _Plan,
    _plan_for,
    _Reject,
    _Reparse,
    _scale_int,
    _show,
    schema_change_of,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.config.settings import Settings

WIRE_MAGIC = 0
HEADER_BYTES = 5
_MAX_REASON = 400
_FIRST_BACKOFF_S = 0.2
_MAX_BACKOFF_S = 5.0
_RETRIABLE_HTTP = frozenset({408, 429, 500, 502, 503, 504})
_SECRET_OPTION_WORDS = ("password", "secret", "token", "user.info", "credentials")


# --------------------------------------------------------------------------------------------------------------
# Registry access (part of the DecodeSpec, so picklable, hashable and with secrets out of repr)
# --------------------------------------------------------------------------------------------------------------


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
class _Writer:
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
            return _full_name(self.original, "")[0]
        return json.dumps(self.original)[:40]


class _NotFound(Exception):
    """The registry answered that it has no such schema id (or refused the request): this task only."""


class _Unavailable(Exception):
    """The registry could not be reached within the retry budget."""


_CLIENTS: dict[SchemaRegistryAccess, Any] = {}
_WRITERS: dict[tuple[str, int], _Writer | str] = {}
"""(registry URL, schema id) -> parsed writer schema, or the permanent reason it cannot be used."""
_FETCH_LOCK = threading.Lock()


def _client(access: SchemaRegistryAccess) -> Any:
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


def _writer(access: SchemaRegistryAccess, schema_id: int) -> _Writer | str:
    """The writer schema, or a permanent reason it cannot be used; raises :class:`_NotFound` /
    :class:`_Unavailable` (reasons scrubbed of secrets) for what a later task may see differently."""
    key = (access.url, schema_id)
    found = _WRITERS.get(key)
    if found is not None:
        return found
    with _FETCH_LOCK:
        found = _WRITERS.get(key)
        if found is None:
            found = _parse_writer(schema_id, _fetch(access, schema_id))
            _WRITERS[key] = found
    return found


def _fetch(access: SchemaRegistryAccess, schema_id: int) -> Any:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    transport = _transport_errors()
    client = _client(access)
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
            if status == 404:
                raise _NotFound(
                    f"writer schema id {schema_id} is not in the schema registry at {access.shown_url} "
                    f"(HTTP 404, error code {error.error_code}): the message was written against another "
                    "registry, or the schema was deleted"
                ) from None
            if status not in _RETRIABLE_HTTP:
                hint = (
                    " (check CDCSYNC__SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO and the registry's permissions)"
                    if status in (401, 403)
                    else ""
                )
                raise _NotFound(
                    access.scrub(
                        f"the schema registry at {access.shown_url} refused writer schema id {schema_id}: "
                        f"HTTP {status}, error code {error.error_code}: {error.error_message}{hint}"
                    )
                ) from None
            last = f"HTTP {status}: {error.error_message}"
        except transport as error:
            last = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        except Exception as error:  # an answer the client cannot read (a proxy's HTML page...): not transient
            raise _NotFound(
                access.scrub(
                    f"the schema registry at {access.shown_url} gave an unusable answer for writer schema id "
                    f"{schema_id}: {type(error).__name__}: {error}"
                )[:_MAX_REASON]
            ) from None
        waited = time.monotonic() - started
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Unavailable(
                access.scrub(
                    f"schema registry at {access.shown_url} unreachable: writer schema id {schema_id} could not "
                    f"be fetched in {attempts} attempts over {waited:.1f}s (retry_timeout_s "
                    f"{access.retry_timeout_s:g}): {last}"
                )
            )
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _MAX_BACKOFF_S)


def _parse_writer(schema_id: int, schema: Any) -> _Writer | str:
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
        parsed = fastavro.parse_schema(_strip_logical_types(original))
    except Exception as error:
        return f"writer schema id {schema_id} is not a valid Avro schema: {error}"[:_MAX_REASON]
    names: dict[str, Any] = {}
    _collect_names(original, "", names)
    return _Writer(schema_id=schema_id, original=original, parsed=parsed, names=names)


def _strip_logical_types(schema: Any) -> Any:
    """A copy without ``logicalType`` keys (``default`` values are data and are kept as they are)."""
    if isinstance(schema, list):
        return [_strip_logical_types(branch) for branch in schema]
    if isinstance(schema, dict):
        return {
            key: value if key == "default" else _strip_logical_types(value)
            for key, value in schema.items()
            if key != "logicalType"
        }
    return schema


_NAMED = ("record", "error", "enum", "fixed")
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def _full_name(schema: dict[str, Any], namespace: str) -> tuple[str, str]:
    """(full name, namespace its nested types inherit), by the Avro specification's rules."""
    name = str(schema.get("name", ""))
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    space = schema.get("namespace", namespace) or ""
    return (f"{space}.{name}" if space else name), space


def _collect_names(schema: Any, namespace: str, names: dict[str, Any]) -> None:
    if isinstance(schema, list):
        for branch in schema:
            _collect_names(branch, namespace, names)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in _NAMED:
            full, space = _full_name(schema, namespace)
            names[full] = (schema, space)
            names.setdefault(full.rsplit(".", 1)[-1], (schema, space))
            for f in schema.get("fields", []) if kind in ("record", "error") else []:
                if isinstance(f, dict):
                    _collect_names(f.get("type"), space, names)
        elif kind == "array":
            _collect_names(schema.get("items"), namespace, names)
        elif kind == "map":
            _collect_names(schema.get("values"), namespace, names)
        elif isinstance(kind, (dict, list)):
            _collect_names(kind, namespace, names)


def _resolve(schema: Any, names: dict[str, Any], namespace: str) -> tuple[Any, str]:
    """A type reference by name resolved to its definition; (schema, namespace for what is inside it)."""
    if isinstance(schema, str) and schema not in _PRIMITIVES:
        for candidate in (f"{namespace}.{schema}" if namespace and "." not in schema else schema, schema):
            if candidate in names:
                return names[candidate]
        return schema, namespace
    if isinstance(schema, dict):
        kind = schema.get("type")
        if isinstance(kind, (dict, list)):  # {"type": {...}} wrapping
            return _resolve(kind, names, namespace)
        if kind in _NAMED:
            return schema, _full_name(schema, namespace)[1]
    return schema, namespace


def _record_fields(schema: Any, names: dict[str, Any], namespace: str) -> tuple[dict[str, Any], str] | None:
    """{field name: type} of a record (or of the one record in an optional union), else None."""
    schema, namespace = _resolve(schema, names, namespace)
    if isinstance(schema, list):
        live = [_resolve(b, names, namespace) for b in schema if b != "null"]
        if len(live) != 1:
            return None
        schema, namespace = live[0]
    if not isinstance(schema, dict) or schema.get("type") not in ("record", "error"):
        return None
    fields = {f["name"]: f.get("type") for f in schema.get("fields", []) if isinstance(f, dict) and "name" in f}
    return fields, namespace


# --------------------------------------------------------------------------------------------------------------
# Avro value -> what the JSON decoder's converter for the declared type accepts
# --------------------------------------------------------------------------------------------------------------

Translate = Callable[[Any], Any]

_TEXT_KINDS = frozenset({"text", "character varying", "character", "json", "jsonb"})
_TIMESTAMP_KINDS = frozenset({"timestamp without time zone", "timestamp with time zone"})
_INTEGRAL_KINDS = frozenset({*_INT_RANGES, "date", "time without time zone", *_TIMESTAMP_KINDS})
_AVRO_TIMESTAMP_UNITS: dict[str, int] = {
    **_TIMESTAMP_UNITS,
    "timestamp-millis": 1000,
    "local-timestamp-millis": 1000,
    "timestamp-micros": 1,
    "local-timestamp-micros": 1,
    "timestamp-nanos": -1000,
    "local-timestamp-nanos": -1000,
    "io.debezium.time.Date": _US_PER_DAY,
    "org.apache.kafka.connect.data.Date": _US_PER_DAY,
    "date": _US_PER_DAY,
}
_AVRO_TIME_UNITS: dict[str, int] = {**_TIME_UNITS, "time-millis": 1000, "time-micros": 1}
_CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_FLOAT32 = struct.Struct("<f")


def _float32_text(value: float) -> str:
    """The shortest decimal that reads back as this 32-bit float, as Java's ``Float.toString`` finds it."""
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if _FLOAT32.unpack(_FLOAT32.pack(float(text)))[0] == value:
            return text
    return repr(value)  # pragma: no cover - nine significant digits always round-trip a float32


def _decimal_of(unscaled: int, scale: int) -> Decimal:
    return Decimal(f"{unscaled}E{-scale}")  # from text: exact, whatever the digits (Decimal.scaleb rounds)


def _decimal_bytes(scale: int) -> Translate:
    def translate(value: Any) -> Any:
        if type(value) is not bytes:
            return value
        return _decimal_of(int.from_bytes(value, "big", signed=True), scale)

    return translate


def _integral_decimal(scale: int, pg: PgType) -> Translate:
    """A decimal into an integer column: its integer value when it has no fraction (a ``numeric`` key)."""
    to_decimal = _decimal_bytes(scale)

    def translate(value: Any) -> Any:
        number = to_decimal(value)
        if type(number) is Decimal:
            if number != number.to_integral_value():
                raise _Reject(f"{_show(number)} is not a valid {pg.sql} (not an integer)")
            return int(number)
        return number

    return translate


def _variable_scale_decimal(value: Any) -> Any:
    if type(value) is dict and type(value.get("scale")) is int and type(value.get("value")) is bytes:
        return _decimal_of(int.from_bytes(value["value"], "big", signed=True), value["scale"])
    raise _Reject(f"{_show(value)} is not a VariableScaleDecimal record {{scale, value}}")


def _base64(value: Any) -> Any:
    return base64.b64encode(value).decode("ascii") if type(value) is bytes else value


def _json_text(value: Any) -> str:
    try:
        return _dumps_exact(value)
    except ValueError:
        raise _Reject(f"{_show(value)} is not representable as JSON (NaN or Infinity)") from None


def _plain_jsonable(value: Any) -> Any:
    """A value of unknown Avro type as JsonConverter would write it: bytes as base64, containers recursively."""
    kind = type(value)
    if kind is bytes:
        return base64.b64encode(value).decode("ascii")
    if kind is dict:
        return {k: _plain_jsonable(v) for k, v in value.items()}
    if kind is list:
        return [_plain_jsonable(v) for v in value]
    return value


def _annotations(schema: Any) -> tuple[str, str | None, dict[str, Any]]:
    """(Avro base type, logical name: ``connect.name`` else ``logicalType``, the schema dict or {})."""
    if isinstance(schema, dict):
        base = schema.get("type")
        name = schema.get("connect.name") or schema.get("logicalType")
        return (base if isinstance(base, str) else ""), (name if isinstance(name, str) else None), schema
    return (schema if isinstance(schema, str) else ""), None, {}


def _decimal_scale(info: dict[str, Any]) -> int | None:
    """The scale of a Connect ``Decimal`` / Avro ``decimal`` (bytes or fixed), else None."""
    if info.get("connect.name") != _CONNECT_DECIMAL and info.get("logicalType") != "decimal":
        return None
    scale = info.get("scale")
    if type(scale) is int:
        return scale
    parameters = info.get("connect.parameters")
    if isinstance(parameters, dict):
        try:
            return int(parameters.get("scale", 0))
        except (TypeError, ValueError):
            return None
    return 0


def _jsonable_for(schema: Any, names: dict[str, Any], namespace: str) -> Translate:
    """Avro value -> JSON-able value, honouring the logical types inside records, arrays and maps."""
    schema, namespace = _resolve(schema, names, namespace)
    if isinstance(schema, list):
        live = [b for b in schema if b != "null"]
        if len(live) != 1:
            return _plain_jsonable
        return _jsonable_for(live[0], names, namespace)
    base, logical, info = _annotations(schema)
    if base in ("bytes", "fixed"):
        scale = _decimal_scale(info)
        return _base64 if scale is None else _decimal_bytes(scale)
    if logical == _VARIABLE_SCALE_DECIMAL:
        return _variable_scale_decimal
    if base in ("record", "error"):
        fields = [
            (f["name"], _jsonable_for(f.get("type"), names, namespace))
            for f in info.get("fields", [])
            if isinstance(f, dict) and "name" in f
        ]

        def record(value: Any) -> Any:
            if type(value) is not dict:
                return _plain_jsonable(value)
            return {name: (None if value.get(name) is None else fn(value[name])) for name, fn in fields}

        return record
    if base == "array":
        items = _jsonable_for(info.get("items"), names, namespace)
        return lambda value: [None if v is None else items(v) for v in value] if type(value) is list else value
    if base == "map":
        values = _jsonable_for(info.get("values"), names, namespace)
        return lambda value: (
            {k: None if v is None else values(v) for k, v in value.items()} if type(value) is dict else value
        )
    return _plain_jsonable


def _scaled(unit: int) -> Translate:
    def translate(value: Any) -> Any:
        return _scale_int(value, unit) if type(value) is int else value

    return translate


def _not_integral(pg: PgType) -> Translate:
    def translate(value: Any) -> Any:
        raise _Reject(f"{_show(value)} is not a valid {pg.sql} (not an integer)")

    return translate


def _float_for(pg: PgType, single: bool) -> Translate | None:
    """Avro float/double into a non-integral column: exact decimals for numeric, Connect's text for floats."""
    kind = pg.name
    if kind == "real":
        return None
    if kind == "numeric":

        def numeric(value: Any) -> Any:
            if type(value) is not float:
                return value
            if not math.isfinite(value):
                return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            return Decimal(_float32_text(value) if single else repr(value))

        return numeric
    if not single:
        return None
    if kind in _TEXT_KINDS:
        return lambda value: _float32_text(value) if type(value) is float and math.isfinite(value) else value
    return lambda value: float(_float32_text(value)) if type(value) is float and math.isfinite(value) else value


def _by_value(pg: PgType) -> Translate:
    """A union of several non-null types: decided per value by its Python type (no logical annotations)."""
    kind = pg.name

    def translate(value: Any) -> Any:
        t = type(value)
        if t is bytes:
            return value if kind == "bytea" else _base64(value)
        if t is float:
            if kind in _INTEGRAL_KINDS:
                raise _Reject(f"{_show(value)} is not a valid {pg.sql} (not an integer)")
            if kind == "numeric" and math.isfinite(value):
                return Decimal(repr(value))
        if (t is dict or t is list) and kind in _TEXT_KINDS:
            return _json_text(_plain_jsonable(value))
        return value

    return translate


def _translator(schema: Any, pg: PgType, names: dict[str, Any], namespace: str) -> Translate | None:
    """How a value of Avro type ``schema`` becomes input for the converter of ``pg`` (None: as it is)."""
    schema, namespace = _resolve(schema, names, namespace)
    if isinstance(schema, list):
        live = [b for b in schema if b != "null"]
        if not live:
            return None
        if len(live) > 1:
            return _by_value(pg)
        schema, namespace = _resolve(live[0], names, namespace)
    base, logical, info = _annotations(schema)
    kind = pg.name
    if base in ("bytes", "fixed"):
        scale = _decimal_scale(info)
        if scale is not None:
            return _integral_decimal(scale, pg) if kind in _INT_RANGES else _decimal_bytes(scale)
        if kind == "bytea":
            return None
        if kind == "uuid":
            return _uuid_from_bytes
        return _base64
    if logical == _VARIABLE_SCALE_DECIMAL:
        return _variable_scale_decimal
    if base == "array" and pg.element is not None:  # a Postgres array: each element as its element type's input
        inner = _translator(schema.get("items"), pg.element, names, namespace)
        if inner is None:
            return None
        translate_element = inner
        return lambda value: (
            [None if v is None else translate_element(v) for v in value] if type(value) is list else value
        )
    if base in ("record", "error", "array", "map"):
        if kind not in _TEXT_KINDS:
            return None  # the converter refuses a container, naming the column
        jsonable = _jsonable_for(schema, names, namespace)
        return lambda value: _json_text(jsonable(value))
    if base in ("int", "long"):
        if kind in _TIMESTAMP_KINDS:
            unit = _AVRO_TIMESTAMP_UNITS.get(logical or "", 1)
        elif kind == "time without time zone":
            unit = _AVRO_TIME_UNITS.get(logical or "", 1)
        elif kind == "date" and logical in _AVRO_TIMESTAMP_UNITS and _AVRO_TIMESTAMP_UNITS[logical] != _US_PER_DAY:
            micros_per = _AVRO_TIMESTAMP_UNITS[logical]
            return lambda value: _scale_int(value, micros_per) // _US_PER_DAY if type(value) is int else value
        else:
            unit = 1
        return None if unit == 1 else _scaled(unit)
    if base in ("float", "double"):
        if kind in _INTEGRAL_KINDS:
            return _not_integral(pg)
        return _float_for(pg, single=base == "float")
    return None  # string, enum, boolean: as JSON has them


def _uuid_from_bytes(value: Any) -> Any:
    if type(value) is bytes:
        if len(value) != 16:
            raise _Reject(f"{len(value)} bytes are not a valid uuid (16 bytes)")
        return str(uuid.UUID(bytes=value))
    return value


# --------------------------------------------------------------------------------------------------------------
# Readers: one per (spec, writer schema)
# --------------------------------------------------------------------------------------------------------------


class _Reader:
    """Reads messages written with one writer schema and translates the declared columns of a record."""

    def __init__(self, writer: _Writer, translators: list[tuple[str, Translate]]) -> None:
        from fastavro import schemaless_reader

        self.writer = writer
        self.translators = translators
        self._read = schemaless_reader

    def read(self, raw: bytes) -> Any:
        stream = BytesIO(raw)  # shares the bytes, no copy
        stream.seek(HEADER_BYTES)
        value = self._read(stream, self.writer.parsed, None)
        left = len(raw) - stream.tell()
        if left:
            raise ValueError(f"{left} bytes are left over after the record")
        return value

    def translate(self, row: dict[str, Any]) -> str | None:
        """Translate ``row``'s declared columns in place; a reason when one does not fit."""
        for name, translate in self.translators:
            value = row.get(name)
            if value is not None:
                try:
                    row[name] = translate(value)
                except _Reject as error:
                    return f"column '{name}': {error}"
        return None


def _translators(spec: DecodeSpec, fields: dict[str, Any], writer: _Writer, namespace: str) -> list[tuple[str, Any]]:
    found = []
    for name, pg in spec.columns:
        if name in fields:
            translate = _translator(fields[name], pg, writer.names, namespace)
            if translate is not None:
                found.append((name, translate))
    return found


def _value_reader(spec: DecodeSpec, writer: _Writer) -> _Reader:
    """The Debezium envelope: translators for the row record of ``after`` (``before`` has the same type)."""
    translators: list[tuple[str, Translate]] = []
    top = _record_fields(writer.original, writer.names, "")
    if top is not None:
        envelope, namespace = top
        for struct_name in ("after", "before"):
            row = _record_fields(envelope[struct_name], writer.names, namespace) if struct_name in envelope else None
            if row is not None:
                translators = _translators(spec, row[0], writer, row[1])
                break
    return _Reader(writer, translators)


def _key_reader(spec: DecodeSpec, writer: _Writer) -> _Reader:
    top = _record_fields(writer.original, writer.names, "")
    translators = _translators(spec, top[0], writer, top[1]) if top is not None else []
    return _Reader(writer, translators)


_AVRO_KINDS = {str: "string", int: "long", float: "double", bool: "boolean", bytes: "bytes", list: "array"}


def _wire_problem(raw: bytes, what: str) -> str | None:
    """Why ``raw`` is not a Confluent wire-format message, or None."""
    if len(raw) >= HEADER_BYTES and raw[0] == WIRE_MAGIC:
        return None
    if len(raw) < HEADER_BYTES:
        return (
            f"{what} is {len(raw)} bytes, too short for the Confluent Avro wire format "
            "(magic byte 0, 4-byte schema id, Avro body)"
        )
    if raw[0] == 1:
        return (
            f"{what} uses the Confluent wire format with a schema GUID (magic byte 1), which cdcsync does not read; "
            "configure the producer's serializer to write the schema id prefix (magic byte 0)"
        )
    if raw[:1] in (b"{", b"["):
        return f"{what} starts with {raw[:1].decode()!r}, not the Avro magic byte 0: it looks like JSON (format: json?)"
    return f"{what} starts with byte 0x{raw[0]:02x}, not the Confluent Avro magic byte 0x00"


class AvroPlan(_Plan):
    """The JSON plan's converters, generated row decoder and batch assembly, fed from Avro messages.

    Cached per spec and executor process like the JSON plan; the per-task state (``begin_task``) makes one task
    wait for an unreachable registry at most once and ask again about unknown ids in the next task only."""

    def __init__(self, spec: DecodeSpec) -> None:
        if spec.schema_registry is None:
            raise DecodeError(
                f"source '{spec.source_id}': format avro needs a schema registry",
                hint="set CDCSYNC__SCHEMA_REGISTRY__URL (the dev stack runs one: `cdcsync dev up`)",
            )
        super().__init__(spec)
        self.access: SchemaRegistryAccess = spec.schema_registry
        try:
            _client(self.access)  # checks the client configuration on the driver, before Spark starts
        except (ValueError, TypeError) as error:
            raise DecodeError(
                self.access.scrub(f"source '{spec.source_id}': schema registry settings: {error}"),
                hint="check CDCSYNC__SCHEMA_REGISTRY__URL and CDCSYNC__SCHEMA_REGISTRY__OPTIONS__*",
            ) from None
        self._values: dict[int, _Reader | str] = {}
        self._keys: dict[int, _Reader | str] = {}
        self._changes: dict[int, str | None] = {}
        self.begin_task()

    def begin_task(self) -> None:
        self._task_failures: dict[int, str] = {}
        self._unreachable: str | None = None

    def _reader(self, raw: bytes, what: str) -> _Reader | str:
        schema_id = int.from_bytes(raw[1:HEADER_BYTES], "big")
        cache = self._values if what == "value" else self._keys
        found = cache.get(schema_id)
        if found is not None:
            return found
        if schema_id in self._task_failures:
            return self._task_failures[schema_id]
        if self._unreachable is not None:
            return (
                f"{what}: writer schema id {schema_id} not fetched: {self._unreachable} "
                "(not retried again in this task)"
            )[:_MAX_REASON]
        try:
            writer = _writer(self.access, schema_id)
        except _NotFound as error:
            self._task_failures[schema_id] = f"{what}: {error}"[:_MAX_REASON]
            return self._task_failures[schema_id]
        except _Unavailable as error:
            self._unreachable = str(error)
            return f"{what}: {error}"[:_MAX_REASON]
        if isinstance(writer, str):
            found = f"{what}: {writer}"[:_MAX_REASON]
        else:
            found = _value_reader(self.spec, writer) if what == "value" else _key_reader(self.spec, writer)
        cache[schema_id] = found
        return found

    def _read(self, raw: bytes, what: str) -> tuple[Any, _Reader | None, str | None]:
        """(decoded Avro value, its reader, None) or (None, None, reason)."""
        problem = _wire_problem(raw, what)
        if problem is not None:
            return None, None, problem
        reader = self._reader(raw, what)
        if isinstance(reader, str):
            return None, None, reader
        try:
            return reader.read(raw), reader, None
        except Exception as error:
            detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            return (
                None,
                None,
                (
                    f"{what}: the Avro body does not decode with its writer schema id {reader.writer.schema_id} "
                    f"({reader.writer.name}): {detail}"
                )[:_MAX_REASON],
            )

    # ---- one message -----------------------------------------------------------------------------------------

    def decode_message(self, raw: bytes, key_raw: bytes | None) -> list[Any] | str:
        payload, reader, reason = self._read(raw, "value")
        if reason is not None:
            return reason
        assert reader is not None
        if type(payload) is not dict:
            return f"value is an Avro {_AVRO_KINDS.get(type(payload), 'value')}, not a Debezium envelope record"
        if self.spec.detect_schema_changes:
            change = self._writer_schema_change(reader.writer)
            if change is not None:
                return change
        row = payload.get("before" if payload.get("op") == "d" else "after")
        if type(row) is dict:
            reason = reader.translate(row)
            if reason is not None:
                return reason
        try:
            return self._decode_payload(payload, None, raw, key_raw)
        except _Reparse:  # pragma: no cover - translation leaves no doubles where exact digits are needed
            return "value: a number could not be read exactly"

    def _writer_schema_change(self, writer: _Writer) -> str | None:
        """:func:`~cdcsync.sources.debezium.schema_change_of` for a writer schema, once per schema id."""
        if writer.schema_id not in self._changes:
            from cdcsync.sources.avro_schema import envelope_row_fields

            fields = envelope_row_fields(writer.original, writer.names)
            self._changes[writer.schema_id] = schema_change_of(self.spec, fields) if fields is not None else None
        return self._changes[writer.schema_id]

    # ---- the primary key -------------------------------------------------------------------------------------

    def _key(self, key_raw: bytes | None) -> tuple[dict[str, Any], str | None]:
        if key_raw is None:
            return {}, "message has no key"
        key, reader, reason = self._read(key_raw, "message key")
        if reason is not None:
            return {}, reason
        assert reader is not None
        if type(key) is not dict:
            return {}, f"message key is an Avro {_AVRO_KINDS.get(type(key), 'value')}, not a record of key columns"
        reason = reader.translate(key)
        if reason is not None:
            return {}, f"message key {reason}"
        return key, None

    def _convert_key_value(self, values: list[Any], i: int, value: Any, key_raw: bytes | None) -> str | None:
        try:
            values[i] = self.converters[i](value, (None, "", key_raw or b""))
        except (_Reject, _Reparse) as error:
            reason = str(error) or f"{_show(value)} is not a valid {self.spec.columns[i][1].sql}"
            return f"message key column '{self.names[i]}': {reason}"
        return None

    def _key_fallback(self, values: list[Any], key_raw: bytes | None) -> str | None:
        """Fill null declared key columns from the Avro message key (the JSON plan's rule)."""
        assert self.pk_index is not None
        missing = [i for i in self.pk_index if values[i] is None]
        key, reason = self._key(key_raw)
        if reason is not None:
            return f"primary key column '{self.names[missing[0]]}' is null ({reason})"
        for i in missing:
            name = self.names[i]
            value = key.get(name)
            if value is not None:
                reason = self._convert_key_value(values, i, value, key_raw)
                if reason is not None:
                    return reason
            if values[i] is None:
                return f"primary key column '{name}' is null"
        return None

    def _key_from_message(self, values: list[Any], key_raw: bytes | None) -> str | None:
        """No declared primary key: the Avro key record's fields are the key columns and override the row's."""
        key, reason = self._key(key_raw)
        if reason is not None:
            return f"{reason}, and the source declares no primary_key to take the key from"
        if not key:
            return "message key has no fields, and the source declares no primary_key"
        for name, value in key.items():
            if name not in self.index:
                return f"message key field '{name}' is not a declared column of source '{self.spec.source_id}'"
            if value is None:
                return f"primary key column '{name}' is null"
            reason = self._convert_key_value(values, self.index[name], value, key_raw)
            if reason is not None:
                return reason
        return None


def decode_avro_batches(batches: Iterator[pa.RecordBatch], spec: DecodeSpec) -> Iterator[pa.RecordBatch]:
    """:func:`~cdcsync.sources.debezium.decode_batches` for ``format: avro`` (one call is one Spark task)."""
    plan = _plan_for(spec)
    assert isinstance(plan, AvroPlan)
    plan.begin_task()
    for batch in batches:
        if batch.num_rows == 0:
            continue
        out = plan.decode_batch(batch)
        if out.num_rows:
            yield out
