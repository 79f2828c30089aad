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

from cdcsync.config.pipeline import AnySink, Pipeline, internal_tables
from cdcsync.config.types import PgType
from cdcsync.core import names
from cdcsync.core.errors import SinkError
from cdcsync.db.executor_errors import task_failure
from cdcsync.db.ledger import LedgeredSink
from cdcsync.db.pgcopy import arrow_to_copy_csv
from cdcsync.sources.debezium.envelope import UNAVAILABLE_JSON, UNAVAILABLE_PLACEHOLDER
from cdcsync.sql.render import render

if TYPE_CHECKING:
    import pyarrow as pa


_METADATA_TO_STAGE = ("_cdc_op", "_cdc_version", "_cdc_ts")
_TOAST_KIND = {
    "text": "text",
    "character varying": "text",
    "bytea": "bytea",
    "json": "json",
    "jsonb": "jsonb",
}
_ARRAY_TOAST_KIND = {
    "text": "text[]",
    "character varying": "text[]",
    "character": "text[]",
    "smallint": "integer[]",
    "integer": "integer[]",
    "bigint": "integer[]",
}
"""Arrays whose unchanged TOASTed value Debezium sends as a placeholder of the column's own type: a text array
holding the placeholder, an integer array of the placeholder's bytes. Other arrays have no placeholder of their
type (the decoder dead-letters what arrives)."""
Placeholder = str | bytes | tuple[Any, ...]
_PLACEHOLDER_BY_KIND: dict[str, Placeholder] = {
    "text": UNAVAILABLE_PLACEHOLDER,
    "bytea": UNAVAILABLE_PLACEHOLDER.encode(),
    "json": UNAVAILABLE_JSON,
    "jsonb": UNAVAILABLE_JSON,
    "text[]": (UNAVAILABLE_PLACEHOLDER,),
    "integer[]": tuple(UNAVAILABLE_PLACEHOLDER.encode()),
}


def _toast_kind(pg: PgType) -> str | None:
    """How Debezium's placeholder shows in a column of this type (see ``unavailable.sql.j2``), or None."""
    if pg.element is not None:
        return _ARRAY_TOAST_KIND.get(pg.element.name)
    return _TOAST_KIND.get(pg.name)


ROWS_OUT_TAG = "/* rows_out */"
"""Merge templates tag the statements whose row counts are the sink's rows out (changes applied to the target)."""


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

    def stage(self, table: pa.Table) -> int:
        """Collapse ``table`` (decoded changes of one partition) and COPY it; returns the rows staged."""
        import psycopg

        if table.num_rows == 0:
            return 0
        table = newest_per_key(table, self.primary_key, self.toastable)
        payload = _to_csv(table, self.columns, self.batch_id)
        try:
            with psycopg.connect(self.dsn) as conn, conn.cursor() as cur, cur.copy(self.copy_sql) as copy:
                copy.write(payload)
        except psycopg.Error as error:
            raise task_failure(f"{self.sink_label}: COPY into the staging table failed", error) from None
        return table.num_rows


def newest_per_key(
    table: pa.Table, primary_key: tuple[str, ...], toastable: tuple[tuple[str, Placeholder], ...] = ()
) -> pa.Table:
    """Keep the newest change (highest ``_cdc_version``) per key, vectorised: sort, then keep each run's first.

    ``toastable`` names columns that may hold Debezium's unavailable-value placeholder (an unchanged TOASTed value)
    and the value it decodes to. When the newest change of a key holds it, the value an older change of the same
    batch carried is kept instead, so that the merge, which keeps the stored value for a placeholder, does not
    lose a value set earlier in the batch.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows <= 1:
        return table
    order = [(k, "ascending") for k in primary_key] + [("_cdc_version", "descending")]
    table = table.sort_by(order)
    first_of_run: pa.Array | None = None
    for key in primary_key:
        column = table.column(key).combine_chunks()
        # Null keys (truncate rows) compare as null: count them as a new run, so none is dropped by the filter.
        differs = pc.fill_null(pc.not_equal(column.slice(1), column.slice(0, len(column) - 1)), True)
        first_of_run = differs if first_of_run is None else pc.or_(first_of_run, differs)
    assert first_of_run is not None
    mask = pa.concat_arrays([pa.array([True]), first_of_run.cast(pa.bool_())])
    for name, placeholder in toastable:
        table = _carry_unchanged_values(table, mask, name, placeholder)
    return table.filter(mask)


def _carry_unchanged_values(table: pa.Table, mask: pa.Array, name: str, placeholder: Placeholder) -> pa.Table:
    """Replace the placeholder in each run's first row by the newest older value of the run (rare: plain Python)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.column(name).combine_chunks()
    if isinstance(placeholder, tuple):  # an array column: Arrow compares no lists, Python does
        wanted = list(placeholder)
        unavailable = pa.array([value == wanted for value in column.to_pylist()], type=pa.bool_())
    else:
        unavailable = pc.fill_null(pc.equal(column, pa.scalar(placeholder, column.type)), False)
    if not pc.any(pc.and_(unavailable, mask)).as_py():
        return table
    values, is_placeholder, starts = column.to_pylist(), unavailable.to_pylist(), mask.to_pylist()
    for first in (i for i, start in enumerate(starts) if start and is_placeholder[i]):
        older = first + 1
        while older < len(values) and not starts[older]:
            if not is_placeholder[older]:
                values[first] = values[older]
                break
            older += 1
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values, type=column.type))


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
        self.toastable = {name: kind for name, pg in columns.items() if (kind := _toast_kind(pg)) is not None}
        """Value columns Postgres may TOAST, by how the placeholder is compared (text, bytea, json, jsonb,
        text[], integer[])."""
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
            "placeholder": UNAVAILABLE_PLACEHOLDER,
            "placeholder_codes": ",".join(str(code) for code in UNAVAILABLE_PLACEHOLDER.encode()),
        }
        self._copy_sql = render("postgres/runtime/stage_copy.sql.j2", **template_values)
        self._truncate_sql = render("postgres/runtime/stage_truncate.sql.j2", **template_values)
        self._count_sql = render("postgres/runtime/stage_count.sql.j2", **template_values)
        self._collapse_sql = render("postgres/runtime/batch_collapse.sql.j2", **template_values)
        merge_template = "merge_soft" if sink.delete_mode == "soft" else "merge_hard"
        truncate_values = {
            "internal_schema": names.INTERNAL_SCHEMA,
            "pipeline": pipeline.name,
            "sink_id": sink_id,
            "delete_mode": sink.delete_mode,
            "on_truncate": sink.on_truncate,
        }
        self._merge_statements = _split_statements(
            render("postgres/runtime/apply_truncate.sql.j2", **template_values, **truncate_values)
        ) + _split_statements(render(f"postgres/runtime/{merge_template}.sql.j2", **template_values))

    @property
    def target_name(self) -> str:
        return f"{self.sink.schema_}.{self.sink.table}"

    def prepare(self, ledger_key: dict[str, Any]) -> bool:
        """False when the ledger already holds this batch; else empty the stage of a crashed attempt's rows."""
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                if conn.execute(self._ledger_lookup_sql, ledger_key).fetchone():
                    return False
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
            toastable=tuple((name, _PLACEHOLDER_BY_KIND[kind]) for name, kind in self.toastable.items()),
        )

    def merge(self, ledger_key: dict[str, Any], rows_staged: int) -> int | None:
        """Merge the staged batch and record it in the ledger, in one transaction; None if it was merged before.

        ``rows_staged``: what the tasks reported they COPYed. A stage holding another number (emptied by a crash
        of Postgres, or written twice by a retried task) is not merged: the retriable error stages it again."""
        import psycopg

        batch_id = ledger_key["batch_id"]
        try:
            with psycopg.connect(self.dsn) as conn, conn.transaction():
                if conn.execute(self._ledger_record_sql, ledger_key).rowcount == 0:
                    raise _AlreadyMerged
                found = conn.execute(self._count_sql, {"batch_id": batch_id}).fetchone()
                if found is None or found[0] != rows_staged:
                    raise self._stage_lost(batch_id, rows_staged, found[0] if found else 0)
                conn.execute(self._collapse_sql, {"batch_id": batch_id})
                merged = 0
                for statement in self._merge_statements:
                    cursor = conn.execute(statement)
                    if ROWS_OUT_TAG in statement:
                        merged += max(cursor.rowcount, 0)
                conn.execute(self._ledger_rows_sql, {**ledger_key, "rows_written": merged})
                conn.execute(self._truncate_sql)
        except _AlreadyMerged:
            return None
        except psycopg.Error as error:
            raise self._error(f"merging batch {batch_id} into {self.target_name}", error) from None
        return merged


    def _stage_lost(self, batch_id: int, staged: int, found: int) -> SinkError:
        failure = SinkError(
            f"merging batch {batch_id} into {self.target_name}: the staging table holds {found:,} of the "
            f"{staged:,} row(s) the tasks staged (a Postgres crash empties UNLOGGED tables); staging it again",
            retriable=True,
        )
        return failure.add_context(self.label)  # type: ignore[return-value]


class _AlreadyMerged(Exception):
    """The ledger row appeared between the lookup and the merge: another attempt already merged this batch."""


def _split_statements(sql: str) -> list[str]:
    """Templates separate statements with ';' at line end; values never contain that (they are parameters)."""
    return [s.strip() for s in sql.split(";\n") if s.strip().rstrip(";")]
