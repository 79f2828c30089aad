"""ClickHouse sink: versioned rows in a ``ReplacingMergeTree(_version, _is_deleted)`` table, exactly-once effects.

How a micro-batch lands (orchestrated by :mod:`cdcsync.engine.batch`, beside the Postgres sinks):

1. :meth:`ClickHouseTableSink.prepare`: the driver looks the batch up in Postgres' ``cdcsync.batch_ledger`` (the
   same ledger as the Postgres sinks); a batch recorded there is skipped without touching ClickHouse.
2. :class:`ClickHouseWriter`: in the same executor pass that stages the Postgres sinks, each task collapses its
   partition to the newest change per key and inserts it as **one Arrow insert** through clickhouse-connect, rows
   carrying ``_version`` (= ``_cdc_version``) and ``_is_deleted`` (1 for a delete, with the delete's version).
   The insert has an ``insert_deduplication_token`` built from the pipeline, the sink, the batch id and the Kafka
   topic, partition and offset range the task read. Spark replays a batch with the offsets recorded in its
   checkpoint, so a replayed or retried task sends the same rows under the same token, and the table (created
   with ``non_replicated_deduplication_window``) drops them: a replay adds no rows.
3. :meth:`ClickHouseTableSink.merge`: the driver records the batch in the ledger. A crash between 2 and 3 replays
   the batch; step 2's tokens make that harmless.

ReplacingMergeTree replaces rows only within a partition. When ``partition_by`` reads a non-key column, a delete
(whose decoded row holds only the key under ``REPLICA IDENTITY DEFAULT``, so it computes another partition) or an
update that changes the partition lands away from the key's older rows: ``FINAL`` still shows the newest version
(it compares versions across partitions), but ``OPTIMIZE ... FINAL CLEANUP`` would drop the delete row alone and
leave the older row visible again. So after each insert such a sink marks the key's live older rows in every other
partition deleted (``templates/clickhouse/runtime/partition_markers.sql.j2``), reading their partition values from
ClickHouse itself, which knows them whatever the replica identity.

``append_only_mode: false`` (Streamling's other mode) inserts only upserts and turns deletes into a lightweight
``DELETE`` of each deleted key up to the delete's version, so a newer row of the key is never removed.

Reading: ``SELECT … FROM t FINAL WHERE NOT _is_deleted`` (or the view, on servers older than 23.2).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync import migrations
from cdcsync.config import clickhouse_types
from cdcsync.core.errors import MigrationError, SinkError
from cdcsync.core.reports import ReportedFailure, write_failed
from cdcsync.db.clickhouse import connect, connect_from_settings, first_line, is_retriable, wrap_clickhouse_error
from cdcsync.db.ledger import LedgeredSink
from cdcsync.migrations.clickhouse import sink_state, table_columns
from cdcsync.sql.render import render

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa

    from cdcsync.config.pipeline import ClickHouseSink, Pipeline
    from cdcsync.config.settings import Settings


@dataclass(frozen=True)
class ClickHouseWriter:
    """Executor side: collapse a partition in Arrow and insert it into ClickHouse (picklable)."""

    url: str
    compression: str
    database: str
    table: str
    primary_key: tuple[str, ...]
    columns: tuple[str, ...]
    append_only: bool
    token_prefix: str
    """``<pipeline>/<sink>/<checkpoint id>/<batch id>``; the task adds the Kafka range it read."""
    delete_sql: str
    key_types: tuple[str, ...]
    markers_sql: str
    """Empty unless the partition depends on non-key columns (see the module docstring)."""
    batch_id: int
    sink_label: str

    def stage(self, table: pa.Table) -> int:
        """Insert the newest change per key of ``table`` (one task's decoded partition); returns rows written."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from cdcsync.sinks.postgres import newest_per_key

        if table.num_rows == 0:
            return 0
        token = deduplication_token(self.token_prefix, table)  # from every row read, so it names the whole range
        # A source TRUNCATE (op 't', a row without key) is not applied to ClickHouse tables yet; see docs/clickhouse.md.
        table = table.filter(pc.not_equal(table.column("_cdc_op"), "t"))
        if table.num_rows == 0:
            return 0
        table = newest_per_key(table, self.primary_key)
        rows = to_clickhouse_arrow(table, self.columns)
        # Only updates and deletes can leave older rows elsewhere: an insert follows a delete that marked them.
        may_move = pc.is_in(table.column("_cdc_op"), pa.array(["u", "d"]))
        doing = (
            f"{self.sink_label}: inserting batch {self.batch_id} ({token.rsplit('/', 1)[-1]}) "
            f"into {self.database}.{self.table}"
        )
        try:
            # raw_query sends bound parameters (a batch's keys) in the request body with this; in the URL, as
            # command() sends them, a large batch is refused (HTTP 414).
            client = connect(self.url, compression=self.compression, form_encode_query_params=True)
        except Exception as error:
            raise _task_error(doing, error) from None
        try:
            if not self.append_only:
                return self._upsert_and_delete(client, rows, may_move, token)
            client.insert_arrow(self.table, rows, database=self.database, settings=_token_settings(token))
            self._mark_other_partitions(client, rows.filter(may_move))
        except Exception as error:
            raise _task_error(doing, error) from None
        finally:
            client.close()
        return rows.num_rows

    def _upsert_and_delete(self, client: Any, rows: pa.Table, may_move: pa.ChunkedArray, token: str) -> int:
        import pyarrow.compute as pc

        deleted = pc.equal(rows.column(clickhouse_types.DELETED_COLUMN), 1)
        upserts = rows.filter(pc.invert(deleted))
        deletes = rows.filter(deleted)
        if upserts.num_rows:
            client.insert_arrow(self.table, upserts, database=self.database, settings=_token_settings(token))
            self._mark_other_partitions(client, rows.filter(pc.and_(pc.invert(deleted), may_move)))
        if deletes.num_rows:
            keys = list(zip(*(deletes.column(k).to_pylist() for k in self.primary_key), strict=True))
            versions = [int(v) for v in deletes.column(clickhouse_types.VERSION_COLUMN).to_pylist()]
            client.command(self.delete_sql, parameters={"keys": keys, "versions": versions})
        return rows.num_rows

    def _mark_other_partitions(self, client: Any, rows: pa.Table) -> None:
        """Delete markers for the keys of ``rows`` (just inserted) in the other partitions holding older rows.

        A replayed task inserts the same markers again; equal rows of a ReplacingMergeTree collapse, so that is
        harmless.
        """
        if not self.markers_sql or rows.num_rows == 0:
            return
        keys = list(zip(*(rows.column(k).to_pylist() for k in self.primary_key), strict=True))
        versions = [int(v) for v in rows.column(clickhouse_types.VERSION_COLUMN).to_pylist()]
        parameters = {"keys": keys, "rows": [(*key, version) for key, version in zip(keys, versions, strict=True)]}
        client.raw_query(self.markers_sql, parameters=parameters)


def _task_error(doing: str, error: BaseException) -> ReportedFailure:
    return ReportedFailure(write_failed(f"{doing}: {first_line(error)}", retriable=is_retriable(error)))


def _token_settings(token: str) -> dict[str, Any]:
    return {"insert_deduplication_token": token}


def deduplication_token(prefix: str, table: pa.Table) -> str:
    """``prefix`` plus the Kafka topic/partition/offset range(s) of ``table``'s rows: the same for a replay.

    A task reads one Kafka partition's offset range, which Spark fixes in the checkpoint's offset log before the
    batch runs; dead letters are dropped deterministically, so the decoded rows (and their range) repeat exactly.
    """
    grouped = table.group_by(["_cdc_topic", "_cdc_partition"]).aggregate(
        [("_cdc_offset", "min"), ("_cdc_offset", "max"), ("_cdc_offset", "count")]
    )
    ranges = sorted(
        f"{row['_cdc_topic']}-{row['_cdc_partition']}@{row['_cdc_offset_min']}-{row['_cdc_offset_max']}"
        f"#{row['_cdc_offset_count']}"
        for row in grouped.to_pylist()
    )
    readable = ranges[0] if len(ranges) == 1 else hashlib.sha256("|".join(ranges).encode()).hexdigest()[:16]
    return f"{prefix}/{readable}"


def to_clickhouse_arrow(table: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """The business columns plus ``_version`` (UInt128: ``_cdc_version``, never negative; Arrow has no unsigned
    128-bit type, ClickHouse converts the decimal on insert), ``_is_deleted`` (UInt8) and ``_cdc_ts``, ready to
    insert."""
    import pyarrow as pa
    import pyarrow.compute as pc

    deleted = pc.equal(table.column("_cdc_op"), "d").cast(pa.uint8())
    arrays = [table.column(name) for name in columns]
    version = table.column("_cdc_version").cast(pa.decimal128(38, 0))
    arrays += [version, deleted, table.column("_cdc_ts")]
    names = [*columns, clickhouse_types.VERSION_COLUMN, clickhouse_types.DELETED_COLUMN, clickhouse_types.TS_COLUMN]
    return pa.Table.from_arrays(arrays, names=names)


class ClickHouseTableSink(LedgeredSink):
    """Driver side of one ``type: clickhouse`` sink; the same protocol as the Postgres sinks' driver side."""

    def __init__(self, pipeline: Pipeline, sink_id: str, sink: ClickHouseSink, dsn: str, clickhouse_url: str) -> None:
        super().__init__(pipeline, sink_id, dsn)
        self.sink = sink
        self.clickhouse_url = clickhouse_url
        self.state = sink_state(pipeline, sink)
        self.columns = tuple(pipeline.columns_of(sink.from_))
        self.primary_key = tuple(self.state["primary_key"])
        types = {c["name"]: c["type"] for c in self.state["columns"]}
        self.key_types = tuple(types[k] for k in self.primary_key)
        self._delete_sql = render(
            "clickhouse/runtime/delete_keys.sql.j2",
            target=(sink.database, sink.table),
            primary_key=self.primary_key,
            key_types=self.key_types,
        )
        self._markers_sql = ""
        if sink.partition_by and clickhouse_types.partition_columns(sink.partition_by, self.columns) - set(
            self.primary_key
        ):
            self._markers_sql = render(
                "clickhouse/runtime/partition_markers.sql.j2",
                target=(sink.database, sink.table),
                columns=self.columns,
                primary_key=self.primary_key,
                key_types=self.key_types,
            )
        self._rows_staged = 0

    @property
    def target_name(self) -> str:
        return f"{self.sink.database}.{self.sink.table}"

    def prepare(self, ledger_key: dict[str, Any]) -> bool:
        """False when the Postgres ledger already holds this batch (it landed before)."""
        import psycopg

        from cdcsync.db.retry import classify_postgres_error

        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                return conn.execute(self._ledger_lookup_sql, ledger_key).fetchone() is None
        except psycopg.Error as error:
            raise SinkError(
                f"preparing batch {ledger_key['batch_id']}: {first_line(error)}",
                retriable=classify_postgres_error(error),
            ).add_context(self.label) from None

    def stage_writer(self, batch_id: int, checkpoint_id: str = "") -> ClickHouseWriter:
        return ClickHouseWriter(
            url=self.clickhouse_url,
            compression=self.sink.compression,
            database=self.sink.database,
            table=self.sink.table,
            primary_key=self.primary_key,
            columns=self.columns,
            append_only=self.sink.append_only_mode,
            token_prefix=f"cdcsync/{self.pipeline.name}/{self.sink_id}/{checkpoint_id}/{batch_id}",
            delete_sql=self._delete_sql,
            key_types=self.key_types,
            markers_sql=self._markers_sql,
            batch_id=batch_id,
            sink_label=self.label,
        )

    def merge(self, ledger_key: dict[str, Any], rows_staged: int = 0) -> int | None:
        """Record the batch (its inserts are done) in the ledger; None if another attempt recorded it first."""
        import psycopg

        from cdcsync.db.retry import classify_postgres_error

        try:
            with psycopg.connect(self.dsn) as conn, conn.transaction():
                if conn.execute(self._ledger_record_sql, ledger_key).rowcount == 0:
                    return None
                conn.execute(self._ledger_rows_sql, {**ledger_key, "rows_written": rows_staged})
        except psycopg.Error as error:
            raise SinkError(
                f"recording batch {ledger_key['batch_id']} in the ledger: {first_line(error)}",
                retriable=classify_postgres_error(error),
            ).add_context(self.label) from None
        return rows_staged

    # -- startup check ----------------------------------------------------------------------------------------
    def check_table(self, client: Any) -> None:
        """Refuse (exit 2) when the table ClickHouse has disagrees with the pipeline; name both sides."""
        check_table(client, self.sink_id, self.state)


def _sorting_key(text: str) -> list[str]:
    inner = text.strip()
    if inner.startswith("(") and inner.endswith(")"):
        inner = inner[1:-1]
    return [part.strip().strip("`") for part in inner.split(",") if part.strip()]


def check_table(client: Any, sink_id: str, state: dict[str, Any]) -> None:
    """Compare the table in ClickHouse (``system.tables``/``system.columns``) with what the pipeline needs.

    Extra columns in the table are allowed (a DBA may add some with defaults); a missing column, a column of
    another type, another ``ORDER BY`` or an engine that is not a ``ReplacingMergeTree`` are refused.
    """
    database, table = state["database"], state["table"]
    where = f"sink '{sink_id}': table {database}.{table}"
    values = {"database": database, "table": table}
    try:
        described = client.query(render("clickhouse/runtime/describe_table.sql.j2"), parameters=values).result_rows
        columns = client.query(render("clickhouse/runtime/describe_columns.sql.j2"), parameters=values).result_rows
    except Exception as error:
        raise wrap_clickhouse_error(error, f"{where}: reading its definition") from None
    hint = (
        "the table was created or changed outside this pipeline's migrations: fix it (or drop it and run "
        "`cdcsync migrate`), or change the pipeline to match it"
    )
    if not described:
        raise MigrationError(f"{where} does not exist in ClickHouse", hint="run: cdcsync migrate PIPELINE.yaml")
    engine, sorting_key = described[0]
    problems = []
    if not str(engine).endswith("ReplacingMergeTree"):
        problems.append(f"its engine is {engine}, the pipeline needs ReplacingMergeTree")
    actual_key = _sorting_key(str(sorting_key))
    if actual_key != list(state["primary_key"]):
        wanted = ", ".join(state["primary_key"])
        problems.append(f"it is ORDER BY ({', '.join(actual_key)}), the pipeline's primary key is ({wanted})")
    actual = {str(name): str(type_) for name, type_ in columns}
    for column in table_columns(state):
        if column["name"] not in actual:
            problems.append(f"it has no column {column['name']} (the pipeline needs {column['type']})")
        elif actual[column["name"]] != column["type"]:
            problems.append(
                f"its column {column['name']} is {actual[column['name']]}, the pipeline needs {column['type']}"
            )
    if problems:
        raise MigrationError(f"{where} does not match the pipeline: " + "; ".join(problems), hint=hint)


def startup_check(pipeline: Pipeline, settings: Settings, *, pipeline_file: Path | str | None = None) -> None:
    """Before ``cdcsync run``: the ClickHouse ledger has every migration, and each table matches the pipeline.

    A pipeline without ClickHouse sinks never connects to ClickHouse.
    """
    sinks = pipeline.clickhouse_sinks()
    if not sinks:
        return
    client = connect_from_settings(settings)
    try:
        migrations.check_ready(
            migrations.CLICKHOUSE,
            client,
            pipeline.name,
            settings.migrations_dir,
            pipeline_file=pipeline_file,
            pipeline=pipeline,
        )
        for sink_id, sink in sorted(sinks.items()):
            check_table(client, sink_id, sink_state(pipeline, sink))
    finally:
        client.close()
