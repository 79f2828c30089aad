"""A development stand-in for the Confluent Schema Registry: the REST subset that Kafka clients and Debezium use.

Why a stand-in: the real registry (or Apicurio's ccompat API) is a JVM service that cannot be run from published
Maven artifacts without a distribution download, and the dev stack must start with nothing but this package. The
stand-in is a small stdlib HTTP server (``ThreadingHTTPServer``), started like the other services
(``cdcsync dev up``: pid file, log, status, ``dev down`` stops only its own pid), that speaks the Confluent API
closely enough for confluent-kafka's ``SchemaRegistryClient``, ``AvroSerializer`` / ``AvroDeserializer`` and
Kafka Connect's ``AvroConverter``:

* ``POST /subjects/{subject}/versions`` register (returns ``{"id": n}``), ``POST /subjects/{subject}`` look up;
* ``GET /schemas/ids/{id}`` (and ``.../schema``, ``.../subjects``, ``.../versions``), ``GET /schemas/types``;
* ``GET /subjects``, ``GET /subjects/{subject}/versions``, ``GET /subjects/{subject}/versions/{n|latest|-1}``
  (and ``.../schema``), ``DELETE /subjects/{subject}[/versions/{n}]`` (soft, then ``?permanent=true``);
* ``GET|PUT|DELETE /config[/{subject}]`` and ``GET /mode``.

It also answers the few calls of Apicurio Registry's v2 REST API that Apicurio's serdes make, and so Apicurio's
Kafka Connect ``AvroConverter`` (on Maven Central, unlike Confluent's): the dev stack's Debezium publishes Avro
through it, in the Confluent wire format (``apicurio.registry.as-confluent=true``), with
``apicurio.registry.url`` set to ``<registry>/apis/registry/v2``. Apicurio's artifacts of group ``default`` are
the Confluent subjects of the same name (its own ccompat mapping), and both its ``contentId`` and ``globalId`` of
a schema are the Confluent schema id: one id space, so the schema a converter registers is the one a Confluent
client fetches by the id in the message, whichever id the converter writes (``apicurio.registry.use-id``).

* ``POST /apis/registry/v2/groups/default/artifacts`` (``X-Registry-ArtifactId`` header, ``?ifExists=FAIL|UPDATE|
  RETURN|RETURN_OR_UPDATE``): register, as ``auto-register=true`` does; returns the version's metadata. A schema
  the subject already has returns that version (``UPDATE`` too, where Apicurio would add an identical version);
* ``GET .../groups/default/artifacts/{id}/meta`` (``find-latest=true``) and ``POST`` of a schema to the same path
  (the version holding that content, for ``auto-register=false``);
* ``GET /apis/registry/v2/ids/{contentIds|globalIds}/{id}`` (the schema text) and ``.../{id}/references``
  (always empty), which Apicurio's deserializers fetch.

Other groups, artifact references, explicit versions (``X-Registry-Version``, ignored), rules, search and the
rest of Apicurio's API are not there. Errors on these paths are Apicurio's JSON (``error_code`` = HTTP status,
``message``, exception ``name``).

Behaviour that clients rely on is kept: ids are global, start at 1 and never change; the same schema registered
under two subjects gets the same id (schemas are compared after parsing, so whitespace and JSON key order do not
matter, while Avro field order does); registering a schema a subject already has returns its id without a new
version; errors are Confluent's JSON (``{"error_code": 40401, "message": ...}``, same codes) with content type
``application/vnd.schemaregistry.v1+json``. Everything is written through to ``schemas.json`` in the service's
state directory (atomically), so ids survive restarts.

What it is not: a production registry. It binds to loopback only, has no authentication, validates Avro
schemas (with fastavro) but does not resolve schema references when it does, stores a compatibility level per
subject but never enforces it (``POST /compatibility/...`` answers 501), and keeps no Kafka-backed ``_schemas``
topic. Point ``CDCSYNC__SCHEMA_REGISTRY__URL`` at a real registry for anything beyond development.

Run it alone with ``python -m cdcsync.devstack.schema_registry --port 18081 --state-file schemas.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import cdcsync
from cdcsync.devstack.common import (
    LOOPBACK,
    DevStackConfig,
    ServiceStatus,
    ensure_port_free,
    owned_pid,
    port_open,
    service_status,
    spawn,
    startup_failure,
    stop_pid,
)

NAME = "schema-registry"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
COMPATIBILITY_LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
DEFAULT_COMPATIBILITY = "BACKWARD"
_MAX_VERSION = 2**31 - 1


# --------------------------------------------------------------------------------------------------------------
# Paths and process management (the same shape as the other dev-stack services)
# --------------------------------------------------------------------------------------------------------------


def home(cfg: DevStackConfig) -> Path:
    return cfg.root / NAME


def log_file(cfg: DevStackConfig) -> Path:
    return home(cfg) / "schema-registry.log"


def state_file(cfg: DevStackConfig) -> Path:
    """Also the marker that identifies our process: its path is on the server's command line."""
    return home(cfg) / "schemas.json"


def url(cfg: DevStackConfig) -> str:
    return f"http://{LOOPBACK}:{cfg.schema_registry_port}"


def status(cfg: DevStackConfig) -> ServiceStatus:
    return service_status(
        NAME, cfg, marker=str(state_file(cfg)), port=cfg.schema_registry_port, address=url(cfg), log=log_file(cfg)
    )


def start(cfg: DevStackConfig) -> ServiceStatus:
    """Launch the server detached (this interpreter, ``-m`` this module); does not wait."""
    current = status(cfg)
    if current.pid is not None:
        return current
    ensure_port_free(NAME, cfg.schema_registry_port)
    home(cfg).mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        __name__,
        "--port",
        str(cfg.schema_registry_port),
        "--state-file",
        str(state_file(cfg)),
    ]
    env = dict(os.environ)
    # The server must import this very package even when it runs from a checkout that is not installed.
    package_root = str(Path(cdcsync.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    pid = spawn(argv, log_file=log_file(cfg), pid_file=cfg.pid_file(NAME), cwd=home(cfg), env=env)
    return ServiceStatus(NAME, "starting", pid, url(cfg), log_file(cfg), started=True)


def wait_ready(cfg: DevStackConfig, timeout_s: float | None = None) -> None:
    """Ready means ``GET /subjects`` answers 200, not merely that the port is bound."""
    deadline = time.monotonic() + (cfg.startup_timeout_s if timeout_s is None else timeout_s)
    last = "no answer yet"
    while True:
        if owned_pid(cfg.pid_file(NAME), str(state_file(cfg))) is None:
            raise startup_failure(NAME, log_file(cfg), "the server process exited")
        if port_open(cfg.schema_registry_port):
            try:
                with urllib.request.urlopen(f"{url(cfg)}/subjects", timeout=3) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
        if time.monotonic() > deadline:
            raise startup_failure(NAME, log_file(cfg), f"not answering at {url(cfg)}: {last}")
        time.sleep(0.1)


def stop(cfg: DevStackConfig) -> ServiceStatus:
    """SIGTERM ends the server between requests; every change is already on disk, so nothing is lost."""
    pid = owned_pid(cfg.pid_file(NAME), str(state_file(cfg)))
    detail = None
    if pid is not None:
        killed = stop_pid(pid, timeout_s=10)
        detail = "killed after timeout" if killed else "stopped"
    cfg.pid_file(NAME).unlink(missing_ok=True)
    return ServiceStatus(NAME, "stopped", None, url(cfg), log_file(cfg), detail=detail)


# --------------------------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------------------------


class RegistryError(Exception):
    """An error answer: HTTP status, Confluent's ``error_code`` and message, and Apicurio's exception ``name``
    (the same error is rendered in the shape of the API that was called)."""

    def __init__(self, http_status: int, error_code: int, message: str, name: str = "") -> None:
        super().__init__(message)
        self.http_status = http_status
        self.error_code = error_code
        self.message = message
        self.name = name


class StateFileError(Exception):
    """The state file exists but cannot be read: refusing to start beats silently handing out new ids."""


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def _canonical(schema: str, schema_type: str, references: list[Any]) -> str:
    """The identity of a schema: parsed and re-serialised (JSON kinds), so formatting never splits one schema
    into two ids; object keys are sorted, array order (Avro field order) is kept."""
    text = schema.strip()
    if schema_type in ("AVRO", "JSON"):
        with contextlib.suppress(ValueError):  # not JSON: rejected by validation before it is stored
            text = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return json.dumps([schema_type, text, references], sort_keys=True, ensure_ascii=False)


class RegistryStore:
    """Schemas, subjects and compatibility levels, in memory and written through to one JSON file.

    File layout: ``{"next_id": n, "schemas": {"<id>": {"schema", "schemaType", "references"}},
    "subjects": {"<subject>": [{"version", "id", "deleted"}]}, "config": {"": global level, "<subject>": level}}``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()
        """Held for every request: simple consistency for a development server; writers also take it."""
        self.next_id = 1
        self.schemas: dict[int, dict[str, Any]] = {}
        self.subjects: dict[str, list[dict[str, Any]]] = {}
        self.config: dict[str, str] = {}
        self.by_canonical: dict[str, int] = {}
        if path.is_file():
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.next_id = int(data["next_id"])
            self.schemas = {int(k): v for k, v in data["schemas"].items()}
            self.subjects = {k: list(v) for k, v in data["subjects"].items()}
            self.config = dict(data.get("config", {}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateFileError(
                f"schema registry: cannot read its state file {self.path}: {exc}; "
                "move it away to start empty (registered ids would then change)"
            ) from None
        for schema_id, record in self.schemas.items():
            key = _canonical(record["schema"], record["schemaType"], record["references"])
            self.by_canonical[key] = schema_id

    def _save(self) -> None:
        data = {
            "next_id": self.next_id,
            "schemas": {str(k): v for k, v in sorted(self.schemas.items())},
            "subjects": self.subjects,
            "config": self.config,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, ensure_ascii=False)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)

    # ---- reading -----------------------------------------------------------------------------------------

    def schema(self, schema_id: int) -> dict[str, Any]:
        record = self.schemas.get(schema_id)
        if record is None:
            raise RegistryError(404, 40403, f"Schema {schema_id} not found")
        return record

    def versions(self, subject: str, *, deleted: bool = False, deleted_only: bool = False) -> list[dict[str, Any]]:
        entries = self.subjects.get(subject, [])
        if deleted_only:
            return [e for e in entries if e["deleted"]]
        return [e for e in entries if deleted or not e["deleted"]]

    def version(self, subject: str, version_text: str, *, deleted: bool = False) -> dict[str, Any]:
        entries = self.versions(subject, deleted=deleted)
        if not entries:
            raise _subject_not_found(subject)
        if version_text in ("latest", "-1"):
            return entries[-1]
        number = _parse_version(version_text)
        for entry in entries:
            if entry["version"] == number:
                return entry
        raise RegistryError(404, 40402, f"Version {number} not found.")

    def subject_response(self, subject: str, entry: dict[str, Any]) -> dict[str, Any]:
        record = self.schemas[entry["id"]]
        return {"subject": subject, "version": entry["version"], "id": entry["id"], **_schema_fields(record)}

    # ---- writing -----------------------------------------------------------------------------------------

    def register(self, subject: str, body: dict[str, Any]) -> int:
        schema, schema_type, references = _schema_from_body(body)
        key = _canonical(schema, schema_type, references)
        with self.lock:
            schema_id = self.by_canonical.get(key)
            if schema_id is not None:
                for entry in self.versions(subject):
                    if entry["id"] == schema_id:
                        return schema_id
            else:
                _validate(schema, schema_type, references, self)
                schema_id = self.next_id
                self.next_id += 1
                self.schemas[schema_id] = {"schema": schema, "schemaType": schema_type, "references": references}
                self.by_canonical[key] = schema_id
            entries = self.subjects.setdefault(subject, [])
            version = max((e["version"] for e in entries), default=0) + 1
            entries.append({"version": version, "id": schema_id, "deleted": False})
            self._save()
            return schema_id

    def lookup(self, subject: str, body: dict[str, Any], *, deleted: bool) -> dict[str, Any]:
        schema, schema_type, references = _schema_from_body(body)
        if not self.versions(subject, deleted=deleted):
            raise _subject_not_found(subject)
        schema_id = self.by_canonical.get(_canonical(schema, schema_type, references))
        for entry in reversed(self.versions(subject, deleted=deleted)):
            if entry["id"] == schema_id:
                return self.subject_response(subject, entry)
        raise RegistryError(404, 40403, "Schema not found")

    def delete_subject(self, subject: str, *, permanent: bool) -> list[int]:
        with self.lock:
            entries = self.subjects.get(subject)
            if not entries:
                raise _subject_not_found(subject)
            live = [e for e in entries if not e["deleted"]]
            if permanent:
                if live:
                    raise RegistryError(
                        404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted"
                    )
                del self.subjects[subject]
                self.config.pop(subject, None)
                self._save()
                return [e["version"] for e in entries]
            if not live:
                raise RegistryError(
                    404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently"
                )
            for entry in live:
                entry["deleted"] = True
            self._save()
            return [e["version"] for e in live]

    def delete_version(self, subject: str, version_text: str, *, permanent: bool) -> int:
        with self.lock:
            entry = self.version(subject, version_text, deleted=True)
            if permanent:
                if not entry["deleted"]:
                    raise RegistryError(
                        404,
                        40407,
                        f"Subject '{subject}' Version {entry['version']} was not deleted first before being "
                        "permanently deleted",
                    )
                self.subjects[subject].remove(entry)
                if not self.subjects[subject]:
                    del self.subjects[subject]
            elif entry["deleted"]:
                raise RegistryError(
                    404,
                    40406,
                    f"Subject '{subject}' Version {entry['version']} was soft deleted.Set permanent=true to delete "
                    "permanently",
                )
            else:
                entry["deleted"] = True
            self._save()
            return int(entry["version"])

    def set_config(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        level = body.get("compatibility", body.get("compatibilityLevel"))
        if not isinstance(level, str) or level.upper() not in COMPATIBILITY_LEVELS:
            raise RegistryError(
                422, 42203, f"Invalid compatibility level {level!r}; one of {', '.join(COMPATIBILITY_LEVELS)}"
            )
        with self.lock:
            self.config[subject] = level.upper()
            self._save()
        return {"compatibility": level.upper()}

    def get_config(self, subject: str, *, default_to_global: bool) -> dict[str, Any]:
        if subject and subject not in self.config:
            if not default_to_global:
                raise RegistryError(
                    404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
                )
            subject = ""
        return {"compatibilityLevel": self.config.get(subject, DEFAULT_COMPATIBILITY)}

    def delete_config(self, subject: str) -> dict[str, Any]:
        with self.lock:
            if subject and subject not in self.config:
                raise RegistryError(
                    404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
                )
            old = self.config.pop(subject, DEFAULT_COMPATIBILITY)
            self._save()
        return {"compatibilityLevel": old}


def _parse_version(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if not 1 <= number <= _MAX_VERSION:
        raise RegistryError(
            422,
            42202,
            f"The specified version '{text}' is not a valid version id. Allowed values are between "
            f'[1, {_MAX_VERSION}] and the string "latest"',
        )
    return number


def _schema_fields(record: dict[str, Any]) -> dict[str, Any]:
    """How Confluent shows a schema: ``schemaType`` only when it is not Avro, ``references`` only when present."""
    fields: dict[str, Any] = {"schema": record["schema"]}
    if record["schemaType"] != "AVRO":
        fields["schemaType"] = record["schemaType"]
    if record["references"]:
        fields["references"] = record["references"]
    return fields


def _schema_from_body(body: dict[str, Any]) -> tuple[str, str, list[Any]]:
    schema = body.get("schema")
    if not isinstance(schema, str) or not schema.strip():
        raise RegistryError(422, 42201, "Invalid schema: the request needs a 'schema' string")
    schema_type = str(body.get("schemaType") or "AVRO").upper()
    if schema_type not in SCHEMA_TYPES:
        raise RegistryError(422, 42201, f"Invalid schema type {schema_type!r}; one of {', '.join(SCHEMA_TYPES)}")
    references = body.get("references") or []
    if not isinstance(references, list) or not all(isinstance(r, dict) for r in references):
        raise RegistryError(422, 42201, "Invalid schema: 'references' must be a list of objects")
    return schema, schema_type, references


def _validate(schema: str, schema_type: str, references: list[Any], store: RegistryStore) -> None:
    """Avro schemas must parse (fastavro) unless they use references, which are only checked to exist."""
    for ref in references:
        subject, version = ref.get("subject"), ref.get("version")
        if not isinstance(subject, str) or not isinstance(version, int):
            raise RegistryError(422, 42201, f"Invalid schema: reference {ref!r} needs 'subject' and 'version'")
        try:
            store.version(subject, str(version))
        except RegistryError:
            raise RegistryError(
                422, 42201, f"Invalid schema: referenced subject '{subject}' version {version} does not exist"
            ) from None
    if schema_type == "PROTOBUF":
        return
    try:
        parsed = json.loads(schema)
    except ValueError as exc:
        raise RegistryError(422, 42201, f"Invalid schema: not JSON: {exc}") from None
    if schema_type == "AVRO" and not references:
        import fastavro

        try:
            fastavro.parse_schema(parsed)
        except Exception as exc:
            raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None


# --------------------------------------------------------------------------------------------------------------
# Apicurio Registry v2: the calls of its serdes (and so of its Kafka Connect converters), on the same store
# --------------------------------------------------------------------------------------------------------------

APICURIO_PREFIX = "/apis/registry/v2"
APICURIO_GROUP = "default"
"""The only group: its artifacts are the Confluent subjects of the same name (Apicurio's ccompat mapping)."""
_IF_EXISTS = ("FAIL", "UPDATE", "RETURN", "RETURN_OR_UPDATE")
_EXTENDED_CONTENT = "application/create.extended+json"


def _apicurio_subject(group: str, artifact: str) -> str:
    if group != APICURIO_GROUP:
        raise RegistryError(
            400,
            400,
            f"group '{group}': the cdcsync development registry keeps Apicurio artifacts in group "
            f"'{APICURIO_GROUP}' only (each is the Confluent subject of its name); do not set "
            "apicurio.registry.artifact.group-id",
            name="BadRequestException",
        )
    return artifact


def _version_meta(store: RegistryStore, subject: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Apicurio's VersionMetaData. ``globalId`` and ``contentId`` are both the Confluent schema id, so whichever
    one a serializer writes (``apicurio.registry.use-id``), a Confluent deserializer finds the schema by it."""
    return {
        "groupId": APICURIO_GROUP,
        "id": subject,
        "version": str(entry["version"]),
        "type": store.schemas[entry["id"]]["schemaType"],
        "globalId": entry["id"],
        "contentId": entry["id"],
        "state": "ENABLED",
    }


def _apicurio_create(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    """``POST groups/{g}/artifacts``: what a serializer calls with ``apicurio.registry.auto-register=true``."""
    store = handler.store
    subject = _apicurio_subject(args[0], handler.headers.get("X-Registry-ArtifactId") or str(uuid.uuid4()))
    if_exists = query.get("ifExists", "FAIL").upper()
    if if_exists not in _IF_EXISTS:
        raise RegistryError(400, 400, f"ifExists '{if_exists}' is not one of {', '.join(_IF_EXISTS)}")
    schema_type = (handler.headers.get("X-Registry-ArtifactType") or "AVRO").upper()
    content = handler.raw_body().decode("utf-8", errors="replace")
    if (handler.headers.get("Content-Type") or "").startswith(_EXTENDED_CONTENT):
        try:
            extended = json.loads(content)
            content, references = extended["content"], extended.get("references") or []
        except (ValueError, TypeError, KeyError):
            raise RegistryError(400, 400, 'the extended create body must be {"content": ...}') from None
        if references:
            raise RegistryError(400, 400, "artifact references are not supported by the cdcsync development registry")
    existing = store.versions(subject)
    if existing and if_exists == "FAIL":
        raise RegistryError(
            409,
            409,
            f"An artifact with ID '{subject}' in group '{APICURIO_GROUP}' already exists.",
            name="ArtifactAlreadyExistsException",
        )
    if existing and if_exists == "RETURN":
        return {**_version_meta(store, subject, existing[-1]), "references": []}
    try:
        schema_id = store.register(subject, {"schema": content, "schemaType": schema_type})
    except RegistryError as error:  # Confluent's 422 for a bad schema is Apicurio's 400 (invalid content)
        raise RegistryError(400, 400, error.message, name="InvalidArtifactException") from None
    entry = next(e for e in reversed(store.versions(subject)) if e["id"] == schema_id)
    return {**_version_meta(store, subject, entry), "references": []}


def _apicurio_latest_meta(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    """``GET groups/{g}/artifacts/{a}/meta``: with ``apicurio.registry.find-latest=true``."""
    subject = _apicurio_subject(*args)
    entries = handler.store.versions(subject)
    if not entries:
        raise _artifact_not_found(subject)
    return {**_version_meta(handler.store, subject, entries[-1]), "references": []}


def _apicurio_meta_by_content(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    """``POST groups/{g}/artifacts/{a}/meta``: with ``apicurio.registry.auto-register=false``."""
    subject = _apicurio_subject(*args)
    store = handler.store
    if not store.versions(subject):
        raise _artifact_not_found(subject)
    body = {"schema": handler.raw_body().decode("utf-8", errors="replace"), "schemaType": "AVRO"}
    schema_id = store.by_canonical.get(_canonical(*_schema_from_body(body)))
    for entry in reversed(store.versions(subject)):
        if entry["id"] == schema_id:
            return _version_meta(store, subject, entry)
    raise RegistryError(
        404, 404, f"No version of artifact '{subject}' has this content.", name="VersionNotFoundException"
    )


def _apicurio_content(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    """``GET ids/{globalIds|contentIds}/{id}``: what a deserializer fetches (both are the Confluent id here)."""
    try:
        return _RawJson(handler.store.schema(_schema_id(args[1]))["schema"])
    except RegistryError:
        raise RegistryError(
            404, 404, f"No content with ID '{args[1]}' was found.", name="ContentNotFoundException"
        ) from None


def _apicurio_references(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    _apicurio_content(handler, args, query)
    return []


def _artifact_not_found(subject: str) -> RegistryError:
    return RegistryError(
        404,
        404,
        f"No artifact with ID '{subject}' in group '{APICURIO_GROUP}' was found.",
        name="ArtifactNotFoundException",
    )


# --------------------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------------------

_Args = tuple[str, ...]
"""The route's path parameters, percent-decoded; "" for an optional one that is absent."""
_Route = Callable[["_Handler", _Args, dict[str, str]], Any]
_SEGMENT = r"([^/]+)"


def _flag(query: dict[str, str], name: str) -> bool:
    return query.get(name, "").lower() == "true"


def _schema_by_id(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return _schema_fields(handler.store.schema(_schema_id(args[0])))


def _raw_schema_by_id(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return _RawJson(handler.store.schema(_schema_id(args[0]))["schema"])


def _subjects_of_id(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return [pair["subject"] for pair in _versions_of_id(handler, args, query)]


def _versions_of_id(handler: _Handler, args: _Args, query: dict[str, str]) -> list[dict[str, Any]]:
    store = handler.store
    schema_id = _schema_id(args[0])
    store.schema(schema_id)
    deleted = _flag(query, "deleted")
    return [
        {"subject": subject, "version": entry["version"]}
        for subject in sorted(store.subjects)
        for entry in store.versions(subject, deleted=deleted)
        if entry["id"] == schema_id
    ]


def _list_subjects(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    store = handler.store
    prefix = query.get("subjectPrefix", "")
    deleted, deleted_only = _flag(query, "deleted"), _flag(query, "deleted_only")
    names = [
        s
        for s in sorted(store.subjects)
        if s.startswith(prefix) and store.versions(s, deleted=deleted, deleted_only=deleted_only)
    ]
    return names


def _list_versions(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    subject = args[0]
    entries = handler.store.versions(
        subject, deleted=_flag(query, "deleted"), deleted_only=_flag(query, "deleted_only")
    )
    if not entries:  # unknown, or only soft-deleted versions and deleted=true not asked for
        raise _subject_not_found(subject)
    return [e["version"] for e in entries]


def _get_version(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    entry = handler.store.version(args[0], args[1], deleted=_flag(query, "deleted"))
    return handler.store.subject_response(args[0], entry)


def _get_version_schema(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    entry = handler.store.version(args[0], args[1], deleted=_flag(query, "deleted"))
    return _RawJson(handler.store.schemas[entry["id"]]["schema"])


def _register(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return {"id": handler.store.register(args[0], handler.json_body())}


def _lookup(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return handler.store.lookup(args[0], handler.json_body(), deleted=_flag(query, "deleted"))


def _delete_subject(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return handler.store.delete_subject(args[0], permanent=_flag(query, "permanent"))


def _delete_version(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return handler.store.delete_version(args[0], args[1], permanent=_flag(query, "permanent"))


def _get_config(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return handler.store.get_config(args[0], default_to_global=_flag(query, "defaultToGlobal"))


def _put_config(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return handler.store.set_config(args[0], handler.json_body())


def _delete_config(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    return handler.store.delete_config(args[0])


def _compatibility(handler: _Handler, args: _Args, query: dict[str, str]) -> Any:
    raise RegistryError(
        501,
        50101,
        "the cdcsync development schema registry does not check compatibility; use a real schema registry for that",
    )


def _schema_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RegistryError(404, 40403, f"Schema {text} not found") from None


class _RawJson(str):
    """A response body that is already JSON text (a schema as stored), sent as is."""


_ROUTES: list[tuple[str, re.Pattern[str], _Route]] = [
    ("GET", re.compile(r"/"), lambda h, m, q: {}),
    ("GET", re.compile(r"/schemas/types"), lambda h, m, q: list(SCHEMA_TYPES)),
    ("GET", re.compile(rf"/schemas/ids/{_SEGMENT}"), _schema_by_id),
    ("GET", re.compile(rf"/schemas/ids/{_SEGMENT}/schema"), _raw_schema_by_id),
    ("GET", re.compile(rf"/schemas/ids/{_SEGMENT}/subjects"), _subjects_of_id),
    ("GET", re.compile(rf"/schemas/ids/{_SEGMENT}/versions"), _versions_of_id),
    ("GET", re.compile(r"/subjects"), _list_subjects),
    ("GET", re.compile(rf"/subjects/{_SEGMENT}/versions"), _list_versions),
    ("GET", re.compile(rf"/subjects/{_SEGMENT}/versions/{_SEGMENT}"), _get_version),
    ("GET", re.compile(rf"/subjects/{_SEGMENT}/versions/{_SEGMENT}/schema"), _get_version_schema),
    ("POST", re.compile(rf"/subjects/{_SEGMENT}/versions"), _register),
    ("POST", re.compile(rf"/subjects/{_SEGMENT}"), _lookup),
    ("DELETE", re.compile(rf"/subjects/{_SEGMENT}"), _delete_subject),
    ("DELETE", re.compile(rf"/subjects/{_SEGMENT}/versions/{_SEGMENT}"), _delete_version),
    ("GET", re.compile(rf"/config(?:/{_SEGMENT})?"), _get_config),
    ("PUT", re.compile(rf"/config(?:/{_SEGMENT})?"), _put_config),
    ("DELETE", re.compile(rf"/config(?:/{_SEGMENT})?"), _delete_config),
    ("GET", re.compile(r"/mode"), lambda h, m, q: {"mode": "READWRITE"}),
    ("POST", re.compile(rf"/compatibility/subjects/{_SEGMENT}/versions(?:/{_SEGMENT})?"), _compatibility),
    ("POST", re.compile(rf"{APICURIO_PREFIX}/groups/{_SEGMENT}/artifacts"), _apicurio_create),
    ("GET", re.compile(rf"{APICURIO_PREFIX}/groups/{_SEGMENT}/artifacts/{_SEGMENT}/meta"), _apicurio_latest_meta),
    ("POST", re.compile(rf"{APICURIO_PREFIX}/groups/{_SEGMENT}/artifacts/{_SEGMENT}/meta"), _apicurio_meta_by_content),
    ("GET", re.compile(rf"{APICURIO_PREFIX}/ids/(globalIds|contentIds)/{_SEGMENT}"), _apicurio_content),
    ("GET", re.compile(rf"{APICURIO_PREFIX}/ids/(globalIds|contentIds)/{_SEGMENT}/references"), _apicurio_references),
]


class _Handler(BaseHTTPRequestHandler):
    server_version = "cdcsync-schema-registry"
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection for their lookups
    store: RegistryStore  # set on the subclass that SchemaRegistryServer builds
    log_requests: bool = True

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def raw_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self._body_read = True
        return raw

    def json_body(self) -> dict[str, Any]:
        raw = self.raw_body()
        try:
            body = json.loads(raw or b"null")
        except ValueError as exc:
            raise RegistryError(400, 400, f"Unexpected request body: not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise RegistryError(422, 42201, "Invalid schema: the request body must be a JSON object")
        return body

    def _dispatch(self, method: str) -> None:
        self._body_read = False
        parts = urlsplit(self.path)
        path = "/" + parts.path.strip("/")  # still percent-encoded: a subject may contain an encoded '/'
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        allowed = False
        try:
            for route_method, pattern, route in _ROUTES:
                match = pattern.fullmatch(path)
                if match is None:
                    continue
                allowed = True
                if route_method == method:
                    args = tuple("" if g is None else unquote(g) for g in match.groups())
                    with self.store.lock:
                        result = route(self, args, query)
                    apicurio = path.startswith(APICURIO_PREFIX + "/")
                    self._send(200, result, content_type="application/json" if apicurio else CONTENT_TYPE)
                    return
            if allowed:
                raise RegistryError(405, 405, "HTTP 405 Method Not Allowed")
            raise RegistryError(404, 404, "HTTP 404 Not Found")
        except RegistryError as error:
            self._send_error(path, error)
        except Exception as error:  # a bug must answer 500, not drop the connection
            self._send_error(path, RegistryError(500, 50001, f"Error in the backend data store: {error}"))

    def _send_error(self, path: str, error: RegistryError) -> None:
        """Confluent's error JSON, or Apicurio's (``error_code`` is the HTTP status there) on its API."""
        if path.startswith(APICURIO_PREFIX + "/"):
            name = error.name or ("NotFoundException" if error.http_status == 404 else "RegistryException")
            payload = {"error_code": error.http_status, "message": error.message, "name": name}
            self._send(error.http_status, payload, content_type="application/json")
        else:
            self._send(error.http_status, {"error_code": error.error_code, "message": error.message})

    def _send(self, code: int, payload: Any, content_type: str = CONTENT_TYPE) -> None:
        if not self._body_read and self.headers.get("Content-Length"):
            self.rfile.read(int(self.headers["Content-Length"]))  # drain, so keep-alive stays in step
        text = payload if isinstance(payload, _RawJson) else json.dumps(payload, ensure_ascii=False)
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        # Method, path and status only: request headers (which may carry credentials) are never logged.
        if self.log_requests:
            sys.stderr.write(f"{self.log_date_time_string()} {format % args}\n")


class SchemaRegistryServer(ThreadingHTTPServer):
    """The server, usable in-process too (tests, benchmarks): ``port=0`` picks a free port."""

    daemon_threads = True

    def __init__(self, port: int, state_path: Path, *, log_requests: bool = True) -> None:
        attributes = {"store": RegistryStore(state_path), "log_requests": log_requests}
        handler = type("Handler", (_Handler,), attributes)
        super().__init__((LOOPBACK, port), handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cdcsync.devstack.schema_registry",
        description="Development stand-in for the Confluent Schema Registry (loopback only, no auth).",
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-file", type=Path, required=True, help="JSON file that keeps schemas and ids")
    args = parser.parse_args(argv)

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        server = SchemaRegistryServer(args.port, args.state_file)
    except StateFileError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"schema registry stand-in listening on {server.url}, state in {args.state_file}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
