"""ClickHouse migrations: ``migrations/<pipeline>/clickhouse/NNNN_<what>.sql`` beside the Postgres ones.

Same file format, checksum and state line as :mod:`cdcsync.migrations.postgres` (whose parsing and file handling
this module reuses), with a ClickHouse state (``"database": "clickhouse"``) and ClickHouse DDL from
``templates/clickhouse/``. Only pipelines with ``type: clickhouse`` sinks get these files and need a ClickHouse
server at all. The ledger is ``cdcsync.schema_migrations`` in ClickHouse (a database named like Postgres'
internal schema); the files end with an ``INSERT`` into it, so ``clickhouse-client --multiquery`` records a file
exactly as ``cdcsync migrate`` does.

ClickHouse DDL is not transactional: a file is applied statement by statement (every statement is idempotent,
``IF NOT EXISTS``), then recorded. A failure half-way leaves the file pending and re-running it is safe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcsync.config import clickhouse_types
from cdcsync.core.errors import MigrationError
from cdcsync.migrations import postgres as pg
from cdcsync.sql.render import ch_quote_ident, ch_quote_qualified, render

if TYPE_CHECKING:
    from cdcsync.config.pipeline import ClickHouseSink, Pipeline

DATABASE = "clickhouse"
INTERNAL_DATABASE = "cdcsync"
DEDUPLICATION_WINDOW = 1000
"""Default ``non_replicated_deduplication_window``: how many recent insert tokens a table remembers. A replay
re-sends at most one batch's inserts (one per partition), so this leaves a wide margin."""


def desired_state(pipeline: Pipeline) -> dict[str, Any]:
    """The ClickHouse objects ``pipeline`` needs, as a JSON-able dict (the state line of the files).

    ::

        {"format": 1, "database": "clickhouse", "pipeline": "shop", "internal_database": "cdcsync",
         "sinks": {"orders_ch": {"database": "default", "table": "orders", "primary_key": ["id"],
                                 "columns": [{"name": "id", "type": "Int64"}, ...],   # business columns only
                                 "partition_by": null, "ttl": null, "legacy_server": false, "view": null,
                                 "settings": {"non_replicated_deduplication_window": 1000}}}}
    """
    sinks: dict[str, Any] = {}
    for sink_id, sink in sorted(pipeline.clickhouse_sinks().items()):
        sinks[sink_id] = sink_state(pipeline, sink)
    return {
        "format": pg.STATE_FORMAT,
        "database": DATABASE,
        "pipeline": pipeline.name,
        "internal_database": INTERNAL_DATABASE,
        "sinks": sinks,
    }


def sink_state(pipeline: Pipeline, sink: ClickHouseSink) -> dict[str, Any]:
    """One sink's entry of :func:`desired_state`."""
    key = pipeline.sink_primary_key(sink)
    columns = [
        {
            "name": name,
            "type": clickhouse_types.column_type(
                pg_type, key=name in key, low_cardinality=name in sink.low_cardinality
            ),
        }
        for name, pg_type in pipeline.columns_of(sink.from_).items()
    ]
    return {
        "database": sink.database,
        "table": sink.table,
        "columns": columns,
        "primary_key": list(key),
        "partition_by": sink.partition_by,
        "ttl": sink.ttl,
        "settings": {"non_replicated_deduplication_window": DEDUPLICATION_WINDOW, **sink.settings},
        "legacy_server": sink.legacy_server,
        "view": sink.view_name,
    }


def table_columns(sink_state_: dict[str, Any]) -> list[dict[str, str]]:
    """Every column of the table, in order: business columns, then the ones cdcsync adds."""
    return [*sink_state_["columns"], *({"name": n, "type": t} for n, t in clickhouse_types.METADATA_COLUMNS)]


# --------------------------------------------------------------------------------------------------------------
# Planning (cdcsync init)
# --------------------------------------------------------------------------------------------------------------


def _diff(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[tuple[str, str, tuple[Any, ...]]], list[str]]:
    """Additive changes (kind, sink id, added columns) and descriptions of destructive ones."""
    changes: list[tuple[str, str, tuple[Any, ...]]] = []
    destructive: list[str] = []
    for sink_id in sorted(set(old["sinks"]) - set(new["sinks"])):
        before = old["sinks"][sink_id]
        destructive.append(
            f"sink '{sink_id}' was removed or renamed; its table "
            f"{ch_quote_qualified(before['database'], before['table'])} would have to be dropped or renamed"
        )
    for sink_id, after in sorted(new["sinks"].items()):
        before = old["sinks"].get(sink_id)
        if before is None:
            changes.append(("add_sink", sink_id, ()))
            continue
        for key in ("database", "table", "primary_key", "partition_by", "ttl", "settings", "legacy_server", "view"):
            if before.get(key) != after.get(key):
                destructive.append(f"sink '{sink_id}': {key} changed from {before.get(key)!r} to {after.get(key)!r}")
        old_columns = {c["name"]: c["type"] for c in before["columns"]}
        new_columns = {c["name"]: c["type"] for c in after["columns"]}
        for name, old_type in old_columns.items():
            if name not in new_columns:
                destructive.append(f"sink '{sink_id}': column '{name}' was removed from its source")
            elif new_columns[name] != old_type:
                destructive.append(
                    f"sink '{sink_id}': column '{name}' changed type from {old_type} to {new_columns[name]}"
                )
        added = tuple((n, t) for n, t in new_columns.items() if n not in old_columns)
        if added:
            changes.append(("add_columns", sink_id, added))
    return changes, destructive


def _sink_what(sink_id: str, sink: dict[str, Any]) -> list[str]:
    table = ch_quote_qualified(sink["database"], sink["table"])
    key = ", ".join(ch_quote_ident(c) for c in sink["primary_key"])
    engine = "ReplacingMergeTree(_version)" if sink["legacy_server"] else "ReplacingMergeTree(_version, _is_deleted)"
    lines = [f"sink '{sink_id}': table {table}, {engine} ORDER BY ({key})"]
    if sink["view"]:
        lines.append(f"  view {ch_quote_qualified(sink['database'], sink['view'])}: current rows without deleted ones")
    return lines


def _render_sink(sink: dict[str, Any]) -> str:
    return render(f"{DATABASE}/table.sql.j2", sink={**sink, "columns": table_columns(sink)})


def plan(pipeline: Pipeline, migrations_dir: Path | str) -> list[pg.PlannedMigration]:
    """The ClickHouse files ``init`` would write; empty when up to date or when the pipeline has no such sinks."""
    directory = pg.migrations_path(migrations_dir, pipeline.name, DATABASE)
    files = pg.list_migration_files(migrations_dir, pipeline.name, DATABASE)
    desired = desired_state(pipeline)
    if not files and not desired["sinks"]:
        return []
    last_path, last = pg._last_state(files)
    if files and last is None:
        raise MigrationError(
            f"{directory} holds migrations, but none has a '{pg.STATE_PREFIX.strip()}' line",
            hint=f"add this line to the header of the last file and run init again:\n{pg.state_line(desired)}",
        )
    if last is None:
        changes: list[tuple[str, str, tuple[Any, ...]]] = [("init", "", ())]
        state = desired
    else:
        changes, destructive = _diff(last, desired)
        if destructive:
            raise MigrationError(
                f"pipeline '{pipeline.name}' changed in ways cdcsync does not migrate automatically in ClickHouse "
                f"(compared with {last_path}):\n" + "\n".join(f"  - {item}" for item in destructive),
                hint=(
                    f"write that migration by hand in {directory} (ClickHouse cannot change a table's ORDER BY "
                    "or engine in place: create a new table and INSERT … SELECT), with this line among the "
                    f"comment lines at its top:\n{pg.state_line(desired)}"
                ),
            )
        state = last
    planned: list[pg.PlannedMigration] = []
    number = pg._next_number(files)
    for kind, sink_id, added in changes:
        if kind == "init":
            state = desired
            body = "\n".join(
                [render(f"{DATABASE}/internal.sql.j2", internal_database=state["internal_database"])]
                + [_render_sink(sink) for _, sink in sorted(state["sinks"].items())]
            )
            what = [f"database {ch_quote_ident(state['internal_database'])} with table `schema_migrations`"]
            for sid, sink in sorted(state["sinks"].items()):
                what.extend(_sink_what(sid, sink))
            stem = "init"
        elif kind == "add_sink":
            state = json.loads(json.dumps(state))
            state["sinks"][sink_id] = desired["sinks"][sink_id]
            body = _render_sink(state["sinks"][sink_id])
            what, stem = _sink_what(sink_id, state["sinks"][sink_id]), f"add_sink_{pg._slug(sink_id)}"
        else:
            state = json.loads(json.dumps(state))
            sink = state["sinks"][sink_id]
            columns = [{"name": n, "type": t} for n, t in added]
            previous = [c["name"] for c in sink["columns"]] + [n for n, _ in added][:-1]
            placed = [{**c, "after": after} for c, after in zip(columns, previous[-len(columns) :], strict=True)]
            sink["columns"].extend(columns)
            body = render(f"{DATABASE}/add_columns.sql.j2", sink=sink, columns=placed)
            what = [
                f"columns of sink '{sink_id}', added to {ch_quote_qualified(sink['database'], sink['table'])}:",
                *(f"  {ch_quote_ident(n)} {t}" for n, t in added),
            ]
            stem = f"add_columns_{pg._slug(sink_id)}"
        filename = f"{number:04d}_{stem}.sql"
        verb = "adds" if kind == "add_columns" else "creates"
        text = pg.render_migration_file(filename, pipeline.name, what, body, state, verb=verb, database=DATABASE)
        planned.append(pg.PlannedMigration(filename, directory / filename, what, text, state))
        number += 1
    return planned


def init(pipeline: Pipeline, migrations_dir: Path | str) -> pg.InitResult:
    """Write the next ClickHouse migration files (never touching existing ones); see :func:`plan`."""
    directory = pg.migrations_path(migrations_dir, pipeline.name, DATABASE)
    planned = plan(pipeline, migrations_dir)
    if planned:
        directory.mkdir(parents=True, exist_ok=True)
    for migration in planned:
        try:
            with migration.path.open("x", encoding="utf-8", newline="\n") as handle:
                handle.write(migration.text)
        except FileExistsError:
            raise MigrationError(f"{migration.path} already exists; cdcsync never overwrites a migration") from None
    return pg.InitResult(directory=directory, written=planned)


# --------------------------------------------------------------------------------------------------------------
# Ledger (cdcsync migrate, cdcsync run)
# --------------------------------------------------------------------------------------------------------------


def split_statements(body: str) -> list[str]:
    """The statements of a file body: templates end each with ``;`` at the end of a line; comments dropped."""
    statements = []
    for chunk in body.split(";\n"):
        lines = [line for line in chunk.strip().rstrip(";").splitlines() if not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip()
        if statement:
            statements.append(statement)
    return statements


def status(client: Any, pipeline_name: str, migrations_dir: Path | str) -> list[pg.MigrationStatus]:
    """Every ClickHouse migration file of the pipeline with whether it is applied, pending or altered."""
    from cdcsync.db.clickhouse import wrap_clickhouse_error

    files = pg.list_migration_files(migrations_dir, pipeline_name, DATABASE)
    if not files:
        return []
    values = {"internal_database": INTERNAL_DATABASE}
    try:
        ledger: dict[str, tuple[str, Any]] = {}
        if int(client.command(render(f"{DATABASE}/runtime/ledger_exists.sql.j2", **values))):
            rows = client.query(
                render(f"{DATABASE}/runtime/ledger_rows.sql.j2", **values), parameters={"pipeline": pipeline_name}
            ).result_rows
            ledger = {row[0]: (row[1], row[2]) for row in rows}
    except Exception as error:
        raise wrap_clickhouse_error(
            error, "reading the ClickHouse migration ledger cdcsync.schema_migrations"
        ) from None
    statuses = []
    for path in files:
        checksum = pg.read_migration(path).checksum
        recorded = ledger.get(path.name)
        if recorded is None:
            statuses.append(pg.MigrationStatus(path.name, path, "pending", checksum))
        else:
            state: pg.MigrationState = "applied" if recorded[0] == checksum else "altered"
            statuses.append(pg.MigrationStatus(path.name, path, state, checksum, recorded[0], recorded[1]))
    return statuses


def apply_pending(client: Any, pipeline_name: str, migrations_dir: Path | str) -> list[pg.MigrationStatus]:
    """Apply the pending files in order, statement by statement, and record each in the ledger."""
    from cdcsync.db.clickhouse import wrap_clickhouse_error

    statuses = status(client, pipeline_name, migrations_dir)
    altered = [s for s in statuses if s.state == "altered"]
    if altered:
        raise pg._altered_error(altered[0]).add_context(f"applying ClickHouse migrations of '{pipeline_name}'")
    applied = []
    for pending in (s for s in statuses if s.state == "pending"):
        parsed = pg.read_migration(pending.path)
        try:
            for statement in split_statements(parsed.body):
                client.command(statement)
            client.command(
                render(f"{DATABASE}/runtime/ledger_record.sql.j2", internal_database=INTERNAL_DATABASE),
                parameters={"pipeline": pipeline_name, "filename": pending.filename, "checksum": parsed.checksum},
            )
        except Exception as error:
            raise wrap_clickhouse_error(error, f"applying {pending.path}", user_error=True) from None
        applied.append(pg.MigrationStatus(pending.filename, pending.path, "applied", parsed.checksum, parsed.checksum))
    return applied


def check_ready(
    client: Any, pipeline: Pipeline, migrations_dir: Path | str, *, pipeline_file: Path | str | None = None
) -> list[pg.MigrationStatus]:
    """Stop ``cdcsync run`` (exit 2, naming the file) when ClickHouse lacks a migration or one was altered."""
    yaml_arg = str(pipeline_file) if pipeline_file else "PIPELINE.yaml"
    directory = pg.migrations_path(migrations_dir, pipeline.name, DATABASE)
    statuses = status(client, pipeline.name, migrations_dir)
    if not statuses:
        raise MigrationError(
            f"pipeline '{pipeline.name}' has ClickHouse sinks but no migrations in {directory}",
            hint=f"run: cdcsync init {yaml_arg}, review the files, then: cdcsync migrate {yaml_arg}",
        )
    for item in statuses:
        if item.state == "altered":
            raise pg._altered_error(item)
    missing = plan(pipeline, migrations_dir)
    if missing:
        raise MigrationError(
            f"pipeline '{pipeline.name}' changed since its last ClickHouse migration in {directory}: "
            + "; ".join(line for planned in missing for line in planned.what if not line.startswith(" ")),
            hint=f"run: cdcsync init {yaml_arg}, review the new files, then: cdcsync migrate {yaml_arg}",
        )
    pending = [item for item in statuses if item.state == "pending"]
    if pending:
        others = f" (and {len(pending) - 1} more after it)" if len(pending) > 1 else ""
        raise MigrationError(
            f"migration {pending[0].path} has not been applied to ClickHouse{others}",
            hint=f"run: cdcsync migrate {yaml_arg}\n  or: {pg._APPLY_BY_HAND[DATABASE]} {pending[0].path}",
        )
    return statuses
