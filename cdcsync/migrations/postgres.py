"""Postgres migrations: the mirror, landing and aggregation tables, dynamic tables and cdcsync's own schema,
in ``migrations/<pipeline>/postgres/``, and the ledger ``cdcsync.schema_migrations``.

Only what is particular to Postgres lives here: the state a pipeline needs, how it may change, the DDL from
``templates/postgres/``, and a ledger that applies each file in one transaction with its ledger row. The file
format, ``init``, ``migrate`` and the start-up check are shared (:mod:`cdcsync.migrations.plan`,
:mod:`cdcsync.migrations.apply`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cdcsync.config.aggregate import resolve as resolve_aggregation
from cdcsync.config.pipeline import PostgresAggregateSink, internal_tables
from cdcsync.core import names
from cdcsync.core.errors import CdcsyncError, MigrationError, ServiceError
from cdcsync.migrations import aggregate_upgrade
from cdcsync.migrations.files import STATE_FORMAT, ParsedMigration, slug
from cdcsync.migrations.plan import diff_sinks
from cdcsync.migrations.target import Applied, Change
from cdcsync.sql.render import quote_ident, quote_qualified, render

if TYPE_CHECKING:
    from pathlib import Path

    import psycopg

    from cdcsync.config.pipeline import Pipeline
    from cdcsync.config.settings import Settings
    from cdcsync.config.types import PgType

DATABASE = "postgres"
INTERNAL_VERSION = 6
"""Version of the tables in the internal schema: 2 added ``truncations``, 3 ``dynamic_table_changes`` and its
trigger function, 4 the ``offsets`` column of ``batch_ledger``, 5 made truncate watermarks ``numeric(38,0)`` and
added ``source_positions``, 6 added ``key_moves``. States without it are version 1."""
_INTERNAL_UPGRADES: tuple[tuple[int, str, str, str], ...] = (
    (2, "internal_truncations.sql.j2", names.TRUNCATIONS_TABLE, "the last truncate applied per sink"),
    (
        3,
        "internal_dynamic_tables.sql.j2",
        names.DYNAMIC_TABLE_CHANGES_TABLE,
        "the change counter of dynamic tables, and the trigger function bumping it",
    ),
    (
        4,
        "internal_ledger_offsets.sql.j2",
        names.BATCH_LEDGER_TABLE,
        'new column "offsets": the Kafka offset ranges each batch read',
    ),
    (5, "internal_version_type.sql.j2", names.TRUNCATIONS_TABLE, f"watermarks widened to {names.VERSION_TYPE}"),
    (5, "internal_source_positions.sql.j2", names.SOURCE_POSITIONS_TABLE, "the newest source position per sink"),
    (
        6,
        "internal_key_moves.sql.j2",
        names.KEY_MOVES_TABLE,
        "the old key's large values of primary-key changes whose create is still to come",
    ),
)
"""(version, template, table, what it is) of each upgrade of the internal tables, in order."""


# --------------------------------------------------------------------------------------------------------------
# Desired state (parts of PostgresTarget.desired_state)
# --------------------------------------------------------------------------------------------------------------


def sources_state(pipeline: Pipeline) -> dict[str, Any]:
    """The sources' schemas as ``init`` read them, for ``validate`` and ``run`` (:mod:`cdcsync.migrations.recorded`)::

        {"orders": {"topic": "shop.public.orders", "primary_key": ["id"],
                    "columns": [{"name": "id", "type": "bigint"}, ...]}}

    Types are those the schema maps to, before declared ``columns:`` override them: ``run`` compares each
    message's schema with them to notice a type change at the source. Sources whose columns are only declared
    are left out, so pipelines that never introspect keep the state they always had."""
    sources: dict[str, Any] = {}
    for source_id, schema in sorted(pipeline.source_schemas.items()):
        if source_id in pipeline.sources and (schema.columns or schema.primary_key):
            sources[source_id] = {
                "topic": pipeline.sources[source_id].topic,
                "columns": [{"name": name, "type": type_text} for name, type_text in schema.columns],
                "primary_key": list(schema.primary_key) if schema.primary_key else None,
            }
    return sources


def _aggregate_state(
    pipeline_name: str, sink_id: str, sink: PostgresAggregateSink, columns: dict[str, PgType]
) -> dict[str, Any]:
    """What ``templates/postgres/aggregate.sql.j2`` renders for one ``postgres_aggregate`` sink.

    ::

        {"table": "revenue_by_customer", "empty_groups": "delete",
         "group_by": [{"name": "customer_id", "source": "customer_id", "type": "bigint", "cast": false}],
         "aggregates": [{"name": "revenue", "fn": "sum", "source": "amount", "type": "numeric(18,2)",
                         "accumulator_type": "numeric(18,2)", "index": "revenue_by_customer__amount__minmax"}],
         "empty_index": "revenue_by_customer__empty",
         "functions": {"insert": "shop__revenue__agg_insert", "update": ..., "delete": ...}, "revision": 2}

    ``index`` (min and max only) names the landing-table index that makes recomputing a group's extreme an
    index probe; aggregates of the same column share it.
    """
    resolved = resolve_aggregation(sink, columns)
    assert not resolved.problems, "validated pipelines resolve without problems"
    aggregates = []
    for aggregate in resolved.aggregates:
        entry: dict[str, Any] = {
            "name": aggregate.name,
            "fn": aggregate.fn,
            "source": aggregate.source,
            "type": aggregate.type.sql,
            "accumulator_type": aggregate.accumulator_type.sql if aggregate.accumulator_type else None,
            "index": None,
        }
        if aggregate.fn in ("min", "max") and aggregate.source is not None:
            entry["index"] = names.bounded(sink.agg_table, aggregate.source, "minmax")
        if aggregate.track_scale and aggregate.source is not None:  # only then: older states stay unchanged
            entry["scale_index"] = names.bounded(sink.agg_table, aggregate.source, "scale")
        aggregates.append(entry)
    return {
        "table": sink.agg_table,
        "empty_groups": sink.empty_groups,
        "group_by": [
            {"name": group.name, "source": group.source, "type": group.type.sql, "cast": group.cast}
            for group in resolved.group_by
        ],
        "aggregates": aggregates,
        "empty_index": names.bounded(sink.agg_table, "empty") if sink.empty_groups == "delete" else None,
        "functions": {
            event: names.aggregate_function(pipeline_name, sink_id, event) for event in ("insert", "update", "delete")
        },
        "revision": aggregate_upgrade.TRIGGER_REVISION,
    }


# --------------------------------------------------------------------------------------------------------------
# Changes (parts of the target's diff and render_change: cdcsync init)
# --------------------------------------------------------------------------------------------------------------


def _removed_sink(sink_id: str, before: dict[str, Any]) -> str:
    return (
        f"sink '{sink_id}' was removed or renamed; its table {quote_qualified(before['schema'], before['table'])} "
        "and its staging tables would have to be dropped or renamed"
    )


def _changed_sink(sink_id: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    where = f"sink '{sink_id}'"
    destructive = []
    if (before["schema"], before["table"]) != (after["schema"], after["table"]):
        destructive.append(
            f"{where}: target table changed from {quote_qualified(before['schema'], before['table'])} "
            f"to {quote_qualified(after['schema'], after['table'])}"
        )
    if before["primary_key"] != after["primary_key"]:
        destructive.append(
            f"{where}: primary key changed from ({', '.join(before['primary_key'])}) "
            f"to ({', '.join(after['primary_key'])})"
        )
    upgradable = aggregate_upgrade.changed_state(before.get("aggregate"), after.get("aggregate"))
    if before.get("aggregate") != after.get("aggregate") and upgradable is None:
        destructive.append(f"{where}: {_aggregate_change(before.get('aggregate'), after.get('aggregate'))}")
    if before["delete_mode"] != after["delete_mode"]:
        destructive.append(f"{where}: delete_mode changed from {before['delete_mode']} to {after['delete_mode']}")
    if before.get("stage_table") != after["stage_table"]:
        destructive.append(
            f"{where}: its staging table changed from {before.get('stage_table')!r} to {after['stage_table']!r}"
        )
    return destructive


def _upgraded_sink(sink_id: str, before: dict[str, Any], after: dict[str, Any]) -> list[Change]:
    changes = []
    if before.get("version_type", "bigint") != after["version_type"]:
        changes.append(Change("upgrade_version", sink_id))
    upgraded = aggregate_upgrade.changed_state(before.get("aggregate"), after.get("aggregate"))
    if upgraded is not None:
        changes.append(Change("upgrade_aggregate", sink_id, aggregates=upgraded))
    return changes


def _diff_dynamic_tables(
    old: dict[str, Any], new: dict[str, Any], changes: list[Change], destructive: list[str]
) -> None:
    for table_id in sorted(old):
        if table_id not in new:
            table = quote_qualified(old[table_id]["schema"], old[table_id]["table"])
            destructive.append(
                f"dynamic table '{table_id}' was removed, renamed or moved to another backend; its table {table} "
                "and its trigger would have to be dropped or renamed"
            )
    for table_id in sorted(new):
        after = new[table_id]
        if table_id not in old:
            changes.append(Change("add_dynamic_table", table_id))
            continue
        before = old[table_id]
        for key, what in (
            ("schema", "schema"),
            ("table", "table"),
            ("key_column", "key column"),
            ("key_type", "key type"),
        ):
            if before[key] != after[key]:
                destructive.append(
                    f"dynamic table '{table_id}': {what} changed from {before[key]} to {after[key]}; its table "
                    f"{quote_qualified(before['schema'], before['table'])} would have to be rebuilt"
                )


def _aggregate_change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    if before is None or after is None:
        return "changed between type postgres and postgres_aggregate"
    changed = [key for key in ("table", "group_by", "aggregates", "empty_groups") if before.get(key) != after.get(key)]
    return (
        f"its aggregation ({', '.join(changed) or 'definition'}) changed; the aggregation table "
        f"{quote_ident(before['table'])} would have to be rebuilt from the landing table"
    )


def _sink_what(sink_id: str, sink: dict[str, Any], internal_schema: str) -> list[str]:
    mirror = quote_qualified(sink["schema"], sink["table"])
    key = ", ".join(quote_ident(column) for column in sink["primary_key"])
    lines = [
        f"sink '{sink_id}' (delete_mode {sink['delete_mode']}, primary key {key}):",
        f"  table {mirror}: the mirror table",
        f"  unlogged table {quote_qualified(internal_schema, sink['stage_table'])}: its staging table",
    ]
    if sink["tombstone_table"]:
        lines.append(f"  table {quote_qualified(internal_schema, sink['tombstone_table'])}: its hard-deleted keys")
    aggregate = sink.get("aggregate")
    if aggregate:
        lines[1] = f"  table {mirror}: the landing table (current row per key)"
        columns = ", ".join(
            f"{a['fn']}({a['source'] or '*'}) as {quote_ident(a['name'])}" for a in aggregate["aggregates"]
        )
        groups = ", ".join(quote_ident(g["name"]) for g in aggregate["group_by"]) or "everything (one row)"
        lines.append(f"  table {quote_qualified(sink['schema'], aggregate['table'])}: {columns} grouped by {groups}")
        lines.append(f"  statement triggers on {mirror} keeping it up to date, and their functions")
    return lines


def _version_what(sink_id: str, sink: dict[str, Any], internal_schema: str) -> list[str]:
    tables = [quote_qualified(sink["schema"], sink["table"]), quote_qualified(internal_schema, sink["stage_table"])]
    if sink["tombstone_table"]:
        tables.append(quote_qualified(internal_schema, sink["tombstone_table"]))
    return [
        f"sink '{sink_id}': \"_cdc_version\" bigint -> {names.VERSION_TYPE} (source commit order; values kept) "
        f"in {', '.join(tables)}",
        "  (each table is rewritten under an exclusive lock: stop the pipeline first)",
    ]


def _render_dynamic_table(
    pipeline_name: str, table_id: str, table: dict[str, Any], internal_schema: str, roles: Any = None
) -> str:
    return render(
        f"{DATABASE}/dynamic_table.sql.j2",
        pipeline=pipeline_name,
        table_id=table_id,
        table=table,
        internal_schema=internal_schema,
        roles=roles,
    )


def _dynamic_table_what(table_id: str, table: dict[str, Any]) -> str:
    return (
        f"dynamic table '{table_id}': table {quote_qualified(table['schema'], table['table'])} keyed by "
        f"{quote_ident(table['key_column'])} {table['key_type']}, with a trigger counting its changes"
    )


def _render_sink(
    pipeline_name: str, sink_id: str, sink: dict[str, Any], internal_schema: str, roles: Any = None
) -> str:
    values = {"pipeline": pipeline_name, "sink_id": sink_id, "sink": sink, "internal_schema": internal_schema}
    values["roles"] = roles
    sql = render(f"{DATABASE}/mirror_table.sql.j2", **values)
    if sink.get("aggregate"):
        sql += "\n" + render(f"{DATABASE}/aggregate.sql.j2", **values)
    return sql


def _roles_preamble(state: dict[str, Any]) -> str:
    """The head of the migration that brings the role model (``templates/postgres/roles.sql.j2``): the roles, the
    schemas and the hand-over of existing tables and trigger functions to the owner, then ``SET LOCAL ROLE``."""
    internal = state["internal_schema"]
    sinks = state["sinks"].values()
    dynamic = (state.get("dynamic_tables") or {}).values()
    schemas = dict.fromkeys([internal, *(s["schema"] for s in sinks), *(t["schema"] for t in dynamic)])
    tables = [(internal, table) for table in names.INTERNAL_TABLES]
    functions = [(internal, "count_dynamic_table_change")]
    for sink in sinks:
        tables += [(sink["schema"], sink["table"]), (internal, sink["stage_table"])]
        if sink["tombstone_table"]:
            tables.append((internal, sink["tombstone_table"]))
        if sink.get("aggregate"):
            tables.append((sink["schema"], sink["aggregate"]["table"]))
            functions += [(internal, name) for name in sink["aggregate"]["functions"].values()]
    tables += [(t["schema"], t["table"]) for t in dynamic]
    return render(
        f"{DATABASE}/roles.sql.j2", roles=state["roles"], schemas=list(schemas), tables=tables, functions=functions
    )


def _roles_what(state: dict[str, Any], *, existing: bool) -> list[str]:
    owner, writer = quote_ident(state["roles"]["owner"]), quote_ident(state["roles"]["writer"])
    lines = [
        f"roles {owner} (owns every object; this file and the later ones run as it) and {writer} (what `cdcsync "
        "run` needs: rows, no DDL), NOLOGIN, unless they exist; needs a role that may create roles (a DBA)"
    ]
    if existing:
        lines.append(f"  existing tables and trigger functions handed to {owner}, their rows granted to {writer}")
    return lines


# --------------------------------------------------------------------------------------------------------------
# The target, with its ledger (cdcsync migrate, cdcsync run)
# --------------------------------------------------------------------------------------------------------------


_LEDGER_EXISTS_SQL = "SELECT to_regclass('cdcsync.schema_migrations') IS NOT NULL"
_LEDGER_ROWS_SQL = "SELECT filename, checksum, applied_at FROM cdcsync.schema_migrations WHERE pipeline = %s"
_LEDGER_ROW_SQL = "SELECT checksum FROM cdcsync.schema_migrations WHERE pipeline = %s AND filename = %s"
_LEDGER_INSERT_SQL = (
    "INSERT INTO cdcsync.schema_migrations (pipeline, filename, checksum) VALUES (%s, %s, %s) "
    "ON CONFLICT (pipeline, filename) DO NOTHING"
)
_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


def _wrap_db_error(error: Exception, doing: str) -> CdcsyncError:
    from cdcsync.db.retry import classify_postgres_error

    sqlstate = getattr(error, "sqlstate", None)
    detail = str(error).strip() or type(error).__name__
    if sqlstate:
        detail = f"{detail} (SQLSTATE {sqlstate})"
    if classify_postgres_error(error):
        return ServiceError(detail, retriable=True).add_context(doing)
    return MigrationError(detail).add_context(doing)


class PostgresTarget:
    """Postgres as a :class:`~cdcsync.migrations.target.Target`."""

    name = DATABASE
    label = ""
    apply_by_hand = "psql --single-transaction -v ON_ERROR_STOP=1 -f"
    by_hand_note = "(dropping or altering objects needs a DBA's decision)"
    internal_key = "internal_schema"
    sink_keys = frozenset({"schema", "table", "primary_key", "delete_mode", "stage_table", "tombstone_table"})

    def used_by(self, pipeline: Pipeline) -> bool:
        """Always: the batch ledger and dead letters live in Postgres even without Postgres sinks."""
        return True

    def desired_state(self, pipeline: Pipeline) -> dict[str, Any]:
        """The Postgres objects ``pipeline`` needs, as a plain JSON-able dict.

        ::

            {"format": 1, "database": "postgres", "pipeline": "shop", "internal_schema": "cdcsync",
             "sinks": {"orders_mirror": {"schema": "app", "table": "orders",
                                         "columns": [{"name": "id", "type": "bigint"}, ...],
                                         "primary_key": ["id"], "delete_mode": "hard",
                                         "stage_table": "shop__orders_mirror__stage",
                                         "tombstone_table": "shop__orders_mirror__tombstones",
                                         "version_type": "numeric(38,0)"}}}

        Columns keep the source's declaration order; types are canonical (``parse_pg_type(...).sql``);
        ``tombstone_table`` is null in soft delete mode; ``version_type`` is the type of ``_cdc_version`` (absent:
        ``bigint``, written before versions were commit positions; ``init`` then writes the upgrade). A
        ``postgres_aggregate`` sink's ``table`` is its landing table, and its entry has an ``aggregate`` key as well
        (see :func:`_aggregate_state`).

        Postgres-backed dynamic tables, when there are some, are under ``"dynamic_tables"``:
        ``{"vip": {"schema": "public", "table": "vip_customers", "key_column": "key", "key_type": "bigint"}}``.
        """
        sinks: dict[str, Any] = {}
        postgres_sinks = pipeline.postgres_sinks()  # ClickHouse sinks: cdcsync.migrations.clickhouse
        for sink_id in sorted(postgres_sinks):
            sink = postgres_sinks[sink_id]
            columns = pipeline.columns_of(sink.from_)
            stage_table, tombstone_table = internal_tables(pipeline.name, sink_id, sink)
            sinks[sink_id] = {
                "schema": sink.schema_,
                "table": sink.table,
                "columns": [{"name": name, "type": pg_type.sql} for name, pg_type in columns.items()],
                "primary_key": list(pipeline.sink_primary_key(sink)),
                "delete_mode": sink.delete_mode,
                "stage_table": stage_table,
                "tombstone_table": tombstone_table if sink.delete_mode == "hard" else None,
                "version_type": names.VERSION_TYPE,
            }
            if isinstance(sink, PostgresAggregateSink):
                sinks[sink_id]["aggregate"] = _aggregate_state(pipeline.name, sink_id, sink, columns)
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "database": DATABASE,
            "pipeline": pipeline.name,
            "internal_schema": names.INTERNAL_SCHEMA,
            "internal_version": INTERNAL_VERSION,
            "roles": {"owner": names.OWNER_ROLE, "writer": names.WRITER_ROLE},
            "sinks": sinks,
        }
        tables = {
            table_id: {
                "schema": spec.schema,
                "table": spec.table,
                "key_column": spec.key_column,
                "key_type": spec.key_type.sql,
            }
            for table_id, spec in sorted(pipeline.plan.dynamic_tables.items())
            if spec.backend == "postgres"
        }
        if tables:
            state["dynamic_tables"] = tables
        sources = sources_state(pipeline)
        if sources:
            state["sources"] = sources
        return state

    def diff(self, old: dict[str, Any], new: dict[str, Any]) -> tuple[list[Change], list[str]]:
        """Additive changes from ``old`` to ``new``, and a description of every destructive one."""
        changes: list[Change] = []
        destructive: list[str] = []
        if old.get("internal_schema", names.INTERNAL_SCHEMA) != new["internal_schema"]:
            destructive.append(
                f"the internal schema changed from '{old.get('internal_schema')}' to '{new['internal_schema']}'"
            )
        old_version = old.get("internal_version", 1)
        if old_version < new["internal_version"]:
            changes.append(Change("upgrade_internal", from_version=old_version))
        elif old_version > new["internal_version"]:
            destructive.append(
                f"the migrations were written by a newer cdcsync (internal tables version {old_version}); "
                "upgrade cdcsync"
            )
        sink_changes, sink_destructive = diff_sinks(
            old.get("sinks", {}), new["sinks"], removed=_removed_sink, changed=_changed_sink, upgraded=_upgraded_sink
        )
        changes.extend(sink_changes)
        destructive.extend(sink_destructive)
        _diff_dynamic_tables(old.get("dynamic_tables", {}), new.get("dynamic_tables", {}), changes, destructive)
        if "roles" not in old:  # written before the role model: last, hand everything to the roles
            changes.append(Change("grant_roles"))
        elif old["roles"] != new["roles"]:
            destructive.append(f"the roles changed from {old['roles']} to {new['roles']}")
        if not changes and old.get("sources") != new.get("sources"):
            changes.append(Change("record_sources"))  # e.g. a source feeding only ClickHouse sinks gained a column
        return changes, destructive

    def render_change(self, change: Change, pipeline_name: str, state: dict[str, Any]) -> tuple[str, list[str], str]:
        """(filename stem without number, human lines, body SQL) for one change; ``state`` is the state after it."""
        internal_schema = state["internal_schema"]
        roles = state.get("roles")
        if change.kind == "grant_roles":
            body = _roles_preamble(state) + "\n" + render(f"{DATABASE}/grant_roles.sql.j2", state=state)
            return "grant_roles", _roles_what(state, existing=True), body
        stem, what, body = self._render_change(change, pipeline_name, state, internal_schema, roles)
        if roles and change.kind == "init":
            return stem, [*_roles_what(state, existing=False), *what], _roles_preamble(state) + "\n" + body
        if roles and change.kind != "record_sources":
            schemas = []
            if change.kind == "add_sink":
                schemas = [state["sinks"][change.sink_id]["schema"]]
            elif change.kind == "add_dynamic_table":
                schemas = [state["dynamic_tables"][change.sink_id]["schema"]]
            return stem, what, render(f"{DATABASE}/as_owner.sql.j2", roles=roles, schemas=schemas) + "\n" + body
        return stem, what, body

    def _render_change(
        self, change: Change, pipeline_name: str, state: dict[str, Any], internal_schema: str, roles: Any
    ) -> tuple[str, list[str], str]:
        if change.kind == "init":
            parts = [render(f"{DATABASE}/internal_schema.sql.j2", schema=internal_schema, roles=roles)]
            what = [
                f"schema {quote_ident(internal_schema)} with tables "
                f"{quote_ident(names.SCHEMA_MIGRATIONS_TABLE)}, {quote_ident(names.BATCH_LEDGER_TABLE)}, "
                f"{quote_ident(names.DEAD_LETTERS_TABLE)}, {quote_ident(names.TRUNCATIONS_TABLE)}, "
                f"{quote_ident(names.SOURCE_POSITIONS_TABLE)}, {quote_ident(names.KEY_MOVES_TABLE)}, "
                f"{quote_ident(names.DYNAMIC_TABLE_CHANGES_TABLE)}"
            ]
            for sink_id, sink in sorted(state["sinks"].items()):
                parts.append(_render_sink(pipeline_name, sink_id, sink, internal_schema, roles))
                what.extend(_sink_what(sink_id, sink, internal_schema))
            for table_id, table in sorted(state.get("dynamic_tables", {}).items()):
                parts.append(_render_dynamic_table(pipeline_name, table_id, table, internal_schema, roles))
                what.append(_dynamic_table_what(table_id, table))
            return "init", what, "\n".join(parts)
        if change.kind == "upgrade_internal":
            upgrades = [upgrade for upgrade in _INTERNAL_UPGRADES if upgrade[0] > change.from_version]
            body = "\n".join(
                render(f"{DATABASE}/{template}", schema=internal_schema, roles=roles) for _, template, _, _ in upgrades
            )
            what = [f"table {quote_qualified(internal_schema, table)}: {what}" for _, _, table, what in upgrades]
            return "upgrade_internal_tables", what, body
        if change.kind == "add_dynamic_table":
            table = state["dynamic_tables"][change.sink_id]
            body = _render_dynamic_table(pipeline_name, change.sink_id, table, internal_schema, roles)
            return f"add_dynamic_table_{slug(change.sink_id)}", [_dynamic_table_what(change.sink_id, table)], body
        if change.kind == "record_sources":
            what = [
                f"source '{source_id}': columns {', '.join(quote_ident(c['name']) for c in entry['columns'])}"
                for source_id, entry in sorted((state.get("sources") or {}).items())
            ]
            body = render(f"{DATABASE}/record_sources.sql.j2", sources=sorted(state.get("sources") or {}))
            return "record_source_schemas", what or ["no source schemas"], body
        sink = state["sinks"][change.sink_id]
        if change.kind == "upgrade_version":
            body = render(f"{DATABASE}/upgrade_version.sql.j2", sink=sink, internal_schema=internal_schema)
            return (
                f"upgrade_versions_{slug(change.sink_id)}",
                _version_what(change.sink_id, sink, internal_schema),
                body,
            )
        if change.kind == "upgrade_aggregate":
            values = {
                "pipeline": pipeline_name,
                "sink_id": change.sink_id,
                "sink": sink,
                "internal_schema": internal_schema,
                "upgrade": list(change.aggregates),
                "roles": roles,
            }
            body = render(f"{DATABASE}/aggregate.sql.j2", **values)
            return (
                f"upgrade_aggregate_{slug(change.sink_id)}",
                aggregate_upgrade.describe(sink, change.aggregates),
                body,
            )
        if change.kind == "add_sink":
            body = _render_sink(pipeline_name, change.sink_id, sink, internal_schema, roles)
            return f"add_sink_{slug(change.sink_id)}", _sink_what(change.sink_id, sink, internal_schema), body
        columns = [{"name": name, "type": type_} for name, type_ in change.columns]
        body = render(f"{DATABASE}/add_columns.sql.j2", internal_schema=internal_schema, sink=sink, columns=columns)
        what = [
            f"columns of sink '{change.sink_id}', added to {quote_qualified(sink['schema'], sink['table'])} "
            f"and {quote_qualified(internal_schema, sink['stage_table'])}:",
            *(f"  {quote_ident(name)} {type_}" for name, type_ in change.columns),
        ]
        return f"add_columns_{slug(change.sink_id)}", what, body

    def read_ledger(self, conn: psycopg.Connection[Any], pipeline_name: str) -> dict[str, tuple[str, datetime | None]]:
        import psycopg

        try:
            with conn.transaction():
                exists_row = conn.execute(_LEDGER_EXISTS_SQL).fetchone()
                if not exists_row or not exists_row[0]:
                    return {}
                rows = conn.execute(_LEDGER_ROWS_SQL, (pipeline_name,)).fetchall()
        except psycopg.Error as error:
            raise _wrap_db_error(error, "reading the migration ledger cdcsync.schema_migrations") from error
        return {row[0]: (row[1], row[2]) for row in rows}

    def apply_file(
        self, conn: psycopg.Connection[Any], pipeline_name: str, path: Path, parsed: ParsedMigration
    ) -> Applied | None:
        """The file and its ledger row in one transaction. Concurrent runs are serialised with an advisory lock; a
        file another run applied while this one waited is skipped (None)."""
        import psycopg

        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise CdcsyncError("apply_pending needs a connection without an open transaction")
        try:
            with conn.transaction():
                conn.execute(_LOCK_SQL, (f"cdcsync.migrate:{pipeline_name}",))
                exists = conn.execute(_LEDGER_EXISTS_SQL).fetchone()
                if exists and exists[0] and conn.execute(_LEDGER_ROW_SQL, (pipeline_name, path.name)).fetchone():
                    return None  # applied by a concurrent run while we waited for the lock
                if parsed.body.strip():
                    conn.execute(parsed.body)  # the file's SQL as is: no parameters, so several statements may run
                conn.execute(_LEDGER_INSERT_SQL, (pipeline_name, path.name, parsed.checksum))
                row = conn.execute(
                    "SELECT applied_at FROM cdcsync.schema_migrations WHERE pipeline = %s AND filename = %s",
                    (pipeline_name, path.name),
                ).fetchone()
        except psycopg.Error as error:
            raise _wrap_db_error(error, f"applying {path}") from error
        return Applied(row[0] if row else None)

    def connect(self, settings: Settings) -> AbstractContextManager[Any]:
        from cdcsync.db.postgres import connect_from_settings

        return connect_from_settings(settings)


POSTGRES = PostgresTarget()
