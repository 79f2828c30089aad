"""What a database must tell the migration machinery: the one interface behind ``init``, ``migrate`` and the
start-up check of ``run``.

Planning (:mod:`cdcsync.migrations.plan`) and the ledger walk (:mod:`cdcsync.migrations.apply`) are written once
against :class:`Target`; a target says what its state is, how it differs, what SQL each change renders, how to
connect and how its ledger is read and written. Adding a database means adding one of these, not another copy of
``init`` and ``migrate``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from cdcsync.config.pipeline import Pipeline
    from cdcsync.config.settings import Settings
    from cdcsync.migrations.files import ParsedMigration

ChangeKind = Literal[
    "init",
    "upgrade_internal",
    "add_sink",
    "add_columns",
    "add_dynamic_table",
    "record_sources",
    "upgrade_aggregate",
    "upgrade_version",
    "grant_roles",
]


@dataclass(frozen=True)
class Change:
    """One additive change between two states: one migration file."""

    kind: ChangeKind
    sink_id: str = ""
    """The sink's id, or the dynamic table's (``add_dynamic_table``)."""
    columns: tuple[tuple[str, str], ...] = ()
    """``add_columns``: (name, type) of each new column, in table order."""
    aggregates: tuple[str, ...] = ()
    """``upgrade_aggregate``: the aggregates whose running state is rebuilt."""
    from_version: int = 0
    """``upgrade_internal``: the internal tables version the migrations had."""


@dataclass(frozen=True)
class Applied:
    """A file a target has just applied and recorded."""

    applied_at: datetime | None
    """When the ledger says so, if it keeps the time."""


def column_problems(wanted: list[dict[str, str]], actual: dict[str, str]) -> list[str]:
    """What a table's columns (name -> type, as its database shows them) lack of the ``wanted`` ones (``name``,
    ``type``): the start-up checks of ``run`` say these. Extra columns are allowed (a DBA may add some)."""
    problems = []
    for column in wanted:
        if column["name"] not in actual:
            problems.append(f"it has no column {column['name']} (the pipeline needs {column['type']})")
        elif actual[column["name"]] != column["type"]:
            problems.append(
                f"its column {column['name']} is {actual[column['name']]}, the pipeline needs {column['type']}"
            )
    return problems


class Target(Protocol):
    """A database that cdcsync migrates (Postgres, ClickHouse)."""

    name: str
    """``postgres`` | ``clickhouse``: the folder of its files and of its templates, and the header's name for it."""
    label: str
    """How messages name its migrations: ``""`` (Postgres, the default one) or ``"ClickHouse "``."""
    apply_by_hand: str
    """The command a DBA applies one file with (printed in headers and hints)."""
    by_hand_note: str
    """Why a destructive change is left to a hand-written migration (in the hint of ``init``'s refusal)."""
    internal_key: str
    """The state key naming where cdcsync keeps its own tables (schema or database)."""
    sink_keys: frozenset[str]
    """The keys every sink of its state has, besides ``columns``."""

    def used_by(self, pipeline: Pipeline) -> bool:
        """Whether ``pipeline`` needs this database at all (else no files are written for it)."""
        ...

    def desired_state(self, pipeline: Pipeline) -> dict[str, Any]:
        """The objects ``pipeline`` needs here, as the JSON-able dict of the files' state line."""
        ...

    def diff(self, old: dict[str, Any], new: dict[str, Any]) -> tuple[list[Change], list[str]]:
        """Additive changes from state ``old`` to ``new`` in file order, and a description of each destructive
        one."""
        ...

    def render_change(self, change: Change, pipeline_name: str, state: dict[str, Any]) -> tuple[str, list[str], str]:
        """(file name stem without number, human lines, body SQL) of one change; ``state`` is the one after it."""
        ...

    def connect(self, settings: Settings) -> AbstractContextManager[Any]:
        """A connection (closed on exit) for :meth:`read_ledger` and :meth:`apply_file`."""
        ...

    def read_ledger(self, connection: Any, pipeline_name: str) -> dict[str, tuple[str, datetime | None]]:
        """(checksum, applied at) of each file the ledger records for the pipeline; empty without a ledger."""
        ...

    def apply_file(self, connection: Any, pipeline_name: str, path: Path, parsed: ParsedMigration) -> Applied | None:
        """Run one pending file's body and record it in the ledger; None when a concurrent run applied it first."""
        ...
