"""Delta Lake migrations: ``migrations/<pipeline>/delta/NNNN_<what>.sql`` beside the Postgres and ClickHouse ones.

Same file format, checksum, state line, ``init`` and ``migrate`` as every target (:mod:`cdcsync.migrations.plan`,
:mod:`cdcsync.migrations.apply`), with Spark SQL from ``templates/delta/``. Only pipelines with ``type: delta``
sinks get these files.

Spark SQL has no table cdcsync could keep a ledger in wherever the tables live (a path-based table has no catalog,
and Spark's default catalog forgets its tables when the session ends), so the ledger of these files is the
Postgres one every pipeline already has (``cdcsync.schema_migrations``), their rows named ``delta/<file>``. The
statements run on the Spark session ``cdcsync migrate`` starts; each is idempotent (``IF NOT EXISTS``; an added
column that is already there is skipped), so a file that failed half-way is applied again from the start.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import MigrationError
from cdcsync.migrations.clickhouse import split_statements
from cdcsync.migrations.files import STATE_FORMAT, ParsedMigration, slug
from cdcsync.migrations.plan import diff_sinks
from cdcsync.migrations.target import Applied, Change
from cdcsync.sql.render import delta_table_ref, render, spark_quote_ident

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from cdcsync.config.pipeline import DeltaSink, Pipeline
    from cdcsync.config.settings import Settings

DATABASE = "delta"
LEDGER_PREFIX = "delta/"
"""How the Postgres ledger names these files: ``delta/0001_init.sql``."""
TOMBSTONE_SUFFIX = "__cdcsync_tombstones"
"""A hard-delete mirror's tombstone table sits beside it: the path or table name plus this."""
METADATA_COLUMNS: tuple[tuple[str, str], ...] = (("_cdc_op", "string"), ("_cdc_version", "decimal(38,0)"))
TS_COLUMN = ("_cdc_ts", "timestamp")
HISTORY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_valid_from", "timestamp"),
    ("_valid_to", "timestamp"),
    ("_is_current", "boolean"),
)
_COMPARED_KEYS = ("location", "primary_key", "partition_by", "mode", "delete_mode", "properties")
"""Keys of a sink's state that no migration changes in place."""


def location(sink: DeltaSink) -> dict[str, str]:
    return {"path": sink.path} if sink.path is not None else {"table": sink.table or ""}


def tombstone_location(where: dict[str, str]) -> dict[str, str]:
    """The tombstone table of a hard-delete mirror at ``where``: a sibling path, or a table of the same database."""
    return {key: value + TOMBSTONE_SUFFIX for key, value in where.items()}


def sink_state(pipeline: Pipeline, sink: DeltaSink) -> dict[str, Any]:
    """One sink's entry of the state: the business columns with their Spark types, the layout, the properties."""
    properties = {"delta.enableChangeDataFeed": "true" if sink.change_data_feed else "false", **sink.properties}
    return {
        "location": location(sink),
        "columns": [{"name": name, "type": t.spark_type} for name, t in pipeline.columns_of(sink.from_).items()],
        "primary_key": list(pipeline.sink_primary_key(sink)),
        "partition_by": list(sink.partition_by),
        "mode": sink.mode,
        "delete_mode": sink.delete_mode if sink.mode == "mirror" else None,
        "properties": dict(sorted(properties.items())),
    }


def added_columns(state: dict[str, Any]) -> list[tuple[str, str]]:
    """The columns cdcsync adds after the business columns, by mode."""
    added = [*METADATA_COLUMNS, TS_COLUMN]
    if state["mode"] == "history":
        return [*added, *HISTORY_COLUMNS]
    if state["delete_mode"] == "soft":
        added.append(("_cdc_deleted", "boolean"))
    return added


def table_columns(state: dict[str, Any]) -> list[dict[str, str]]:
    """Every column of the table, in order: business columns, then cdcsync's."""
    return [*state["columns"], *({"name": n, "type": t} for n, t in added_columns(state))]


def tombstone_table(state: dict[str, Any]) -> dict[str, Any] | None:
    """The tombstone table of a hard-delete mirror (key columns and the delete's version); None otherwise."""
    if state["mode"] != "mirror" or state["delete_mode"] != "hard":
        return None
    types = {c["name"]: c["type"] for c in state["columns"]}
    columns = [{"name": k, "type": types[k]} for k in state["primary_key"]]
    return {
        "location": tombstone_location(state["location"]),
        "columns": [*columns, {"name": "_cdc_version", "type": "decimal(38,0)"}],
    }


def _render_sink(sink: dict[str, Any]) -> str:
    return render(
        f"{DATABASE}/table.sql.j2", sink={**sink, "columns": table_columns(sink), "tombstones": tombstone_table(sink)}
    )


def _sink_what(sink_id: str, sink: dict[str, Any]) -> list[str]:
    key = ", ".join(spark_quote_ident(c) for c in sink["primary_key"])
    kind = "history (SCD type 2)" if sink["mode"] == "history" else f"mirror, {sink['delete_mode']} deletes"
    lines = [f"sink '{sink_id}': Delta table {delta_table_ref(sink['location'])}, {kind}, key ({key})"]
    tombstones = tombstone_table(sink)
    if tombstones is not None:
        lines.append(f"  tombstones {delta_table_ref(tombstones['location'])}: versions of deleted keys")
    return lines


def _removed_sink(sink_id: str, before: dict[str, Any]) -> str:
    return f"sink '{sink_id}' was removed or renamed; its table {delta_table_ref(before['location'])} would be orphaned"


def _changed_sink(sink_id: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [
        f"sink '{sink_id}': {key} changed from {before.get(key)!r} to {after.get(key)!r}"
        for key in _COMPARED_KEYS
        if before.get(key) != after.get(key)
    ]


@dataclass
class DeltaConnection:
    """What applying a file needs: the Postgres ledger, and the Spark session (only to apply, not to list)."""

    postgres: Any
    spark: Any | None


class DeltaTarget:
    """Delta Lake as a :class:`~cdcsync.migrations.target.Target`."""

    name = DATABASE
    label = "Delta "
    apply_by_hand = "spark-sql (with the Delta extension, see docs/delta.md) -f"
    by_hand_note = (
        "(a Delta table's key, partitioning or mode cannot change in place: write a new table from the old one, "
        "e.g. CREATE TABLE … AS SELECT, and point the sink at it)"
    )
    internal_key = "ledger"
    sink_keys = frozenset({"location", "primary_key", "mode"})

    def used_by(self, pipeline: Pipeline) -> bool:
        return bool(pipeline.delta_sinks())

    def desired_state(self, pipeline: Pipeline) -> dict[str, Any]:
        """The Delta tables ``pipeline`` needs (the state line of the files)::

        {"format": 1, "database": "delta", "pipeline": "shop", "ledger": "postgres",
         "sinks": {"orders_lake": {"location": {"path": "/lake/orders"}, "primary_key": ["id"],
                                   "columns": [{"name": "id", "type": "bigint"}, ...],  # business columns
                                   "partition_by": [], "mode": "mirror", "delete_mode": "hard",
                                   "properties": {"delta.enableChangeDataFeed": "true"}}}}
        """
        sinks = {sink_id: sink_state(pipeline, sink) for sink_id, sink in sorted(pipeline.delta_sinks().items())}
        return {
            "format": STATE_FORMAT,
            "database": DATABASE,
            "pipeline": pipeline.name,
            "ledger": "postgres",
            "sinks": sinks,
        }

    def diff(self, old: dict[str, Any], new: dict[str, Any]) -> tuple[list[Change], list[str]]:
        return diff_sinks(old["sinks"], new["sinks"], removed=_removed_sink, changed=_changed_sink)

    def render_change(self, change: Change, pipeline_name: str, state: dict[str, Any]) -> tuple[str, list[str], str]:
        if change.kind == "init":
            what = [line for sink_id, sink in sorted(state["sinks"].items()) for line in _sink_what(sink_id, sink)]
            body = "\n".join(_render_sink(sink) for _, sink in sorted(state["sinks"].items()))
            return "init", what, body
        sink = state["sinks"][change.sink_id]
        if change.kind == "add_sink":
            return f"add_sink_{slug(change.sink_id)}", _sink_what(change.sink_id, sink), _render_sink(sink)
        assert change.kind == "add_columns", f"no Delta change of kind {change.kind}"
        columns = [{"name": n, "type": t} for n, t in change.columns]
        what = [
            f"columns of sink '{change.sink_id}', added to {delta_table_ref(sink['location'])}:",
            *(f"  {spark_quote_ident(n)} {t}" for n, t in change.columns),
        ]
        body = render(f"{DATABASE}/add_columns.sql.j2", sink=sink, columns=columns)
        return f"add_columns_{slug(change.sink_id)}", what, body

    def connect(self, settings: Settings) -> AbstractContextManager[Any]:
        return _connect(settings)

    def read_ledger(self, connection: DeltaConnection, pipeline_name: str) -> dict[str, tuple[str, datetime | None]]:
        from cdcsync.migrations.postgres import POSTGRES

        rows = POSTGRES.read_ledger(connection.postgres, pipeline_name)
        return {name.removeprefix(LEDGER_PREFIX): row for name, row in rows.items() if name.startswith(LEDGER_PREFIX)}

    def apply_file(
        self, connection: DeltaConnection, pipeline_name: str, path: Path, parsed: ParsedMigration
    ) -> Applied:
        """Statement by statement on Spark, then the Postgres ledger row."""
        import psycopg

        if connection.spark is None:
            raise MigrationError(
                f"applying {path}: Delta migrations run on a Spark session, and none is active",
                hint="apply them with `cdcsync migrate`, which starts one",
            )
        for statement in split_statements(parsed.body):
            try:
                connection.spark.sql(statement)
            except Exception as error:
                if _already_added(error):
                    continue
                message = str(error).strip().splitlines()[0][:400] if str(error).strip() else type(error).__name__
                raise MigrationError(f"applying {path}: {message}") from None
        try:
            with connection.postgres.transaction():
                row = connection.postgres.execute(
                    render("postgres/runtime/migration_record.sql.j2"),
                    {"pipeline": pipeline_name, "filename": LEDGER_PREFIX + path.name, "checksum": parsed.checksum},
                ).fetchone()
        except psycopg.Error as error:
            raise MigrationError(f"recording {path} in cdcsync.schema_migrations: {error}") from None
        return Applied(row[0] if row else None)


def _already_added(error: Exception) -> bool:
    """An ``ADD COLUMNS`` of a column the table has (a file applied half-way before): Spark's own error class."""
    condition = getattr(error, "getCondition", lambda: None)() or getattr(error, "getErrorClass", lambda: None)()
    return condition in ("FIELD_ALREADY_EXISTS", "DELTA_DUPLICATE_COLUMNS_FOUND", "FIELDS_ALREADY_EXISTS")


@contextmanager
def _connect(settings: Settings) -> Iterator[DeltaConnection]:
    from cdcsync.db.postgres import connect_from_settings

    with connect_from_settings(settings) as conn:
        yield DeltaConnection(conn, _running_session())


def _running_session() -> Any:
    """The Spark session this process runs (``cdcsync migrate`` starts one first; ``schema_evolution: auto`` runs
    inside ``cdcsync run``'s, on a thread of its own where none is active); None when Spark is not running."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None and SparkContext._active_spark_context is not None:
        session = SparkSession.builder.getOrCreate()  # the running context's session, with its configuration
    return session


DELTA = DeltaTarget()
