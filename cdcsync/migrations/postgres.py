"""Migrations: plan them from a pipeline (``cdcsync init``), track and apply them (``cdcsync migrate``), and
refuse to run against a database that lacks them (``cdcsync run``).

Files live in ``<migrations_dir>/<pipeline>/postgres/NNNN_<what>.sql``. Each generated file is::

    -- cdcsync migration 0002_add_sink_orders_copy.sql          <- header: leading "--" lines
    -- ...what it creates, how to apply it...
    -- checksum: sha256:<hex>                                    <- sha256 of the body, see below
    -- cdcsync-state: {"format":1,...}                          <- cumulative desired state after this file

    CREATE ...;                                                   <- body: the DDL, rendered from templates/
    -- cdcsync-ledger: ...                                        <- trailer: records the file in the ledger
    INSERT INTO "cdcsync"."schema_migrations" ... ON CONFLICT DO NOTHING;

The **body** is everything after the header up to the trailer (CRLF read as LF); its checksum is what the ledger
compares. The trailer exists so that ``psql -f FILE`` records the file exactly as ``cdcsync migrate`` does, and
it cannot be covered by the checksum it contains. Hand-written files (for destructive changes) need no header or
trailer; if they change what cdcsync manages they carry a ``-- cdcsync-state:`` line, which the refusal message
of ``init`` prints ready to paste.

``init`` diffs the pipeline against the state line of the last file that has one, writes only the next files
(one per change: a new sink, new columns of a sink), never rewrites a file, and refuses destructive changes.
Output is deterministic: sinks sorted by id, columns in the order the tables have them, no timestamps.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import cdcsync
from cdcsync.config.aggregate import resolve as resolve_aggregation
from cdcsync.config.pipeline import NO_COLUMNS, PostgresAggregateSink, internal_tables
from cdcsync.core import names
from cdcsync.core.errors import CdcsyncError, MigrationError, ServiceError
from cdcsync.migrations import aggregate_upgrade
from cdcsync.sql.render import comment_text, quote_ident, quote_qualified, render

if TYPE_CHECKING:
    import psycopg

    from cdcsync.config.pipeline import KafkaSource, Pipeline, SchemaLookup, SourceSchema, TopicSchemas
    from cdcsync.config.types import PgType

DATABASE = "postgres"
STATE_FORMAT = 1
INTERNAL_VERSION = 3
"""Version of the tables in the internal schema: 2 added ``truncations``, 3 ``dynamic_table_changes`` and its
trigger function. States without it are version 1."""
_INTERNAL_UPGRADES: tuple[tuple[int, str, str, str], ...] = (
    (2, "internal_truncations.sql.j2", names.TRUNCATIONS_TABLE, "the last truncate applied per sink"),
    (
        3,
        "internal_dynamic_tables.sql.j2",
        names.DYNAMIC_TABLE_CHANGES_TABLE,
        "the change counter of dynamic tables, and the trigger function bumping it",
    ),
)
"""(version, template, table, what it is) of each upgrade of the internal tables, in order."""
STATE_PREFIX = "-- cdcsync-state: "
CHECKSUM_PREFIX = "-- checksum: "
TRAILER_MARKER = "-- cdcsync-ledger:"

_FILENAME_RE = re.compile(r"^(?P<number>[0-9]{4,})_(?P<what>.+)\.sql$")
_HEADER_RE = re.compile(r"(?:--[^\n]*(?:\n|$))*")
_TRAILER_RE = re.compile(r"^" + re.escape(TRAILER_MARKER), re.MULTILINE)
_SLUG_RE = re.compile(r"[^a-z0-9]+")
_PSQL_APPLY = "psql --single-transaction -v ON_ERROR_STOP=1 -f"
_APPLY_BY_HAND = {DATABASE: _PSQL_APPLY, "clickhouse": "clickhouse-client --multiquery --queries-file"}
"""How a DBA applies a file of each database by hand (printed in headers and hints)."""

MigrationState = Literal["applied", "pending", "altered"]


# --------------------------------------------------------------------------------------------------------------
# Desired state
# --------------------------------------------------------------------------------------------------------------


def desired_state(pipeline: Pipeline) -> dict[str, Any]:
    """The Postgres objects ``pipeline`` needs, as a plain JSON-able dict.

    ::

        {"format": 1, "database": "postgres", "pipeline": "shop", "internal_schema": "cdcsync",
         "sinks": {"orders_mirror": {"schema": "app", "table": "orders",
                                     "columns": [{"name": "id", "type": "bigint"}, ...],
                                     "primary_key": ["id"], "delete_mode": "hard",
                                     "stage_table": "shop__orders_mirror__stage",
                                     "tombstone_table": "shop__orders_mirror__tombstones"}}}

    Columns keep the source's declaration order; types are canonical (``parse_pg_type(...).sql``);
    ``tombstone_table`` is null in soft delete mode. A ``postgres_aggregate`` sink's ``table`` is its landing
    table, and its entry has an ``aggregate`` key as well (see :func:`_aggregate_state`).

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
        }
        if isinstance(sink, PostgresAggregateSink):
            sinks[sink_id]["aggregate"] = _aggregate_state(pipeline.name, sink_id, sink, columns)
    state: dict[str, Any] = {
        "format": STATE_FORMAT,
        "database": DATABASE,
        "pipeline": pipeline.name,
        "internal_schema": names.INTERNAL_SCHEMA,
        "internal_version": INTERNAL_VERSION,
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
    sources = _sources_state(pipeline)
    if sources:
        state["sources"] = sources
    return state


def _sources_state(pipeline: Pipeline) -> dict[str, Any]:
    """The sources' schemas as ``init`` read them, for ``validate`` and ``run`` (:func:`recorded_schemas`)::

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


def recorded_schemas(migrations_dir: Path | str, pipeline_name: str) -> dict[str, tuple[str, SourceSchema]]:
    """(topic, schema) of each source whose schema the last migration's state records (see
    :func:`_sources_state`), by source id.

    This is how ``validate`` and ``run`` learn introspected columns without a registry or Kafka round trip:
    ``run`` refuses to start unless every migration is applied, so these are exactly the columns the applied
    migrations created."""
    from cdcsync.config.pipeline import SourceSchema

    last_path, last = _last_state(list_migration_files(migrations_dir, pipeline_name))
    recorded: dict[str, tuple[str, SourceSchema]] = {}
    for source_id, entry in ((last or {}).get("sources") or {}).items():
        key = entry.get("primary_key")
        schema = SourceSchema(
            columns=tuple((str(c["name"]), str(c["type"])) for c in entry.get("columns") or []),
            primary_key=tuple(key) if key else None,
            origin=str(last_path),
        )
        recorded[source_id] = (str(entry.get("topic")), schema)
    return recorded


def recorded_tables(
    recorded: dict[str, tuple[str, SourceSchema]], source_id: str, pattern: str
) -> dict[str, SourceSchema | str]:
    """The tables of ``topic_pattern`` source ``source_id`` that the migrations record (topic -> schema): those
    ``init`` found, as long as their topic still matches the pattern."""
    from cdcsync.config.routing import matches, table_source_id

    return {
        topic: schema
        for table_id, (topic, schema) in recorded.items()
        if table_id == table_source_id(source_id, topic) and matches(pattern, topic)
    }


def recorded_lookup(migrations_dir: Path | str) -> SchemaLookup:
    """A ``schema_for`` for :func:`~cdcsync.config.pipeline.load_pipeline`: the schemas recorded in the
    migrations. A source whose topic changed since has none (``init`` reads the new topic's)."""
    cache: dict[str, dict[str, tuple[str, SourceSchema]]] = {}

    def lookup(pipeline_name: str, source_id: str, source: KafkaSource) -> SourceSchema | TopicSchemas | str | None:
        if pipeline_name not in cache:
            cache[pipeline_name] = recorded_schemas(migrations_dir, pipeline_name)
        if source.topic_pattern is not None:
            return recorded_tables(cache[pipeline_name], source_id, source.topic_pattern)
        topic, schema = cache[pipeline_name].get(source_id, (None, None))
        if schema is None or topic != source.topic:
            directory = migrations_path(migrations_dir, pipeline_name)
            return NO_COLUMNS.replace("no migration", f"no migration in {directory}")
        return schema

    return lookup


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
         "functions": {"insert": "shop__revenue__agg_insert", "update": ..., "delete": ...}}

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
    }


def state_line(state: dict[str, Any]) -> str:
    """The machine-readable header line holding ``state`` (compact, sorted keys, ASCII only)."""
    return STATE_PREFIX + json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


# --------------------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------------------


def migrations_path(migrations_dir: Path | str, pipeline_name: str, database: str = DATABASE) -> Path:
    """``<migrations_dir>/<pipeline>/<database>`` (``postgres`` or ``clickhouse``)."""
    return Path(migrations_dir) / pipeline_name / database


def list_migration_files(migrations_dir: Path | str, pipeline_name: str, database: str = DATABASE) -> list[Path]:
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
        """True when the file ends with the ledger trailer, so applying it with psql records it too."""
        return bool(self.trailer)


def body_checksum(body: str) -> str:
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def parse_migration(text: str) -> ParsedMigration:
    """Split a migration file into header, body and trailer, and read its checksum and state lines."""
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
            if not _valid_state(loaded):
                state_error = (
                    f"the '{STATE_PREFIX.strip()}' line is not a cdcsync state of format {STATE_FORMAT} "
                    "(written by another cdcsync version, or edited?)"
                )
                continue
            state = loaded
    return ParsedMigration(header, body, trailer, declared, state, state_error)


def _valid_state(state: Any) -> bool:
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        return False
    sinks = state.get("sinks")
    if state.get("database") == "clickhouse":  # cdcsync.migrations.clickhouse.desired_state
        internal, keys = state.get("internal_database"), {"database", "table", "columns", "primary_key"}
    else:
        internal = state.get("internal_schema")
        keys = {"schema", "table", "columns", "primary_key", "delete_mode", "stage_table", "tombstone_table"}
    if not isinstance(internal, str) or not isinstance(sinks, dict):
        return False
    for sink in sinks.values():
        if not isinstance(sink, dict) or not keys <= set(sink) or not isinstance(sink["columns"], list):
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


# --------------------------------------------------------------------------------------------------------------
# Planning (cdcsync init)
# --------------------------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class _Change:
    kind: Literal[
        "init",
        "upgrade_internal",
        "add_sink",
        "add_columns",
        "add_dynamic_table",
        "record_sources",
        "upgrade_aggregate",
    ]
    sink_id: str = ""
    """The sink's id, or the dynamic table's (``add_dynamic_table``)."""
    columns: tuple[tuple[str, str], ...] = ()
    aggregates: tuple[str, ...] = ()
    """``upgrade_aggregate``: the aggregates whose running state is rebuilt."""
    from_version: int = INTERNAL_VERSION
    """``upgrade_internal``: the internal tables version the migrations had."""


def _slug(text: str) -> str:
    slug = _SLUG_RE.sub("_", text.lower()).strip("_")[:40].rstrip("_")
    return slug or "sink"


def _columns_by_name(sink: dict[str, Any]) -> dict[str, str]:
    return {column["name"]: column["type"] for column in sink["columns"]}


def _diff(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[_Change], list[str]]:
    """Additive changes from ``old`` to ``new``, and a description of every destructive one."""
    changes: list[_Change] = []
    destructive: list[str] = []
    old_sinks: dict[str, Any] = old.get("sinks", {})
    new_sinks: dict[str, Any] = new["sinks"]
    if old.get("internal_schema", names.INTERNAL_SCHEMA) != new["internal_schema"]:
        destructive.append(
            f"the internal schema changed from '{old.get('internal_schema')}' to '{new['internal_schema']}'"
        )
    old_version = old.get("internal_version", 1)
    if old_version < new["internal_version"]:
        changes.append(_Change("upgrade_internal", from_version=old_version))
    elif old_version > new["internal_version"]:
        destructive.append(
            f"the migrations were written by a newer cdcsync (internal tables version {old_version}); upgrade cdcsync"
        )
    for sink_id in sorted(old_sinks):
        if sink_id not in new_sinks:
            before = old_sinks[sink_id]
            mirror = quote_qualified(before["schema"], before["table"])
            destructive.append(
                f"sink '{sink_id}' was removed or renamed; its table {mirror} and its staging tables would have to "
                "be dropped or renamed"
            )
    for sink_id in sorted(new_sinks):
        after = new_sinks[sink_id]
        if sink_id not in old_sinks:
            changes.append(_Change("add_sink", sink_id))
            continue
        before = old_sinks[sink_id]
        where = f"sink '{sink_id}'"
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
        upgraded = aggregate_upgrade.changed_state(before.get("aggregate"), after.get("aggregate"))
        if upgraded:
            changes.append(_Change("upgrade_aggregate", sink_id, aggregates=upgraded))
        elif before.get("aggregate") != after.get("aggregate"):
            destructive.append(f"{where}: {_aggregate_change(before.get('aggregate'), after.get('aggregate'))}")
        if before["delete_mode"] != after["delete_mode"]:
            destructive.append(f"{where}: delete_mode changed from {before['delete_mode']} to {after['delete_mode']}")
        if before.get("stage_table") != after["stage_table"]:
            destructive.append(
                f"{where}: its staging table changed from {before.get('stage_table')!r} to {after['stage_table']!r}"
            )
        old_columns, new_columns = _columns_by_name(before), _columns_by_name(after)
        for name, old_type in old_columns.items():
            if name not in new_columns:
                destructive.append(f"{where}: column '{name}' was removed from its source")
            elif new_columns[name] != old_type:
                destructive.append(f"{where}: column '{name}' changed type from {old_type} to {new_columns[name]}")
        added = tuple((name, type_) for name, type_ in new_columns.items() if name not in old_columns)
        if added:
            changes.append(_Change("add_columns", sink_id, added))
    _diff_dynamic_tables(old.get("dynamic_tables", {}), new.get("dynamic_tables", {}), changes, destructive)
    if not changes and old.get("sources") != new.get("sources"):
        changes.append(_Change("record_sources"))  # e.g. a source feeding only ClickHouse sinks gained a column
    return changes, destructive


def _diff_dynamic_tables(
    old: dict[str, Any], new: dict[str, Any], changes: list[_Change], destructive: list[str]
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
            changes.append(_Change("add_dynamic_table", table_id))
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


def _apply_change(state: dict[str, Any], change: _Change, desired: dict[str, Any]) -> dict[str, Any]:
    """The cumulative state after ``change``: existing columns keep their table order, new ones go last."""
    after = json.loads(json.dumps(state))
    after.pop("sources", None)
    if desired.get("sources"):
        after["sources"] = desired["sources"]
    if change.kind == "upgrade_internal":
        after["internal_version"] = desired["internal_version"]
    elif change.kind == "add_sink":
        after["sinks"][change.sink_id] = desired["sinks"][change.sink_id]
    elif change.kind == "add_dynamic_table":
        after.setdefault("dynamic_tables", {})[change.sink_id] = desired["dynamic_tables"][change.sink_id]
    elif change.kind == "upgrade_aggregate":
        after["sinks"][change.sink_id]["aggregate"] = desired["sinks"][change.sink_id]["aggregate"]
    elif change.kind == "add_columns":
        after["sinks"][change.sink_id]["columns"].extend(
            {"name": name, "type": type_} for name, type_ in change.columns
        )
    return after


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


def _render_change(change: _Change, pipeline_name: str, state: dict[str, Any]) -> tuple[str, list[str], str]:
    """(filename stem without number, human lines, body SQL) for one change; ``state`` is the state after it."""
    internal_schema = state["internal_schema"]
    if change.kind == "init":
        parts = [render(f"{DATABASE}/internal_schema.sql.j2", schema=internal_schema)]
        what = [
            f"schema {quote_ident(internal_schema)} with tables "
            f"{quote_ident(names.SCHEMA_MIGRATIONS_TABLE)}, {quote_ident(names.BATCH_LEDGER_TABLE)}, "
            f"{quote_ident(names.DEAD_LETTERS_TABLE)}, {quote_ident(names.TRUNCATIONS_TABLE)}, "
            f"{quote_ident(names.DYNAMIC_TABLE_CHANGES_TABLE)}"
        ]
        for sink_id, sink in sorted(state["sinks"].items()):
            parts.append(_render_sink(pipeline_name, sink_id, sink, internal_schema))
            what.extend(_sink_what(sink_id, sink, internal_schema))
        for table_id, table in sorted(state.get("dynamic_tables", {}).items()):
            parts.append(_render_dynamic_table(pipeline_name, table_id, table, internal_schema))
            what.append(_dynamic_table_what(table_id, table))
        return "init", what, "\n".join(parts)
    if change.kind == "upgrade_internal":
        upgrades = [upgrade for upgrade in _INTERNAL_UPGRADES if upgrade[0] > change.from_version]
        body = "\n".join(render(f"{DATABASE}/{template}", schema=internal_schema) for _, template, _, _ in upgrades)
        what = [f"table {quote_qualified(internal_schema, table)}: {what}" for _, _, table, what in upgrades]
        return "upgrade_internal_tables", what, body
    if change.kind == "add_dynamic_table":
        table = state["dynamic_tables"][change.sink_id]
        body = _render_dynamic_table(pipeline_name, change.sink_id, table, internal_schema)
        return f"add_dynamic_table_{_slug(change.sink_id)}", [_dynamic_table_what(change.sink_id, table)], body
    if change.kind == "record_sources":
        what = [
            f"source '{source_id}': columns {', '.join(quote_ident(c['name']) for c in entry['columns'])}"
            for source_id, entry in sorted((state.get("sources") or {}).items())
        ]
        body = render(f"{DATABASE}/record_sources.sql.j2", sources=sorted(state.get("sources") or {}))
        return "record_source_schemas", what or ["no source schemas"], body
    sink = state["sinks"][change.sink_id]
    if change.kind == "upgrade_aggregate":
        values = {
            "pipeline": pipeline_name,
            "sink_id": change.sink_id,
            "sink": sink,
            "internal_schema": internal_schema,
            "upgrade": list(change.aggregates),
        }
        body = render(f"{DATABASE}/aggregate.sql.j2", **values)
        what = aggregate_upgrade.describe(sink, change.aggregates)
        return f"upgrade_aggregate_{_slug(change.sink_id)}", what, body
    if change.kind == "add_sink":
        body = _render_sink(pipeline_name, change.sink_id, sink, internal_schema)
        return f"add_sink_{_slug(change.sink_id)}", _sink_what(change.sink_id, sink, internal_schema), body
    columns = [{"name": name, "type": type_} for name, type_ in change.columns]
    body = render(f"{DATABASE}/add_columns.sql.j2", internal_schema=internal_schema, sink=sink, columns=columns)
    what = [
        f"columns of sink '{change.sink_id}', added to {quote_qualified(sink['schema'], sink['table'])} "
        f"and {quote_qualified(internal_schema, sink['stage_table'])}:",
        *(f"  {quote_ident(name)} {type_}" for name, type_ in change.columns),
    ]
    return f"add_columns_{_slug(change.sink_id)}", what, body


def _render_dynamic_table(pipeline_name: str, table_id: str, table: dict[str, Any], internal_schema: str) -> str:
    values = {"pipeline": pipeline_name, "table_id": table_id, "table": table, "internal_schema": internal_schema}
    return render(f"{DATABASE}/dynamic_table.sql.j2", **values)


def _dynamic_table_what(table_id: str, table: dict[str, Any]) -> str:
    return (
        f"dynamic table '{table_id}': table {quote_qualified(table['schema'], table['table'])} keyed by "
        f"{quote_ident(table['key_column'])} {table['key_type']}, with a trigger counting its changes"
    )


def _render_sink(pipeline_name: str, sink_id: str, sink: dict[str, Any], internal_schema: str) -> str:
    values = {"pipeline": pipeline_name, "sink_id": sink_id, "sink": sink, "internal_schema": internal_schema}
    sql = render(f"{DATABASE}/mirror_table.sql.j2", **values)
    if sink.get("aggregate"):
        sql += "\n" + render(f"{DATABASE}/aggregate.sql.j2", **values)
    return sql


def render_migration_file(
    filename: str,
    pipeline_name: str,
    what: list[str],
    body: str,
    state: dict[str, Any],
    *,
    verb: str = "creates",
    database: str = DATABASE,
) -> str:
    """The complete text of a generated migration file (header, body, ledger trailer) for ``database``."""
    section = "\n" + body.rstrip("\n") + "\n\n"
    checksum = body_checksum(section)
    header = [
        f"cdcsync migration {filename} for pipeline '{pipeline_name}' ({database})",
        f"generator: cdcsync {cdcsync.__version__}",
        f"{verb}:",
        *(f"  {line}" for line in what),
        "apply with: cdcsync migrate PIPELINE.yaml",
        f"        or: {_APPLY_BY_HAND[database]} {filename}",
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
            f"{database}/record_migration.sql.j2",
            internal_schema=state.get("internal_schema"),
            internal_database=state.get("internal_database"),
            pipeline=pipeline_name,
            filename=filename,
            checksum=checksum,
        )
    )
    return "\n".join(lines) + "\n" + section + trailer


def _last_state(files: list[Path]) -> tuple[Path | None, dict[str, Any] | None]:
    for path in reversed(files):
        parsed = read_migration(path)
        if parsed.state_error is not None:
            raise MigrationError(
                f"{path}: {parsed.state_error}",
                hint="restore the line as cdcsync wrote it (`git diff` shows what changed)",
            )
        if parsed.state is not None:
            return path, parsed.state
    return None, None


def plan(pipeline: Pipeline, migrations_dir: Path | str) -> list[PlannedMigration]:
    """The files ``init`` would write, without writing them; empty when the migrations are up to date.

    Raises :class:`MigrationError` for destructive changes, listing each and what to do instead.
    """
    directory = migrations_path(migrations_dir, pipeline.name)
    files = list_migration_files(migrations_dir, pipeline.name)
    desired = desired_state(pipeline)
    last_path, last = _last_state(files)
    if files and last is None:
        raise MigrationError(
            f"{directory} holds migrations, but none has a '{STATE_PREFIX.strip()}' line, so cdcsync cannot tell "
            "what they created",
            hint=f"add this line to the header of the last file and run init again:\n{state_line(desired)}",
        )
    changes: list[_Change]
    if last is None:
        changes, state = [_Change("init")], desired
    else:
        changes, destructive = _diff(last, desired)
        if destructive:
            next_number = _next_number(files)
            raise MigrationError(
                f"pipeline '{pipeline.name}' changed in ways cdcsync does not migrate automatically "
                f"(compared with {last_path}):\n" + "\n".join(f"  - {item}" for item in destructive),
                hint=(
                    "write that migration by hand (dropping or altering objects needs a DBA's decision), as "
                    f"{directory / f'{next_number:04d}_<what>.sql'}, and put this line among the comment lines at "
                    f"its top so the next `cdcsync init` starts from it:\n{state_line(desired)}"
                ),
            )
        state = last
    planned: list[PlannedMigration] = []
    number = _next_number(files)
    for change in changes:
        state = desired if change.kind == "init" else _apply_change(state, change, desired)
        stem, what, body = _render_change(change, pipeline.name, state)
        filename = f"{number:04d}_{stem}.sql"
        verb = {"add_columns": "adds", "upgrade_aggregate": "upgrades"}.get(change.kind, "creates")
        text = render_migration_file(filename, pipeline.name, what, body, state, verb=verb)
        planned.append(PlannedMigration(filename, directory / filename, what, text, state))
        number += 1
    return planned


def _next_number(files: list[Path]) -> int:
    if not files:
        return 1
    match = _FILENAME_RE.match(files[-1].name)
    assert match is not None
    return int(match.group("number")) + 1


def init(pipeline: Pipeline, migrations_dir: Path | str) -> InitResult:
    """Render the next migration files for ``pipeline`` (``cdcsync init``); existing files are never touched.

    With no change since the last migration it writes nothing (``result.up_to_date``). Destructive changes
    raise :class:`MigrationError` and nothing is written.
    """
    directory = migrations_path(migrations_dir, pipeline.name)
    planned = plan(pipeline, migrations_dir)
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


# --------------------------------------------------------------------------------------------------------------
# Ledger (cdcsync migrate, cdcsync run)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MigrationStatus:
    filename: str
    path: Path
    state: MigrationState
    checksum: str
    """Checksum of the file's body as it is on disk now."""
    applied_checksum: str | None = None
    """Checksum recorded in the ledger when the file was applied (None while pending)."""
    applied_at: datetime | None = None


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


def _ledger_rows(conn: psycopg.Connection[Any], pipeline_name: str) -> dict[str, tuple[str, datetime]]:
    with conn.transaction():
        exists_row = conn.execute(_LEDGER_EXISTS_SQL).fetchone()
        if not exists_row or not exists_row[0]:
            return {}
        rows = conn.execute(_LEDGER_ROWS_SQL, (pipeline_name,)).fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


def status(conn: psycopg.Connection[Any], pipeline_name: str, migrations_dir: Path | str) -> list[MigrationStatus]:
    """Every migration file of the pipeline, in order, with whether it is applied, pending or altered.

    A file is *altered* when its body's checksum differs from the one recorded when it was applied. A database
    without the ledger table yet has every file pending.
    """
    import psycopg

    files = list_migration_files(migrations_dir, pipeline_name)
    try:
        ledger = _ledger_rows(conn, pipeline_name)
    except psycopg.Error as error:
        raise _wrap_db_error(error, "reading the migration ledger cdcsync.schema_migrations") from error
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
    conn: psycopg.Connection[Any], pipeline_name: str, migrations_dir: Path | str
) -> list[MigrationStatus]:
    """Apply every pending migration in order, each in its own transaction together with its ledger row.

    Refuses (:class:`MigrationError`) when an applied file was altered. Concurrent runs are serialised with an
    advisory lock, and a file another run applied meanwhile is skipped. Returns the files it applied.
    """
    import psycopg

    statuses = status(conn, pipeline_name, migrations_dir)
    altered = [s for s in statuses if s.state == "altered"]
    if altered:
        raise _altered_error(altered[0]).add_context(f"applying migrations of pipeline '{pipeline_name}'")
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise CdcsyncError("apply_pending needs a connection without an open transaction")
    applied: list[MigrationStatus] = []
    for pending in (s for s in statuses if s.state == "pending"):
        parsed = read_migration(pending.path)
        checksum = parsed.checksum
        try:
            with conn.transaction():
                conn.execute(_LOCK_SQL, (f"cdcsync.migrate:{pipeline_name}",))
                ledger_exists = conn.execute(_LEDGER_EXISTS_SQL).fetchone()
                if ledger_exists and ledger_exists[0]:
                    existing = conn.execute(_LEDGER_ROW_SQL, (pipeline_name, pending.filename)).fetchone()
                    if existing is not None:
                        continue  # applied by a concurrent run while we waited for the lock
                if parsed.body.strip():
                    conn.execute(parsed.body)  # the file's SQL as is: no parameters, so several statements may run
                conn.execute(_LEDGER_INSERT_SQL, (pipeline_name, pending.filename, checksum))
                row = conn.execute(
                    "SELECT applied_at FROM cdcsync.schema_migrations WHERE pipeline = %s AND filename = %s",
                    (pipeline_name, pending.filename),
                ).fetchone()
        except psycopg.Error as error:
            raise _wrap_db_error(error, f"applying {pending.path}") from error
        applied.append(
            MigrationStatus(pending.filename, pending.path, "applied", checksum, checksum, row[0] if row else None)
        )
    return applied


def check_ready(
    conn: psycopg.Connection[Any],
    pipeline_name: str,
    migrations_dir: Path | str,
    *,
    pipeline_file: Path | str | None = None,
    pipeline: Pipeline | None = None,
) -> list[MigrationStatus]:
    """Stop ``cdcsync run`` before it starts when the database is not migrated.

    Raises :class:`MigrationError` (a user error, exit 2) naming the exact file when one is altered or pending,
    and when the pipeline has no migrations at all. When ``pipeline`` is given, also when it changed since its
    last migration (a new sink or column that ``cdcsync init`` has not rendered yet). Returns the statuses.
    """
    yaml_arg = str(pipeline_file) if pipeline_file else "PIPELINE.yaml"
    directory = migrations_path(migrations_dir, pipeline_name)
    statuses = status(conn, pipeline_name, migrations_dir)
    if not statuses:
        raise MigrationError(
            f"pipeline '{pipeline_name}' has no migrations in {directory}",
            hint=f"run: cdcsync init {yaml_arg}, review the files, then: cdcsync migrate {yaml_arg}",
        )
    for item in statuses:
        if item.state == "altered":
            raise _altered_error(item)
    if pipeline is not None:
        try:
            missing = plan(pipeline, migrations_dir)
        except MigrationError as error:
            raise error.add_context(f"pipeline '{pipeline_name}' differs from its migrations") from None
        if missing:
            raise MigrationError(
                f"pipeline '{pipeline_name}' changed since its last migration in {directory}: "
                + "; ".join(line for planned in missing for line in planned.what if not line.startswith(" ")),
                hint=f"run: cdcsync init {yaml_arg}, review the new files, then: cdcsync migrate {yaml_arg}",
            )
    pending = [item for item in statuses if item.state == "pending"]
    if pending:
        first = pending[0]
        others = f" (and {len(pending) - 1} more after it)" if len(pending) > 1 else ""
        how = f"run: cdcsync migrate {yaml_arg}"
        if read_migration(first.path).records_itself:
            how += f"\n  or apply each pending file in order with: {_PSQL_APPLY} {first.path}"
        raise MigrationError(f"migration {first.path} has not been applied to this database{others}", hint=how)
    return statuses


def pending_paths(statuses: Iterable[MigrationStatus]) -> list[Path]:
    """Paths of the pending files, in order (for the CLI)."""
    return [item.path for item in statuses if item.state == "pending"]
