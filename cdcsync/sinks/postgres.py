"""Postgres upsert sink: one mirror row per primary key, exactly-once effects per micro-batch.

How a micro-batch lands (DESIGN.md, "Delivery guarantee"; orchestrated by :mod:`cdcsync.engine.batch`):

1. :meth:`PostgresUpsertSink.prepare`: the driver looks the batch up in ``cdcsync.batch_ledger``; a replayed
   batch that was already merged is skipped without touching the target.
2. :class:`StageWriter`: executors collapse their partition to the newest change per key (vectorised, in Arrow)
   and COPY it as CSV into the sink's UNLOGGED staging table, tagged with the batch id. No per-row statements,
   nothing collected to the driver but a row count per partition.
3. :meth:`PostgresUpsertSink.merge`: the driver runs one transaction: record the ledger row (``ON CONFLICT DO
   NOTHING`` makes a concurrent or repeated merge a no-op), check that the stage still holds every row the tasks
   staged, collapse the staged rows across partitions (``DISTINCT ON`` by ``_cdc_version``), merge them so that
   only rows with an older ``_cdc_version`` are overwritten or deleted, and empty the stage.

The staging table is UNLOGGED (no WAL for rows that live for one batch), so a Postgres crash between staging and
merge empties it: crash recovery resets unlogged tables. The count check in step 3 turns that into a retriable
error (the batch is staged again) instead of a merge of an empty or partial stage that the ledger would record as
done. It compares in the merge's own transaction, so a crash after it aborts the merge as well.

A task retried by Spark (on a cluster; failed writes are reported as data, not raised) may COPY its partition
twice: the stage then holds more rows than the tasks reported, and the count check stages the batch again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.config import toast
from cdcsync.config.pipeline import AnySink, Pipeline, internal_tables
from cdcsync.config.toast import PLACEHOLDER_BY_KIND, Placeholder
from cdcsync.core import names
from cdcsync.core.errors import SinkError
from cdcsync.db.executor_errors import task_failure
from cdcsync.db.ledger import LedgeredSink
from cdcsync.db.pgcopy import arrow_to_copy_csv
from cdcsync.db.postgres import reused_connection
from cdcsync.sinks import key_moves, positions, tombstones
from cdcsync.sql.render import holds_placeholder, render, template_text

if TYPE_CHECKING:
    import pyarrow as pa


_METADATA_TO_STAGE = ("_cdc_op", "_cdc_version", "_cdc_ts")
ROWS_OUT_TAG = "/* rows_out */"
"""Merge templates tag the statements whose row counts are the sink's rows out (changes applied to the target)."""
MERGE_PARTS = ("key_moves", "truncate")
"""Parts of a merge that few batches need, in the order ``stage_count.sql.j2`` says whether a batch needs each. Their
statements are tagged ``/* <part> */``; a batch that does not need a part skips them, as none would change anything
(a sink with large text columns ran the key moves' eleven statements, the stage's ANALYZE among them, on every
batch: a fifth of a mirror's merge in ``benchmarks/aggregate_merge_cpu.py``)."""


@dataclass(frozen=True)
class MergeStatement:
    """One statement of a sink's merge. A statement that reads the stage as a whole keeps to its batch's rows with
    a ``%(batch_id)s`` parameter (``key_moves.sql.j2``): the next batch may be staging into the same table meanwhile
    (overlapped merges). Both flags come from the template's own text, outside the names' quotes
    (:func:`~cdcsync.sql.render.template_text`), so no table or column name can set them."""

    sql: str
    with_batch_id: bool
    """Executed with the batch id: exactly the statements holding a placeholder (:mod:`cdcsync.sql.render`'s rule
    for ``%`` in names)."""
    rows_out: bool
    """Its row count is part of the sink's rows out (:data:`ROWS_OUT_TAG`)."""
    part: str | None = None
    """The part of :data:`MERGE_PARTS` it belongs to: run only for a batch that needs that part."""

    @classmethod
    def of(cls, sql: str) -> MergeStatement:
        text = template_text(sql)
        part = next((part for part in MERGE_PARTS if f"/* {part} */" in text), None)
        return cls(sql, holds_placeholder(sql), ROWS_OUT_TAG in text, part)


@dataclass(frozen=True)
class StageWriter:
    """Executor side of the sink: collapse a partition in Arrow and COPY it into the staging table.

    A plain picklable object, so Spark ships it to the Python workers; it opens its own connection there.
    """

    dsn: str
    copy_sql: str
    primary_key: tuple[str, ...]
    columns: tuple[str, ...]
    batch_id: int
    sink_label: str
    toastable: tuple[tuple[str, Placeholder], ...] = ()
    """(column, the value Debezium's unavailable-value placeholder decodes to in it): see :func:`newest_per_key`."""
    key_moves: bool = False
    """Also stage the key-move rows (:mod:`cdcsync.sinks.key_moves`): the sink has such columns."""
    lone_sql: tuple[str, ...] = ()
    """Create, COPY, select: the stored versions of lone tombstones' keys (``lone_tombstones.sql.j2``)."""

    def stage(self, table: pa.Table) -> int:
        """Collapse ``table`` (decoded changes of one partition) and COPY it; returns the rows staged."""
        import psycopg
        import pyarrow as pa

        if table.num_rows == 0:
            return 0
        moves, table = key_moves.split(table)
        table = newest_per_key(table, self.primary_key, self.toastable, keep_key_moves=True)
        if self.key_moves and moves.num_rows:
            table = pa.concat_tables([table, moves.select(table.column_names)])
        try:
            with reused_connection(self.dsn) as conn:
                lone = tombstones.lone(table)
                if lone is not None:
                    table = tombstones.with_stored_versions(table, lone, lambda rows: self._stored(conn, rows))
                with conn.transaction(), conn.cursor() as cur, cur.copy(self.copy_sql) as copy:
                    copy.write(_to_csv(table, self.columns, self.batch_id))
        except psycopg.Error as error:
            raise task_failure(f"{self.sink_label}: COPY into the staging table failed", error) from None
        return table.num_rows

    def _stored(self, conn: Any, rows: pa.Table) -> list[tuple[int, Any]]:
        """(position in ``rows``, stored version + 1) of the keys the target holds live."""
        import pyarrow as pa

        create, copy_sql, select = self.lone_sql
        positions = pa.array(range(rows.num_rows), pa.int32())
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(create)
            with cur.copy(copy_sql) as copy:
                copy.write(arrow_to_copy_csv([positions, *(rows.column(k) for k in self.primary_key)]))
            return [(int(pos), version) for pos, version in cur.execute(select).fetchall()]


def newest_per_key(
    table: pa.Table,
    primary_key: tuple[str, ...],
    toastable: tuple[tuple[str, Placeholder], ...] = (),
    *,
    keep_key_moves: bool = False,
) -> pa.Table:
    """Keep the newest change (highest ``_cdc_version``) per key, vectorised: sort, then keep each run's first.

    ``toastable`` names columns that may hold Debezium's unavailable-value placeholder (an unchanged TOASTed value)
    and the value it decodes to. When the newest change of a key holds it, the value an older change of the same
    batch carried is kept instead, so that the merge, which keeps the stored value for a placeholder, does not
    lose a value set earlier in the batch.

    ``keep_key_moves``: keep two more kinds of rows for the merge to pair a primary-key change's delete of the old
    key with the create of the new one (``key_moves.sql.j2``), whichever tasks they are in: older creates that
    hold a placeholder (such a create is the new key of a move, and a later change of the new key in the batch
    may be the one that lands), and for a key whose newest change is a delete, the change before it (the values
    the delete removes, carried like a newest change's). The merge's own collapse still lands only the newest.
    Tombstones are ranked first (:func:`cdcsync.sinks.tombstones.rank_tombstones`); one that stays without a
    version (lone) loses to any change of its key here, and is ranked against the target by the caller.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = tombstones.ranked_newest_first(table, primary_key)  # the common case, one cheaper sort
    if rows is None:
        table = tombstones.rank_tombstones(table, primary_key)
        if table.num_rows <= 1:
            return table
        order = [(k, "ascending") for k in primary_key] + [("_cdc_version", "descending")]
        if "_cdc_offset" in table.column_names:  # a tie (a tombstone and the delete it follows): the later message
            order.append(("_cdc_offset", "descending"))
        rows = tombstones.SortedRows(table, pc.sort_indices(table, sort_keys=order))
    first_of_run: pa.Array | None = None
    for key in primary_key:
        column = rows.column(key)
        # Null keys (truncate rows) compare as null: count them as a new run, so none is dropped by the filter.
        differs = pc.fill_null(pc.not_equal(column.slice(1), column.slice(0, len(column) - 1)), True)
        first_of_run = differs if first_of_run is None else pc.or_(first_of_run, differs)
    assert first_of_run is not None
    mask = pa.concat_arrays([pa.array([True]), first_of_run.cast(pa.bool_())])
    if not (keep_key_moves and toastable):
        for name, placeholder in toastable:
            if _holds_placeholders(rows, name, placeholder):
                _carry_unchanged_values(rows, mask, name, placeholder)
        return rows.kept(mask)
    ops = rows.column("_cdc_op")
    deleted = pc.fill_null(pc.equal(ops, "d"), False)
    n = rows.num_rows
    before_delete = pa.concat_arrays(
        [
            pa.array([False]),
            pc.and_(pc.and_(deleted.slice(0, n - 1), pc.invert(mask.slice(1))), pc.invert(deleted.slice(1))),
        ]
    )
    starts = pc.or_(mask, before_delete)
    moves = pa.array([False] * n, type=pa.bool_())
    for name, placeholder in toastable:
        if _holds_placeholders(rows, name, placeholder):
            moves = pc.or_(moves, placeholder_mask(rows.column(name), placeholder))
            _carry_unchanged_values(rows, starts, name, placeholder)
    return rows.kept(pc.or_(starts, pc.and_(moves, pc.equal(ops, "c"))))


def placeholder_mask(column: pa.ChunkedArray | pa.Array, placeholder: Placeholder) -> pa.Array:
    """Which values of ``column`` are Debezium's placeholder (never null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_null(column.type):  # every value NULL (a partition of deletes, say): Arrow typed it so
        return pa.array([False] * len(column), type=pa.bool_())
    if isinstance(placeholder, tuple):  # an array column: Arrow compares no lists, Python does
        # On the values' integer storage: a date[] may hold dates Python has no date for (infinity, BC years).
        storage = _integer_storage(column.type)
        wanted = pa.array([list(placeholder)], type=column.type).cast(storage)[0].as_py()
        return pa.array([value == wanted for value in column.cast(storage).to_pylist()], type=pa.bool_())
    return pc.fill_null(pc.equal(column, pa.scalar(placeholder, column.type)), False)


def _integer_storage(list_type: pa.DataType) -> pa.DataType:
    """A list of dates or timestamps as a list of their integers (the same values); other lists as they are."""
    import pyarrow as pa

    value_type = list_type.value_type
    if pa.types.is_date32(value_type):
        return pa.list_(pa.int32())
    if pa.types.is_timestamp(value_type) or pa.types.is_date64(value_type):
        return pa.list_(pa.int64())
    return list_type


def _holds_placeholders(rows: tombstones.SortedRows, name: str, placeholder: Placeholder) -> bool:
    """Whether column ``name`` holds the placeholder at all: asked of the table as it is, chunk by chunk, so that
    a column without one (the common case) is never copied."""
    import pyarrow.compute as pc

    return any(pc.any(placeholder_mask(chunk, placeholder)).as_py() for chunk in rows.table.column(name).chunks)


def _carry_unchanged_values(rows: tombstones.SortedRows, mask: pa.Array, name: str, placeholder: Placeholder) -> None:
    """Replace the placeholder in each run's first row by the newest older value of the run (rare: plain Python)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = rows.column(name)
    unavailable = placeholder_mask(column, placeholder)
    if not pc.any(pc.and_(unavailable, mask)).as_py():
        return
    is_placeholder, starts = unavailable.to_pylist(), mask.to_pylist()
    source = list(range(len(column)))  # by index, not by value: no value needs a Python equivalent
    for first in (i for i, start in enumerate(starts) if start and is_placeholder[i]):
        older = first + 1
        while older < len(column) and not starts[older]:
            if not is_placeholder[older]:
                source[first] = older
                break
            older += 1
    rows.columns[name] = column.take(pa.array(source, pa.int64()))


def _to_csv(table: pa.Table, columns: tuple[str, ...], batch_id: int) -> bytes:
    import pyarrow as pa

    batch_ids = pa.array([batch_id] * table.num_rows, type=pa.int64())
    return arrow_to_copy_csv([batch_ids, *(table.column(name) for name in (*columns, *_METADATA_TO_STAGE))])


class PostgresUpsertSink(LedgeredSink):
    """Driver side of one ``type: postgres`` sink."""

    def __init__(self, pipeline: Pipeline, sink_id: str, sink: AnySink, dsn: str) -> None:
        super().__init__(pipeline, sink_id, dsn)
        self.sink = sink
        columns = pipeline.columns_of(sink.from_)
        self.columns = tuple(columns)
        self.primary_key = tuple(pipeline.sink_primary_key(sink))
        self.value_columns = tuple(c for c in self.columns if c not in self.primary_key)
        self.toastable = toast.toastable({name: columns[name] for name in self.value_columns})
        """Value columns that may hold Debezium's placeholder, by how it is compared (:mod:`cdcsync.config.toast`)."""
        stage_table, tombstone_table = internal_tables(pipeline.name, sink_id, sink)
        stage = (names.INTERNAL_SCHEMA, stage_table)
        target = (sink.schema_, sink.table)
        template_values: dict[str, Any] = {
            "stage": stage,
            "target": target,
            "tombstones": (names.INTERNAL_SCHEMA, tombstone_table),
            "columns": self.columns,
            "primary_key": self.primary_key,
            "value_columns": self.value_columns,
            "toastable": self.toastable,
            "toast_types": {name: columns[name].sql for name in self.toastable},
            "key_types": {name: columns[name].sql for name in self.primary_key},
            "internal_schema": names.INTERNAL_SCHEMA,
            "pipeline": pipeline.name,
            "sink_id": sink_id,
            "delete_mode": sink.delete_mode,
            "on_truncate": sink.on_truncate,
            **toast.TEMPLATE_VALUES,
        }
        self._copy_sql = render("postgres/runtime/stage_copy.sql.j2", **template_values)
        self._truncate_sql = render("postgres/runtime/stage_truncate.sql.j2", **template_values)
        self._stage_any_sql = render("postgres/runtime/stage_any.sql.j2", **template_values)
        self._stage_clear_sql = render("postgres/runtime/stage_clear.sql.j2", **template_values)
        self._delete_batch_sql = render("postgres/runtime/stage_delete_batch.sql.j2", **template_values)
        self._count_sql = render("postgres/runtime/stage_count.sql.j2", **template_values)
        self._collapse_sql = render("postgres/runtime/batch_collapse.sql.j2", **template_values)
        self._end_sql = _split_statements(self._truncate_sql)
        self._lone_sql = tuple(_split_statements(render("postgres/runtime/lone_tombstones.sql.j2", **template_values)))
        merge_template = "merge_soft" if sink.delete_mode == "soft" else "merge_hard"
        self._position_check_sql = render("postgres/runtime/position_check.sql.j2", **template_values)
        self._position_record_sql = render("postgres/runtime/position_record.sql.j2", **template_values)
        self._merge_statements = [
            MergeStatement.of(statement)
            for template in ("apply_truncate", merge_template)
            for statement in _split_statements(render(f"postgres/runtime/{template}.sql.j2", **template_values))
        ]

    @property
    def target_name(self) -> str:
        return f"{self.sink.schema_}.{self.sink.table}"

    def prepare(self, ledger_key: dict[str, Any], keep: tuple[int, ...] = ()) -> bool:
        """False when the ledger already holds this batch (same offset ranges); else empty the stage of a crashed
        attempt's rows, all but those of the batches in ``keep`` (staged, their merges still to run), and, with none
        kept, of the dead rows merges that overlapped the next batch left (``stage_any.sql.j2``). A merge that ran
        alone truncated it, so it is often empty already: a TRUNCATE of an empty table still writes new files (and
        syncs the init fork of an UNLOGGED one), the most expensive statement of a small batch, so it runs only when
        there is something to remove."""
        import psycopg

        try:
            with reused_connection(self.dsn) as conn:
                if self.landed(conn, ledger_key, keep):
                    return False
                found = conn.execute(self._stage_any_sql, {"keep": list(keep)}).fetchone()
                if (found is None or found[0]) and keep:
                    conn.execute(self._stage_clear_sql, {"keep": list(keep)})
                elif found is None or found[0]:
                    conn.execute(self._truncate_sql)
        except psycopg.Error as error:
            raise self._error(f"preparing batch {ledger_key['batch_id']}", error) from None
        return True

    def stage_writer(self, batch_id: int) -> StageWriter:
        return StageWriter(
            dsn=self.dsn,
            copy_sql=self._copy_sql,
            primary_key=self.primary_key,
            columns=self.columns,
            batch_id=batch_id,
            sink_label=self.label,
            toastable=tuple((name, PLACEHOLDER_BY_KIND[kind]) for name, kind in self.toastable.items()),
            key_moves=bool(self.toastable),
            lone_sql=self._lone_sql,
        )

    def merge(self, ledger_key: dict[str, Any], rows_staged: int, *, shared_stage: bool = False) -> int | None:
        """Merge the staged batch and record it (with its offset ranges) in the ledger, in one transaction; None if
        another attempt merged it (the same ranges) first.

        ``rows_staged``: what the tasks reported they COPYed. A stage holding another number (emptied by a crash
        of Postgres, or written twice by a retried task) is not merged: the retriable error stages it again.
        ``shared_stage``: the next batch may be staging meanwhile, so the merge deletes its own rows from the stage
        instead of truncating it."""
        import psycopg

        batch_id = ledger_key["batch_id"]
        try:
            with reused_connection(self.dsn) as conn, conn.transaction():
                self.enter_fence(conn)
                if conn.execute(self._ledger_record_sql, ledger_key).rowcount == 0:
                    raise _AlreadyMerged
                found, parts = self._census(conn, batch_id)
                if found != rows_staged:
                    raise self._stage_lost(batch_id, rows_staged, found)
                self._check_positions(conn, batch_id)
                conn.execute(self._collapse_sql, {"batch_id": batch_id})
                merged = 0
                for step in self._merge_statements:
                    if step.part is not None and step.part not in parts:
                        continue
                    cursor = conn.execute(step.sql, {"batch_id": batch_id} if step.with_batch_id else None)
                    if step.rows_out:
                        merged += max(cursor.rowcount, 0)
                conn.execute(self._position_record_sql, {"batch_id": batch_id})
                conn.execute(self._ledger_rows_sql, {**ledger_key, "rows_written": merged})
                if shared_stage:
                    conn.execute(self._delete_batch_sql, {"batch_id": batch_id})
                else:
                    for statement in self._end_sql:
                        conn.execute(statement)
        except _AlreadyMerged:
            return None
        except psycopg.Error as error:
            raise self._error(f"merging batch {batch_id} into {self.target_name}", error) from None
        return merged

    def _census(self, conn: Any, batch_id: int) -> tuple[int, set[str]]:
        """The batch's rows in the stage, and the parts of the merge (:data:`MERGE_PARTS`) it needs."""
        row = conn.execute(self._count_sql, {"batch_id": batch_id}).fetchone()
        if row is None:  # (an aggregate always returns its row)
            return 0, set(MERGE_PARTS)
        return row[0], {part for part, needs in zip(MERGE_PARTS, row[1:], strict=True) if needs}

    def _stage_lost(self, batch_id: int, staged: int, found: int) -> SinkError:
        failure = SinkError(
            f"merging batch {batch_id} into {self.target_name}: the staging table holds {found:,} of the "
            f"{staged:,} row(s) the tasks staged (a Postgres crash empties UNLOGGED tables); staging it again",
            retriable=True,
        )
        return failure.add_context(self.label)  # type: ignore[return-value]

    def _check_positions(self, conn: Any, batch_id: int) -> None:
        """Stop before merging a snapshot that lies below what this sink has merged: the source went back."""
        went_back = conn.execute(self._position_check_sql, {"batch_id": batch_id}).fetchone()
        if went_back is None:
            return
        mark, position, reads = went_back
        raise positions.went_back(self.sink_id, self.pipeline.source_of(self.sink), mark, position, reads)


class _AlreadyMerged(Exception):
    """The ledger row appeared between the lookup and the merge: another attempt already merged this batch."""


def _split_statements(sql: str) -> list[str]:
    """Templates separate statements with ';' at line end; values never contain that (they are parameters)."""
    return [s.strip() for s in sql.split(";\n") if s.strip().rstrip(";")]
