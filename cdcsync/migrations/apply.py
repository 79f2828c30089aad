"""The applied-migrations ledger of any target: ``cdcsync migrate [--status]``, and the check that stops
``cdcsync run`` with the exact file to apply when one is missing or was altered after it was applied."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import MigrationError
from cdcsync.migrations.files import (
    MigrationState,
    MigrationStatus,
    list_migration_files,
    migrations_path,
    read_migration,
)
from cdcsync.migrations.plan import plan

if TYPE_CHECKING:
    from cdcsync.config.pipeline import Pipeline
    from cdcsync.migrations.target import Target


def status(target: Target, connection: Any, pipeline_name: str, migrations_dir: Path | str) -> list[MigrationStatus]:
    """Every migration file of the pipeline for ``target``, in order, with whether it is applied, pending or
    altered.

    A file is *altered* when its body's checksum differs from the one recorded when it was applied. A database
    without the ledger yet has every file pending; without files, the database is not asked at all.
    """
    files = list_migration_files(migrations_dir, pipeline_name, target.name)
    if not files:
        return []
    ledger = target.read_ledger(connection, pipeline_name)
    statuses = []
    for path in files:
        checksum = read_migration(path).checksum
        recorded = ledger.get(path.name)
        if recorded is None:
            statuses.append(MigrationStatus(path.name, path, "pending", checksum))
        else:
            state: MigrationState = "applied" if recorded[0] == checksum else "altered"
            statuses.append(MigrationStatus(path.name, path, state, checksum, recorded[0], recorded[1]))
    return statuses


def _altered_error(altered: MigrationStatus) -> MigrationError:
    return MigrationError(
        f"migration {altered.path} was altered after it was applied: its checksum is now {altered.checksum}, "
        f"the ledger recorded {altered.applied_checksum}",
        hint=(
            "restore the file as it was applied (e.g. `git checkout` it) and put further changes in a new "
            "migration; if the database really has the new content, update its row in cdcsync.schema_migrations"
        ),
    )


def apply_pending(
    target: Target, connection: Any, pipeline_name: str, migrations_dir: Path | str
) -> list[MigrationStatus]:
    """Apply every pending migration of ``target`` in order, each recorded in the ledger as it is applied.

    Refuses (:class:`MigrationError`) when an applied file was altered. A file a concurrent run applied meanwhile
    is skipped (where the target can tell). Returns the files it applied.
    """
    statuses = status(target, connection, pipeline_name, migrations_dir)
    altered = [s for s in statuses if s.state == "altered"]
    if altered:
        raise _altered_error(altered[0]).add_context(f"applying {target.label}migrations of pipeline '{pipeline_name}'")
    applied: list[MigrationStatus] = []
    for pending in (s for s in statuses if s.state == "pending"):
        parsed = read_migration(pending.path)
        outcome = target.apply_file(connection, pipeline_name, pending.path, parsed)
        if outcome is None:
            continue
        checksum = parsed.checksum
        applied.append(
            MigrationStatus(pending.filename, pending.path, "applied", checksum, checksum, outcome.applied_at)
        )
    return applied


def check_ready(
    target: Target,
    connection: Any,
    pipeline_name: str,
    migrations_dir: Path | str,
    *,
    pipeline_file: Path | str | None = None,
    pipeline: Pipeline | None = None,
) -> list[MigrationStatus]:
    """Stop ``cdcsync run`` before it starts when ``target`` is not migrated.

    Raises :class:`MigrationError` (a user error, exit 2) naming the exact file when one is altered or pending,
    and when the pipeline has no migrations at all. When ``pipeline`` is given, also when it changed since its
    last migration (a new sink or column that ``cdcsync init`` has not rendered yet). Returns the statuses.
    """
    yaml_arg = str(pipeline_file) if pipeline_file else "PIPELINE.yaml"
    directory = migrations_path(migrations_dir, pipeline_name, target.name)
    statuses = status(target, connection, pipeline_name, migrations_dir)
    if not statuses:
        raise MigrationError(
            f"pipeline '{pipeline_name}' has no {target.label}migrations in {directory}",
            hint=f"run: cdcsync init {yaml_arg}, review the files, then: cdcsync migrate {yaml_arg}",
        )
    for item in statuses:
        if item.state == "altered":
            raise _altered_error(item)
    if pipeline is not None:
        try:
            missing = plan(target, pipeline, migrations_dir)
        except MigrationError as error:
            raise error.add_context(f"pipeline '{pipeline_name}' differs from its migrations") from None
        if missing:
            raise MigrationError(
                f"pipeline '{pipeline_name}' changed since its last {target.label}migration in {directory}: "
                + "; ".join(line for planned in missing for line in planned.what if not line.startswith(" ")),
                hint=f"run: cdcsync init {yaml_arg}, review the new files, then: cdcsync migrate {yaml_arg}",
            )
    pending = [item for item in statuses if item.state == "pending"]
    if pending:
        first = pending[0]
        others = f" (and {len(pending) - 1} more after it)" if len(pending) > 1 else ""
        how = f"run: cdcsync migrate {yaml_arg}"
        if read_migration(first.path).records_itself:
            how += f"\n  or apply each pending file in order with: {target.apply_by_hand} {first.path}"
        raise MigrationError(
            f"migration {first.path} has not been applied to this {target.label}database{others}", hint=how
        )
    return statuses
