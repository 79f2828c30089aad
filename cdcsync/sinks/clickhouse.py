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
3. :meth:`ClickHouseTableSink.merge`: the driver passes the large values of primary-key changes on to their new
   keys, along chains of them (:mod:`cdcsync.sinks.clickhouse_moves`; only for tables with placeholder columns,
   and only when a key changed), then records the batch in the ledger. A crash between 2 and 3 replays the batch;
   step 2's tokens make that harmless, and step 3 finds its own corrections done.

Like the Postgres sinks, a ClickHouse sink stops at a source that went back (:mod:`cdcsync.sinks.positions`): the
driver reads the sink's mark in step 1, each task checks its snapshot reads against it before it inserts, and step
3 raises the mark to the positions the tasks inserted (a Spark accumulator), in the ledger's transaction.

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

import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync import migrations
from cdcsync.config import clickhouse_types, toast
from cdcsync.config.toast import PLACEHOLDER_BY_KIND, Placeholder
from cdcsync.core.errors import MigrationError
from cdcsync.core.reports import ReportedFailure, write_failed
from cdcsync.db.clickhouse import (
    connect,
    connect_from_settings,
    first_line,
    is_retriable,
    reused_client,
    wrap_clickhouse_error,
)
from cdcsync.db.executor_errors import task_failure
from cdcsync.db.postgres import reused_connection
from cdcsync.migrations.clickhouse import sink_state, table_columns
from cdcsync.migrations.target import column_problems
from cdcsync.sinks import clickhouse_moves, key_moves, positions, tombstones
from cdcsync.sinks.clickhouse_values import fit_temporal_columns
from cdcsync.sinks.recorded import RecordedSink
from cdcsync.sql.render import render

if TYPE_CHECKING:
    from decimal import Decimal
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
    toastable: tuple[tuple[str, Placeholder], ...] = ()
    """(column, the value Debezium's unavailable-value placeholder decodes to in it)."""
    stored_values_sql: str = ""
    """Reads the stored current row of keys whose newest change still holds a placeholder (see
    :meth:`_fill_unchanged_values`)."""
    binary_columns: tuple[str, ...] = ()
    """Columns whose values are bytes (``bytea``, ``bytea[]``): read back from ClickHouse as bytes."""
    lone_sql: str = ""
    """The stored versions of lone tombstones' keys (``lone_tombstones.sql.j2``)."""
    links: tuple[str, str, str] = ("", "", "")
    """Postgres DSN, pipeline and sink under which moved deletes' links are kept (key changes across tasks and
    batches, :mod:`cdcsync.sinks.clickhouse_moves`); empty without placeholder columns or in
    ``append_only_mode: false``."""
    links_sql: tuple[str, str] = ("", "")
    """The ``record`` and ``created`` statements of ``key_move_links.sql.j2``."""
    moved_rows_sql: str = ""
    """Every stored row of given keys (``moved_rows.sql.j2``): the old keys' delete rows that carry values."""
    positions: positions.TaskPositions | None = None
    """The sink's mark, which the task's snapshot reads must not lie below; None for a source without one."""

    def stage(self, table: pa.Table) -> int:
        """Insert the newest change per key of ``table`` (one task's decoded partition); returns rows written."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from cdcsync.sinks.postgres import newest_per_key

        key_move_rows, table = key_moves.split(table)
        if table.num_rows == 0:
            return 0
        token = deduplication_token(self.token_prefix, table)  # from every row read, so it names the whole range
        # A source TRUNCATE (op 't', a row without key) is not applied to ClickHouse tables yet; see docs/clickhouse.md.
        table = table.filter(pc.not_equal(table.column("_cdc_op"), "t"))
        if table.num_rows == 0:
            return 0
        if self.positions is not None:
            self.positions.check(table)  # before anything is written: a source that went back stops the batch
        held = clickhouse_moves.creates_holding_placeholders(table, self.toastable) if self.toastable else None
        moves = self._key_moves(table, held)
        across = self._across_tasks(table, key_move_rows)
        links = self._links_of_creates(table, held, moves)
        table = newest_per_key(table, self.primary_key, self.toastable)
        table = fit_temporal_columns(table, self.columns, self.sink_label)
        doing = (
            f"{self.sink_label}: inserting batch {self.batch_id} ({token.rsplit('/', 1)[-1]}) "
            f"into {self.database}.{self.table}"
        )
        try:
            # raw_query sends bound parameters (a batch's keys) in the request body; in the URL, as command()
            # sends them, a large batch is refused (HTTP 414).
            with reused_client(self.url, compression=self.compression) as client:
                lone = tombstones.lone(table)
                if lone is not None:
                    table = tombstones.with_stored_versions(table, lone, lambda rows: self._stored(client, rows))
                    if table.num_rows == 0:
                        return 0
                table = self._fill_unchanged_values(client, table, moves)
                table = clickhouse_moves.fill_from_links(
                    client,
                    self.moved_rows_sql,
                    table,
                    links,
                    self.columns,
                    self.primary_key,
                    self.toastable,
                    self.binary_columns,
                )
                table = self._carry_into_deletes(client, table, across)
                rows = to_clickhouse_arrow(table, self.columns)
                # Only updates and deletes can leave older rows elsewhere: an insert follows a delete that marked them.
                may_move = pc.is_in(table.column("_cdc_op"), pa.array(["u", "d"]))
                if not self.append_only:
                    return self._upsert_and_delete(client, rows, may_move, token)
                client.insert_arrow(self.table, rows, database=self.database, settings=_token_settings(token))
                self._mark_other_partitions(client, rows.filter(may_move))
        except Exception as error:
            raise _task_error(doing, error) from None
        if across is not None and across.moved:
            dsn, pipeline, sink = self.links
            try:  # after the insert, so that a link always leads to a delete row that is there
                clickhouse_moves.record_links(dsn, self.links_sql[0], pipeline, sink, self.primary_key, across.moved)
            except Exception as error:
                raise task_failure(f"{doing}: recording its key changes in cdcsync.key_moves", error) from None
        return rows.num_rows

    def _links_of_creates(
        self, table: pa.Table, held: pa.Array | None, moves: dict[tuple[Any, ...], _KeyMove]
    ) -> list[clickhouse_moves.Link]:
        """The links of the keys this task creates holding placeholders (``held``, see :meth:`_key_moves`) whose
        delete is not in the task: those recorded already (the delete came first) let the create land with the
        values."""
        if held is None or not self.moved_rows_sql:
            return []
        created = clickhouse_moves.placeholder_creates(table, self.primary_key, held)
        created = {key: version for key, version in created.items() if key not in moves}
        if not created:
            return []
        dsn, pipeline, sink = self.links
        try:
            return clickhouse_moves.links_of(
                dsn, self.links_sql[1], pipeline, sink, self.primary_key, self.key_types, created
            )
        except Exception as error:
            raise task_failure(f"{self.sink_label}: reading key changes from cdcsync.key_moves", error) from None

    def _across_tasks(self, table: pa.Table, key_move_rows: pa.Table) -> _AcrossTasks | None:
        """This task's moved deletes (the other half may be in another task or batch), from its uncollapsed
        changes, with the old keys' values that changes before them in the task set."""
        if not self.toastable or not self.moved_rows_sql:
            return None
        moved = clickhouse_moves.moved_deletes(key_move_rows, table, self.primary_key)
        if not moved:
            return None
        earlier = clickhouse_moves.values_before(
            table, {m.old: m.version for m in moved}, self.primary_key, self.toastable
        )
        return _AcrossTasks(moved, earlier, table.schema)

    def _carry_into_deletes(self, client: Any, table: pa.Table, across: _AcrossTasks | None) -> pa.Table:
        """Moved deletes carry the old key's values (:mod:`cdcsync.sinks.clickhouse_moves`): those set in the
        task, else the stored row's, read in one query for the old keys that lack some."""
        if across is None:
            return table
        stored: dict[tuple[Any, ...], dict[str, Any]] = {}
        lacking = [m.old for m in across.moved if len(across.earlier.get(m.old, {})) < len(self.toastable)]
        if lacking:
            rows = clickhouse_moves.stored_rows(client, self.stored_values_sql, lacking, self.binary_columns)
            stored = clickhouse_moves.live_values(rows, len(self.primary_key), across.schema, self.toastable)
        return clickhouse_moves.carry_into_deletes(table, across.moved, across.earlier, stored, self.primary_key)

    def _key_moves(self, table: pa.Table, held: pa.Array | None) -> dict[tuple[Any, ...], _KeyMove]:
        """The primary-key changes in ``table`` whose new key's create holds a placeholder, by new key. ``held``:
        which rows are such creates (:func:`~cdcsync.sinks.clickhouse_moves.creates_holding_placeholders`, asked
        once per task for this and :meth:`_links_of_creates`), None without TOASTable columns.

        Debezium sends such a change as a delete of the old key and a create of the new one at the same source
        position (the same ``_cdc_version``); an INSERT never holds a placeholder, so a create that does is the
        new key of a move, paired here with the delete of its version. Both are in this task when the topic keys
        them to the same Kafka partition (a one-partition topic, say); otherwise the placeholder stays.
        """
        import pyarrow.compute as pc

        if held is None or not pc.any(held).as_py():
            return {}
        keys = clickhouse_moves.keys_of(table, self.primary_key)
        ops, versions = table.column("_cdc_op").to_pylist(), table.column("_cdc_version").to_pylist()
        unavailable = clickhouse_moves.unavailable(table, self.toastable)
        deleted_at = {versions[i]: keys[i] for i in range(len(keys)) if ops[i] == "d"}
        pairs: dict[tuple[Any, ...], tuple[tuple[Any, ...], int]] = {}
        for i, key in enumerate(keys):
            old = deleted_at.get(versions[i])
            if ops[i] == "c" and old is not None and old != key and any(held[i] for held in unavailable.values()):
                pairs[key] = (old, versions[i])
        # The old key's values set earlier in this batch (the newest per column), before its delete.
        known = clickhouse_moves.values_before(table, dict(pairs.values()), self.primary_key, self.toastable)
        return {key: _KeyMove(old, known.get(old, {})) for key, (old, _) in pairs.items()}

    def _fill_unchanged_values(
        self, client: Any, table: pa.Table, moves: dict[tuple[Any, ...], _KeyMove] | None = None
    ) -> pa.Table:
        """Replace the placeholders the in-batch carry left (no older change of the key in this batch set the
        value) by the key's stored current value, read in one query for all such keys; for the new key of a
        primary-key change (``moves``), by the old key's value.

        ReplacingMergeTree keeps whole rows, so unlike the Postgres merge this must happen before the insert. A key
        whose newest stored row is a delete, or that ClickHouse has never seen, keeps the placeholder (as a
        Postgres mirror does). A replayed batch reads back its own earlier rows, which hold the same values.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        from cdcsync.sinks.postgres import placeholder_mask

        if not self.toastable or not self.stored_values_sql:
            return table
        live = pc.not_equal(table.column("_cdc_op"), "d")
        masks = {name: pc.and_(placeholder_mask(table.column(name), value), live) for name, value in self.toastable}
        masks = {name: mask for name, mask in masks.items() if pc.any(mask).as_py()}
        if not masks:
            return table
        moves = moves or {}
        wanted = functools.reduce(pc.or_, masks.values())
        key_rows = list(zip(*(table.column(k).to_pylist() for k in self.primary_key), strict=True))
        # Where each key's kept values come from: its own stored row, or the old key's for a moved key.
        source = {key: moves[key].old if key in moves else key for key in key_rows}
        keys = sorted({source[key] for key, want in zip(key_rows, wanted.to_pylist(), strict=True) if want}, key=repr)
        result = client.query(
            self.stored_values_sql,
            parameters={"keys": keys},
            query_formats={"UUID": "string"},
            column_formats={name: "bytes" for name in self.binary_columns},
        )
        width = len(self.primary_key)
        names = [name for name, _ in self.toastable]
        stored = {
            tuple(row[:width]): dict(zip(names, row[width + 1 :], strict=True))
            for row in result.result_rows
            if not row[width]  # _is_deleted
        }
        for name, mask in masks.items():
            column = table.column(name)
            values = column.to_pylist()
            for index, (key, unavailable) in enumerate(zip(key_rows, mask.to_pylist(), strict=True)):
                if not unavailable:
                    continue
                if key in moves and name in moves[key].values:
                    values[index] = moves[key].values[name]
                elif source[key] in stored:
                    values[index] = stored[source[key]][name]
            table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, type=column.type))
        return table

    def _stored(self, client: Any, rows: pa.Table) -> list[tuple[int, Any]]:
        """(position in ``rows``, newest version + 1) of the keys whose newest row is live."""
        keys = list(zip(*(rows.column(k).to_pylist() for k in self.primary_key), strict=True))
        found = client.query(self.lone_sql, parameters={"keys": keys}).result_rows
        return [(int(position) - 1, int(version)) for position, version in found]

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


@dataclass(frozen=True)
class _AcrossTasks:
    """A task's moved deletes, whose new key may be in another task or batch (:mod:`~.clickhouse_moves`)."""

    moved: list[clickhouse_moves.MovedDelete]
    earlier: dict[tuple[Any, ...], dict[str, Any]]
    """The moved deletes' old keys' values set by earlier changes in the task."""
    schema: pa.Schema


@dataclass(frozen=True)
class _KeyMove:
    """Where the new key of a primary-key change takes its unchanged large values from."""

    old: tuple[Any, ...]
    """The old key: its stored row holds them."""
    values: dict[str, Any]
    """Those that changes of the old key earlier in the same batch set (they win over the stored row)."""


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


class ClickHouseTableSink(RecordedSink):
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
        keyed = {"target": (sink.database, sink.table), "primary_key": self.primary_key, "key_types": self.key_types}
        """What every runtime template over the table's keys takes."""
        self._delete_sql = render("clickhouse/runtime/delete_keys.sql.j2", **keyed)
        self._lone_sql = render("clickhouse/runtime/lone_tombstones.sql.j2", **keyed)
        self._markers_sql = ""
        if sink.partition_by and clickhouse_types.partition_columns(sink.partition_by, self.columns) - set(
            self.primary_key
        ):
            self._markers_sql = render("clickhouse/runtime/partition_markers.sql.j2", columns=self.columns, **keyed)
        columns = pipeline.columns_of(sink.from_)
        self._bytes_columns = tuple(
            name for name in self.columns if "bytea" in (columns[name].name, getattr(columns[name].element, "name", ""))
        )
        """``bytea`` and ``bytea[]`` columns: read back from ClickHouse as bytes."""
        self.toastable = toast.toastable({name: columns[name] for name in self.columns if name not in self.primary_key})
        self._placeholders = tuple((name, PLACEHOLDER_BY_KIND[kind]) for name, kind in self.toastable.items())
        """(column, the value Debezium's placeholder decodes to in it)."""
        self._stored_values_sql = ""
        if self.toastable:
            self._stored_values_sql = render(
                "clickhouse/runtime/stored_values.sql.j2", columns=tuple(self.toastable), **keyed
            )
        self._moved_sql = ""
        self._links_sql = ("", "")
        if self.toastable and sink.append_only_mode:
            self._moved_sql = render("clickhouse/runtime/moved_rows.sql.j2", columns=self.columns, **keyed)
            links = "postgres/runtime/key_move_links.sql.j2"
            self._links_sql = (render(links, statement="record"), render(links, statement="created"))
            self._pending_sql = render(links, statement="pending")
            self._drop_sql = render(links, statement="drop")
        self._rows_staged = 0
        self.spark_context: Any = None
        """Set by the run (:func:`track_positions`): where the tasks' positions accumulate. Without it (no Spark)
        the tasks still check their reads against the mark, but the mark is not raised."""
        self._mark: tuple[Decimal | None, Decimal | None] = (None, None)
        self._positions: Any = None
        """The accumulator of the batch attempt being staged (:class:`~cdcsync.sinks.positions.HighestPositions`)."""

    @property
    def target_name(self) -> str:
        return f"{self.sink.database}.{self.sink.table}"

    def prepare(self, ledger_key: dict[str, Any]) -> bool:
        """False when the ledger already holds this batch with the same offset ranges; else read the sink's mark
        of source positions, which the tasks check their snapshot reads against."""
        import psycopg

        if not self.not_landed(ledger_key):
            return False
        try:
            with reused_connection(self.dsn) as conn:
                self._mark = positions.read_mark(conn, self.pipeline.name, self.sink_id)
        except psycopg.Error as error:
            raise self._error("reading the source positions merged", error) from None
        return True

    def merge(self, ledger_key: dict[str, Any], rows_staged: int = 0) -> int | None:
        """Pass moved values on (:meth:`follow_key_moves`), then record the batch (its inserts are done) in the
        ledger and raise the sink's mark to the positions the tasks inserted, in one transaction; None if another
        attempt recorded it first."""
        self.follow_key_moves(ledger_key["checkpoint_id"], ledger_key["batch_id"])
        newest, snapshot = self._positions.value if self._positions is not None else (None, None)
        self._positions = None

        def save(conn: Any) -> None:
            positions.save_mark(conn, self.pipeline.name, self.sink_id, newest, snapshot)

        return rows_staged if self.record_landed(ledger_key, rows_staged, also=save) else None

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
            toastable=self._placeholders,
            stored_values_sql=self._stored_values_sql,
            binary_columns=self._bytes_columns,
            lone_sql=self._lone_sql,
            links=(self.dsn, self.pipeline.name, self.sink_id),
            links_sql=self._links_sql,
            moved_rows_sql=self._moved_sql,
            positions=self._task_positions(),
        )

    def _task_positions(self) -> positions.TaskPositions | None:
        """What this batch attempt's tasks check their reads against, with a fresh accumulator for what they
        insert; None for a source without Debezium positions to check (bounded and plugin sources)."""
        source = self.pipeline.sources.get(self.pipeline.root_of(self.sink.from_))
        if source is None:
            return None
        accumulator = None
        if self.spark_context is not None:
            accumulator = self.spark_context.accumulator((None, None), positions.HighestPositions())
        self._positions = accumulator
        mark, seen = self._mark
        return positions.TaskPositions(self.sink_id, source, mark, seen, accumulator)

    def follow_key_moves(self, checkpoint_id: str, batch_id: int) -> None:
        """After a batch's tasks (none runs beside this): pass the values of primary-key changes on to their new
        keys along every pending link of the sink, also along chains, and drop the links whose values went on
        (:mod:`cdcsync.sinks.clickhouse_moves`). A replayed batch finds the same state, or less to do."""
        import psycopg

        if not self._moved_sql:
            return
        names = {"pipeline": self.pipeline.name, "sink": self.sink_id}
        doing = f"passing key changes' values on after batch {batch_id}"
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                links = [
                    clickhouse_moves.Link(
                        clickhouse_moves.key_from_json(new, self.primary_key, self.key_types),
                        int(version),
                        clickhouse_moves.key_from_json(old, self.primary_key, self.key_types),
                    )
                    for new, version, old in conn.execute(self._pending_sql, names).fetchall()
                ]
        except psycopg.Error as error:
            raise self._error(doing, error) from None
        if not links:
            return
        client = connect(self.clickhouse_url, compression=self.sink.compression, form_encode_query_params=True)
        try:
            done = clickhouse_moves.pass_on(
                client,
                links,
                self._moved_sql,
                (self.sink.database, self.sink.table),
                self.columns,
                self.primary_key,
                self._placeholders,
                self._bytes_columns,
                f"cdcsync/{self.pipeline.name}/{self.sink_id}/{checkpoint_id}/{batch_id}/moves",
            )
        except Exception as error:
            raise wrap_clickhouse_error(error, f"{self.label}: {doing} in {self.target_name}") from None
        finally:
            client.close()
        if not done:
            return
        dropped = [
            {
                **names,
                "key": clickhouse_moves.key_json(self.primary_key, link.new),
                "version": link.version,
            }
            for link in done
        ]
        try:
            with psycopg.connect(self.dsn) as conn, conn.cursor() as cur:
                cur.executemany(self._drop_sql, dropped)
        except psycopg.Error as error:
            raise self._error(doing, error) from None

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
    problems += column_problems(table_columns(state), {str(name): str(type_) for name, type_ in columns})
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


def track_positions(sinks: Iterable[object], spark_context: Any) -> None:
    """Let the ClickHouse sinks among ``sinks`` collect the positions their tasks insert through ``spark_context``."""
    for sink in sinks:
        if isinstance(sink, ClickHouseTableSink):
            sink.spark_context = spark_context
