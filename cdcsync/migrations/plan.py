"""``cdcsync init`` for any target: diff the pipeline against the state line of the last file that has one, and
write only the next files (one per change: a new sink, new columns of a sink), never rewriting a file, refusing
destructive changes.

Output is deterministic: sinks sorted by id, columns in the order the tables have them, no timestamps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cdcsync
from cdcsync.core.errors import MigrationError
from cdcsync.migrations.files import (
    CHECKSUM_PREFIX,
    NOT_A_STATE,
    STATE_PREFIX,
    TRAILER_MARKER,
    body_checksum,
    has_shape,
    list_migration_files,
    migrations_path,
    next_number,
    read_migration,
    state_line,
)
from cdcsync.migrations.target import Change
from cdcsync.sql.render import comment_text, render

if TYPE_CHECKING:
    from cdcsync.config.pipeline import Pipeline
    from cdcsync.migrations.target import Target


@dataclass(frozen=True)
class PlannedMigration:
    """A migration file ``init`` writes (or would write)."""

    filename: str
    path: Path
    what: list[str]
    """Human lines: what the file creates or adds."""
    text: str
    """The complete file content."""
    state: dict[str, Any]
    """The cumulative desired state after this file."""


@dataclass(frozen=True)
class InitResult:
    """What ``init`` wrote. Iterating yields the written paths; it is empty (falsy) when up to date."""

    directory: Path
    written: list[PlannedMigration] = field(default_factory=list)

    @property
    def up_to_date(self) -> bool:
        return not self.written

    def __iter__(self) -> Iterator[Path]:
        return iter([planned.path for planned in self.written])

    def __len__(self) -> int:
        return len(self.written)

    def summary(self) -> str:
        if self.up_to_date:
            return f"migrations in {self.directory} are up to date with the pipeline; nothing written"
        lines = [f"wrote {len(self.written)} migration file(s) to {self.directory}:"]
        for planned in self.written:
            lines.append(f"  {planned.path}")
            lines.extend(f"    {comment_text(line)}" for line in planned.what)
        return "\n".join(lines)


def render_migration_file(
    target: Target,
    filename: str,
    pipeline_name: str,
    what: list[str],
    body: str,
    state: dict[str, Any],
    *,
    verb: str = "creates",
) -> str:
    """The complete text of a generated migration file of ``target`` (header, body, ledger trailer)."""
    section = "\n" + body.rstrip("\n") + "\n\n"
    checksum = body_checksum(section)
    header = [
        f"cdcsync migration {filename} for pipeline '{pipeline_name}' ({target.name})",
        f"generator: cdcsync {cdcsync.__version__}",
        f"{verb}:",
        *(f"  {line}" for line in what),
        "apply with: cdcsync migrate PIPELINE.yaml",
        f"        or: {target.apply_by_hand} {filename}",
        "the checksum covers the SQL between this header and the ledger record at the end;",
        "an applied file must not change: write a new migration instead",
    ]
    lines = [f"-- {comment_text(line)}" for line in header]
    lines.append(f"{CHECKSUM_PREFIX}{checksum}")
    lines.append(state_line(state))
    trailer = (
        TRAILER_MARKER
        + " record this file as applied (cdcsync migrate records it itself)\n"
        + render(
            f"{target.name}/record_migration.sql.j2",
            **{target.internal_key: state.get(target.internal_key)},
            pipeline=pipeline_name,
            filename=filename,
            checksum=checksum,
        )
    )
    return "\n".join(lines) + "\n" + section + trailer


def last_state(target: Target, files: list[Path]) -> tuple[Path | None, dict[str, Any] | None]:
    """The last of ``files`` that has a state line, and its state; (None, None) when none has one."""
    for path in reversed(files):
        parsed = read_migration(path)
        error = parsed.state_error
        if parsed.state is not None and not has_shape(parsed.state, target.internal_key, target.sink_keys):
            error = NOT_A_STATE
        if error is not None:
            raise MigrationError(
                f"{path}: {error}", hint="restore the line as cdcsync wrote it (`git diff` shows what changed)"
            )
        if parsed.state is not None:
            return path, parsed.state
    return None, None


def diff_sinks(
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    removed: Callable[[str, dict[str, Any]], str],
    changed: Callable[[str, dict[str, Any], dict[str, Any]], list[str]],
    upgraded: Callable[[str, dict[str, Any], dict[str, Any]], list[Change]] | None = None,
) -> tuple[list[Change], list[str]]:
    """The sinks part of a target's :meth:`~cdcsync.migrations.target.Target.diff`, in file order.

    A new sink is added, new columns are added (last, in the source's order); a removed sink (described by
    ``removed``), a removed or retyped column, and whatever ``changed`` finds in a kept sink are destructive;
    ``upgraded`` names the additive changes of a kept sink that ``changed`` let pass (before its new columns).
    """
    changes: list[Change] = []
    destructive = [removed(sink_id, old[sink_id]) for sink_id in sorted(old) if sink_id not in new]
    for sink_id in sorted(new):
        after = new[sink_id]
        if sink_id not in old:
            changes.append(Change("add_sink", sink_id))
            continue
        before = old[sink_id]
        destructive.extend(changed(sink_id, before, after))
        if upgraded is not None:
            changes.extend(upgraded(sink_id, before, after))
        old_columns = {c["name"]: c["type"] for c in before["columns"]}
        new_columns = {c["name"]: c["type"] for c in after["columns"]}
        for name, old_type in old_columns.items():
            if name not in new_columns:
                destructive.append(f"sink '{sink_id}': column '{name}' was removed from its source")
            elif new_columns[name] != old_type:
                destructive.append(
                    f"sink '{sink_id}': column '{name}' changed type from {old_type} to {new_columns[name]}"
                )
        added = tuple((name, type_) for name, type_ in new_columns.items() if name not in old_columns)
        if added:
            changes.append(Change("add_columns", sink_id, added))
    return changes, destructive


def apply_change(state: dict[str, Any], change: Change, desired: dict[str, Any]) -> dict[str, Any]:
    """The cumulative state after ``change``: existing columns keep their table order, new ones go last."""
    after: dict[str, Any] = json.loads(json.dumps(state))
    after.pop("sources", None)
    if desired.get("sources"):
        after["sources"] = desired["sources"]
    if change.kind == "upgrade_internal":
        after["internal_version"] = desired["internal_version"]
    elif change.kind == "grant_roles":
        after["roles"] = desired["roles"]
    elif change.kind == "add_sink":
        after["sinks"][change.sink_id] = desired["sinks"][change.sink_id]
    elif change.kind == "add_dynamic_table":
        after.setdefault("dynamic_tables", {})[change.sink_id] = desired["dynamic_tables"][change.sink_id]
    elif change.kind == "upgrade_version":
        after["sinks"][change.sink_id]["version_type"] = desired["sinks"][change.sink_id]["version_type"]
    elif change.kind == "upgrade_aggregate":
        after["sinks"][change.sink_id]["aggregate"] = desired["sinks"][change.sink_id]["aggregate"]
    elif change.kind == "add_columns":
        after["sinks"][change.sink_id]["columns"].extend(
            {"name": name, "type": type_} for name, type_ in change.columns
        )
    return after


def plan(target: Target, pipeline: Pipeline, migrations_dir: Path | str) -> list[PlannedMigration]:
    """The files ``init`` would write for ``target``, without writing them; empty when the migrations are up to
    date or the pipeline does not use the target.

    Raises :class:`MigrationError` for destructive changes, listing each and what to do instead.
    """
    directory = migrations_path(migrations_dir, pipeline.name, target.name)
    files = list_migration_files(migrations_dir, pipeline.name, target.name)
    if not files and not target.used_by(pipeline):
        return []
    desired = target.desired_state(pipeline)
    last_path, last = last_state(target, files)
    if files and last is None:
        raise MigrationError(
            f"{directory} holds migrations, but none has a '{STATE_PREFIX.strip()}' line, so cdcsync cannot tell "
            "what they created",
            hint=f"add this line to the header of the last file and run init again:\n{state_line(desired)}",
        )
    changes: list[Change]
    if last is None:
        changes, state = [Change("init")], desired
    else:
        changes, destructive = target.diff(last, desired)
        if destructive:
            raise MigrationError(
                f"pipeline '{pipeline.name}' changed in ways cdcsync does not migrate automatically "
                f"(compared with {last_path}):\n" + "\n".join(f"  - {item}" for item in destructive),
                hint=(
                    f"write that migration by hand {target.by_hand_note}, as "
                    f"{directory / f'{next_number(files):04d}_<what>.sql'}, and put this line among the comment "
                    f"lines at its top so the next `cdcsync init` starts from it:\n{state_line(desired)}"
                ),
            )
        state = last
    planned: list[PlannedMigration] = []
    number = next_number(files)
    for change in changes:
        state = desired if change.kind == "init" else apply_change(state, change, desired)
        stem, what, body = target.render_change(change, pipeline.name, state)
        filename = f"{number:04d}_{stem}.sql"
        verb = {"add_columns": "adds", "upgrade_aggregate": "upgrades"}.get(change.kind, "creates")
        text = render_migration_file(target, filename, pipeline.name, what, body, state, verb=verb)
        planned.append(PlannedMigration(filename, directory / filename, what, text, state))
        number += 1
    return planned


def init(target: Target, pipeline: Pipeline, migrations_dir: Path | str) -> InitResult:
    """Render the next migration files of ``target`` for ``pipeline`` (``cdcsync init``); existing files are never
    touched.

    With no change since the last migration it writes nothing (``result.up_to_date``). Destructive changes
    raise :class:`MigrationError` and nothing is written.
    """
    directory = migrations_path(migrations_dir, pipeline.name, target.name)
    planned = plan(target, pipeline, migrations_dir)
    if planned:
        directory.mkdir(parents=True, exist_ok=True)
    for migration in planned:
        try:
            with migration.path.open("x", encoding="utf-8", newline="\n") as handle:
                handle.write(migration.text)
        except FileExistsError:
            raise MigrationError(
                f"{migration.path} already exists; cdcsync never overwrites a migration",
                hint="another `cdcsync init` may have run at the same time; run init again",
            ) from None
        except OSError as error:
            raise MigrationError(f"{migration.path}: cannot write the migration: {error.strerror}") from None
    return InitResult(directory=directory, written=planned)
