"""Migrations: render them from a pipeline (``cdcsync init``), track and apply them (``cdcsync migrate``), and
refuse to run against a database that lacks them (``cdcsync run``), for each target database.

The public API::

    from cdcsync import migrations
    from cdcsync.migrations import CLICKHOUSE, POSTGRES, TARGETS

    migrations.init(POSTGRES, pipeline, migrations_dir)            # write the next files
    migrations.status(POSTGRES, conn, pipeline.name, migrations_dir)
    migrations.apply_pending(CLICKHOUSE, client, pipeline.name, migrations_dir)
    migrations.check_ready(POSTGRES, conn, pipeline.name, migrations_dir, pipeline=pipeline)

Modules: :mod:`~cdcsync.migrations.files` (the file format), :mod:`~cdcsync.migrations.plan` (``init``),
:mod:`~cdcsync.migrations.apply` (the ledger), :mod:`~cdcsync.migrations.target` (what a database provides),
:mod:`~cdcsync.migrations.postgres`, :mod:`~cdcsync.migrations.clickhouse` and :mod:`~cdcsync.migrations.delta`
(the targets),
:mod:`~cdcsync.migrations.recorded` (the source schemas ``init`` recorded).
"""

from cdcsync.migrations.apply import apply_pending, check_ready, status
from cdcsync.migrations.clickhouse import CLICKHOUSE
from cdcsync.migrations.delta import DELTA
from cdcsync.migrations.files import (
    STATE_PREFIX,
    MigrationStatus,
    ParsedMigration,
    list_migration_files,
    migrations_path,
    parse_migration,
    read_migration,
    state_line,
)
from cdcsync.migrations.plan import InitResult, PlannedMigration, init, plan, render_migration_file
from cdcsync.migrations.postgres import POSTGRES
from cdcsync.migrations.recorded import recorded_lookup, recorded_schemas, recorded_tables
from cdcsync.migrations.target import Target

TARGETS: tuple[Target, ...] = (POSTGRES, CLICKHOUSE, DELTA)
"""Every target, in the order ``init`` and ``migrate`` handle them."""

__all__ = [
    "CLICKHOUSE",
    "DELTA",
    "POSTGRES",
    "STATE_PREFIX",
    "TARGETS",
    "InitResult",
    "MigrationStatus",
    "ParsedMigration",
    "PlannedMigration",
    "Target",
    "apply_pending",
    "check_ready",
    "init",
    "list_migration_files",
    "migrations_path",
    "parse_migration",
    "plan",
    "read_migration",
    "recorded_lookup",
    "recorded_schemas",
    "recorded_tables",
    "render_migration_file",
    "state_line",
    "status",
]
