"""The migration file format, the same for every target database.

Files live in ``<migrations_dir>/<pipeline>/<database>/NNNN_<what>.sql``. Each generated file is::

    -- cdcsync migration 0002_add_sink_orders_copy.sql          <- header: leading "--" lines
    -- ...what it creates, how to apply it...
    -- checksum: sha256:<hex>                                    <- sha256 of the body, see below
    -- cdcsync-state: {"format":1,...}                          <- cumulative desired state after this file

    CREATE ...;                                                   <- body: the DDL, rendered from templates/
    -- cdcsync-ledger: ...                                        <- trailer: records the file in the ledger
    INSERT INTO "cdcsync"."schema_migrations" ... ON CONFLICT DO NOTHING;

The **body** is everything after the header up to the trailer (CRLF read as LF); its checksum is what the ledger
compares. The trailer exists so that ``psql -f FILE`` (or ``clickhouse-client``) records the file exactly as
``cdcsync migrate`` does, and it cannot be covered by the checksum it contains. Hand-written files (for
destructive changes) need no header or trailer; if they change what cdcsync manages they carry a
``-- cdcsync-state:`` line, which the refusal message of ``init`` prints ready to paste.

This module knows nothing of any database: what a state holds is up to each target (see
:mod:`cdcsync.migrations.target`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from cdcsync.core.errors import MigrationError

STATE_FORMAT = 1
STATE_PREFIX = "-- cdcsync-state: "
CHECKSUM_PREFIX = "-- checksum: "
TRAILER_MARKER = "-- cdcsync-ledger:"
NOT_A_STATE = (
    f"the '{STATE_PREFIX.strip()}' line is not a cdcsync state of format {STATE_FORMAT} "
    "(written by another cdcsync version, or edited?)"
)

_FILENAME_RE = re.compile(r"^(?P<number>[0-9]{4,})_(?P<what>.+)\.sql$")
_HEADER_RE = re.compile(r"(?:--[^\n]*(?:\n|$))*")
_TRAILER_RE = re.compile(r"^" + re.escape(TRAILER_MARKER), re.MULTILINE)
_SLUG_RE = re.compile(r"[^a-z0-9]+")

MigrationState = Literal["applied", "pending", "altered"]


def migrations_path(migrations_dir: Path | str, pipeline_name: str, database: str) -> Path:
    """``<migrations_dir>/<pipeline>/<database>`` (``postgres`` or ``clickhouse``)."""
    return Path(migrations_dir) / pipeline_name / database


def list_migration_files(migrations_dir: Path | str, pipeline_name: str, database: str) -> list[Path]:
    """The pipeline's migration files (``NNNN_<what>.sql``) in the order they apply; other files are ignored.

    Two files with the same number (a merge of two branches that both ran ``init``) are refused.
    """
    directory = migrations_path(migrations_dir, pipeline_name, database)
    if not directory.is_dir():
        return []
    by_number: dict[int, Path] = {}
    for path in sorted(directory.iterdir()):
        match = _FILENAME_RE.match(path.name)
        if not match or not path.is_file():
            continue
        number = int(match.group("number"))
        if number in by_number:
            raise MigrationError(
                f"{by_number[number]} and {path} have the same number {match.group('number')}",
                hint="renumber the newer one after the last applied migration (and fix its ledger trailer)",
            )
        by_number[number] = path
    return [by_number[number] for number in sorted(by_number)]


def next_number(files: list[Path]) -> int:
    """The number of the file that comes after ``files`` (as :func:`list_migration_files` lists them)."""
    if not files:
        return 1
    match = _FILENAME_RE.match(files[-1].name)
    assert match is not None
    return int(match.group("number")) + 1


def slug(text: str) -> str:
    """``text`` as the ``<what>`` of a file name: lower case ASCII letters, digits and underscores."""
    slugged = _SLUG_RE.sub("_", text.lower()).strip("_")[:40].rstrip("_")
    return slugged or "sink"


@dataclass(frozen=True)
class ParsedMigration:
    """A migration file split into its parts (see the module docstring)."""

    header: str
    body: str
    trailer: str
    declared_checksum: str | None
    state: dict[str, Any] | None
    state_error: str | None = None
    """Why the ``-- cdcsync-state:`` line could not be read, if it could not."""

    @property
    def checksum(self) -> str:
        """``sha256:<hex>`` of the body as it is now."""
        return body_checksum(self.body)

    @property
    def records_itself(self) -> bool:
        """True when the file ends with the ledger trailer, so applying it by hand records it too."""
        return bool(self.trailer)


def body_checksum(body: str) -> str:
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def state_line(state: dict[str, Any]) -> str:
    """The machine-readable header line holding ``state`` (compact, sorted keys, ASCII only)."""
    return STATE_PREFIX + json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def parse_migration(text: str) -> ParsedMigration:
    """Split a migration file into header, body and trailer, and read its checksum and state lines.

    The state is checked only for what every target's state has (format, sinks with named, typed columns); the
    target checks its own keys when it reads the state back (:func:`cdcsync.migrations.plan.last_state`).
    """
    text = text.replace("\r\n", "\n")
    header_match = _HEADER_RE.match(text)
    header_end = header_match.end() if header_match else 0
    header, rest = text[:header_end], text[header_end:]
    trailers = list(_TRAILER_RE.finditer(rest))
    if trailers:
        body, trailer = rest[: trailers[-1].start()], rest[trailers[-1].start() :]
    else:
        body, trailer = rest, ""
    declared: str | None = None
    state: dict[str, Any] | None = None
    state_error: str | None = None
    for line in header.split("\n"):
        if line.startswith(CHECKSUM_PREFIX):
            declared = line[len(CHECKSUM_PREFIX) :].strip()
        elif line.startswith(STATE_PREFIX):
            try:
                loaded = json.loads(line[len(STATE_PREFIX) :])
            except ValueError as error:
                state_error = f"the '{STATE_PREFIX.strip()}' line is not valid JSON: {error}"
                continue
            if not has_shape(loaded):
                state_error = NOT_A_STATE
                continue
            state = loaded
    return ParsedMigration(header, body, trailer, declared, state, state_error)


def has_shape(state: Any, internal_key: str | None = None, sink_keys: frozenset[str] = frozenset()) -> bool:
    """Whether ``state`` is a cdcsync state (every sink with a list of ``{"name", "type"}`` columns); with a
    target's ``internal_key`` and ``sink_keys``, whether it is one of that target's states."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        return False
    sinks = state.get("sinks")
    if internal_key is not None and not isinstance(state.get(internal_key), str):
        return False
    if not isinstance(sinks, dict):
        return False
    for sink in sinks.values():
        if not isinstance(sink, dict) or not {"columns", *sink_keys} <= set(sink):
            return False
        if not isinstance(sink["columns"], list):
            return False
        if not all(isinstance(c, dict) and {"name", "type"} <= set(c) for c in sink["columns"]):
            return False
    return True


def read_migration(path: Path) -> ParsedMigration:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise MigrationError(f"{path}: cannot read the migration file: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise MigrationError(f"{path}: not a UTF-8 text file ({error.reason})") from None
    return parse_migration(text)


@dataclass(frozen=True)
class MigrationStatus:
    """One migration file and whether the target's ledger has it."""

    filename: str
    path: Path
    state: MigrationState
    checksum: str
    """Checksum of the file's body as it is on disk now."""
    applied_checksum: str | None = None
    """Checksum recorded in the ledger when the file was applied (None while pending)."""
    applied_at: datetime | None = None
