"""ClickHouse migrations: ``migrations/<pipeline>/clickhouse/NNNN_<what>.sql`` beside the Postgres ones.

Same file format, checksum, state line, ``init`` and ``migrate`` as every target (:mod:`cdcsync.migrations.plan`,
:mod:`cdcsync.migrations.apply`), with a ClickHouse state (``"database": "clickhouse"``) and ClickHouse DDL from
``templates/clickhouse/``. Only pipelines with ``type: clickhouse`` sinks get these files and need a ClickHouse
server at all. The ledger is ``cdcsync.schema_migrations`` in ClickHouse (a database named like Postgres'
internal schema); the files end with an ``INSERT`` into it, so ``clickhouse-client --multiquery`` records a file
exactly as ``cdcsync migrate`` does.

ClickHouse DDL is not transactional: a file is applied statement by statement (every statement is idempotent,
``IF NOT EXISTS``), then recorded. A failure half-way leaves the file pending and re-running it is safe.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cdcsync.config import clickhouse_types
from cdcsync.core import names
from cdcsync.migrations.files import STATE_FORMAT, ParsedMigration, slug
from cdcsync.migrations.plan import diff_sinks
from cdcsync.migrations.target import Applied, Change
from cdcsync.sql.render import ch_quote_ident, ch_quote_qualified, render

if TYPE_CHECKING:
    from pathlib import Path

    from cdcsync.config.pipeline import ClickHouseSink, Pipeline
    from cdcsync.config.settings import Settings

DATABASE = "clickhouse"
INTERNAL_DATABASE = "cdcsync"
DEDUPLICATION_WINDOW = 1000
"""Default ``non_replicated_deduplication_window``: how many recent insert tokens a table remembers. A replay
re-sends at most one batch's inserts (one per partition), so this leaves a wide margin."""
_COMPARED_KEYS = ("database", "table", "primary_key", "partition_by", "ttl", "settings", "legacy_server", "view")
"""Keys of a sink's state that no migration changes in place."""


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
        "version_type": names.CLICKHOUSE_VERSION_TYPE,
        "legacy_server": sink.legacy_server,
        "view": sink.view_name,
    }


def table_columns(sink_state_: dict[str, Any]) -> list[dict[str, str]]:
    """Every column of the table, in order: business columns, then the ones cdcsync adds."""
    return [*sink_state_["columns"], *({"name": n, "type": t} for n, t in clickhouse_types.METADATA_COLUMNS)]


# --------------------------------------------------------------------------------------------------------------
# Changes (parts of the target's diff and render_change: cdcsync init)
# --------------------------------------------------------------------------------------------------------------


def _removed_sink(sink_id: str, before: dict[str, Any]) -> str:
    return (
        f"sink '{sink_id}' was removed or renamed; its table "
        f"{ch_quote_qualified(before['database'], before['table'])} would have to be dropped or renamed"
    )


def _changed_sink(sink_id: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [
        f"sink '{sink_id}': {key} changed from {before.get(key)!r} to {after.get(key)!r}"
        for key in _COMPARED_KEYS
        if before.get(key) != after.get(key)
    ]


def _upgraded_sink(sink_id: str, before: dict[str, Any], after: dict[str, Any]) -> list[Change]:
    """``_version`` of a table created before versions were commit positions (UInt64) is widened in place."""
    return [Change("upgrade_version", sink_id)] if before.get("version_type", "UInt64") != after["version_type"] else []


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


# --------------------------------------------------------------------------------------------------------------
# The target, with its ledger (cdcsync migrate, cdcsync run)
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


class ClickHouseTarget:
    """ClickHouse as a :class:`~cdcsync.migrations.target.Target`."""

    name = DATABASE
    label = "ClickHouse "
    apply_by_hand = "clickhouse-client --multiquery --queries-file"
    by_hand_note = (
        "(ClickHouse cannot change a table's ORDER BY or engine in place: create a new table and INSERT … SELECT)"
    )
    internal_key = "internal_database"
    sink_keys = frozenset({"database", "table", "primary_key"})

    def used_by(self, pipeline: Pipeline) -> bool:
        """Only pipelines with ClickHouse sinks need ClickHouse."""
        return bool(pipeline.clickhouse_sinks())

    def desired_state(self, pipeline: Pipeline) -> dict[str, Any]:
        """The ClickHouse objects ``pipeline`` needs, as a JSON-able dict (the state line of the files).

        ::

            {"format": 1, "database": "clickhouse", "pipeline": "shop", "internal_database": "cdcsync",
             "sinks": {"orders_ch": {"database": "default", "table": "orders", "primary_key": ["id"],
                                     "columns": [{"name": "id", "type": "Int64"}, ...],   # business columns only
                                     "partition_by": null, "ttl": null, "legacy_server": false, "view": null,
                                     "settings": {"non_replicated_deduplication_window": 1000},
                                     "version_type": "UInt128"}}}
        """
        sinks: dict[str, Any] = {}
        for sink_id, sink in sorted(pipeline.clickhouse_sinks().items()):
            sinks[sink_id] = sink_state(pipeline, sink)
        return {
            "format": STATE_FORMAT,
            "database": DATABASE,
            "pipeline": pipeline.name,
            "internal_database": INTERNAL_DATABASE,
            "sinks": sinks,
        }

    def diff(self, old: dict[str, Any], new: dict[str, Any]) -> tuple[list[Change], list[str]]:
        """Additive changes (new sinks, new columns) and descriptions of destructive ones."""
        return diff_sinks(
            old["sinks"], new["sinks"], removed=_removed_sink, changed=_changed_sink, upgraded=_upgraded_sink
        )

    def render_change(self, change: Change, pipeline_name: str, state: dict[str, Any]) -> tuple[str, list[str], str]:
        """(filename stem without number, human lines, body SQL) for one change; ``state`` is the state after it."""
        if change.kind == "init":
            body = "\n".join(
                [render(f"{DATABASE}/internal.sql.j2", internal_database=state["internal_database"])]
                + [_render_sink(sink) for _, sink in sorted(state["sinks"].items())]
            )
            what = [f"database {ch_quote_ident(state['internal_database'])} with table `schema_migrations`"]
            for sink_id, sink in sorted(state["sinks"].items()):
                what.extend(_sink_what(sink_id, sink))
            return "init", what, body
        sink = state["sinks"][change.sink_id]
        if change.kind == "add_sink":
            return f"add_sink_{slug(change.sink_id)}", _sink_what(change.sink_id, sink), _render_sink(sink)
        if change.kind == "upgrade_version":
            table = ch_quote_qualified(sink["database"], sink["table"])
            what = [
                f"sink '{change.sink_id}': `_version` UInt64 -> {sink['version_type']} in {table} "
                "(source commit order; values kept)"
            ]
            return (
                f"upgrade_versions_{slug(change.sink_id)}",
                what,
                render(f"{DATABASE}/upgrade_version.sql.j2", sink=sink),
            )
        assert change.kind == "add_columns", f"no ClickHouse change of kind {change.kind}"
        names = [column["name"] for column in sink["columns"]]
        after = names[-len(change.columns) - 1 : -1]  # each new column goes after the one before it
        placed = [{"name": n, "type": t, "after": a} for (n, t), a in zip(change.columns, after, strict=True)]
        body = render(f"{DATABASE}/add_columns.sql.j2", sink=sink, columns=placed)
        what = [
            f"columns of sink '{change.sink_id}', added to {ch_quote_qualified(sink['database'], sink['table'])}:",
            *(f"  {ch_quote_ident(n)} {t}" for n, t in change.columns),
        ]
        return f"add_columns_{slug(change.sink_id)}", what, body

    def read_ledger(self, client: Any, pipeline_name: str) -> dict[str, tuple[str, datetime | None]]:
        from cdcsync.db.clickhouse import wrap_clickhouse_error

        values = {"internal_database": INTERNAL_DATABASE}
        try:
            if not int(client.command(render(f"{DATABASE}/runtime/ledger_exists.sql.j2", **values))):
                return {}
            rows = client.query(
                render(f"{DATABASE}/runtime/ledger_rows.sql.j2", **values), parameters={"pipeline": pipeline_name}
            ).result_rows
        except Exception as error:
            raise wrap_clickhouse_error(
                error, "reading the ClickHouse migration ledger cdcsync.schema_migrations"
            ) from None
        return {row[0]: (row[1], row[2]) for row in rows}

    def apply_file(self, client: Any, pipeline_name: str, path: Path, parsed: ParsedMigration) -> Applied:
        """Statement by statement, then the ledger row (no transactions in ClickHouse; the statements are
        idempotent, so a file that failed half-way is applied again from the start)."""
        from cdcsync.db.clickhouse import wrap_clickhouse_error

        try:
            for statement in split_statements(parsed.body):
                client.command(statement)
            client.command(
                render(f"{DATABASE}/runtime/ledger_record.sql.j2", internal_database=INTERNAL_DATABASE),
                parameters={"pipeline": pipeline_name, "filename": path.name, "checksum": parsed.checksum},
            )
        except Exception as error:
            raise wrap_clickhouse_error(error, f"applying {path}", user_error=True) from None
        return Applied(None)

    def connect(self, settings: Settings) -> AbstractContextManager[Any]:
        from cdcsync.db.clickhouse import connect_from_settings

        client: AbstractContextManager[Any] = connect_from_settings(settings)
        return client


CLICKHOUSE = ClickHouseTarget()
