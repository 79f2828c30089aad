"""Dynamic lookup tables at run time: the key sets ``dynamic_table_check`` tests against, and side outputs that
fill them from the stream.

Reading: before each micro-batch the driver reads the table's change counter (one indexed row in
``cdcsync.dynamic_table_changes``, bumped by a statement trigger on every write by anyone). Only when it moved are
the keys reloaded, as one Postgres value (``dynamic_keys_load.sql.j2``; a COPY reached Python a row per call). So an
edit made with plain SQL is seen from the next micro-batch on, and an unchanged table costs one tiny query per
batch. What the batch's checks then use depends on the key type:

* Integer keys (:meth:`DynamicTable.key_check`): a sorted numpy array in a Spark broadcast variable, which each
  Python worker reads once per reload, tested by the scalar Arrow UDF of :mod:`cdcsync.transforms.key_check`.
  A broadcast join instead rebuilt the hash relation of the whole key set and shipped it in every micro-batch
  (Spark keeps no broadcast from one query to the next): about 1 s per batch for a million keys.
* Other key types (:meth:`DynamicTable.prior_keys`): a Spark DataFrame that transforms join against with a
  broadcast, where Spark's own casts and equality decide what matches. Those of a large table
  (:data:`CACHED_FROM`) are held in Spark's columnar cache from the load until the next one replaces (and
  unpersists) them, and their DataFrame reads that cache, not the Arrow data. Created plainly, a DataFrame from
  an Arrow table under ``spark.sql.execution.arrow.localRelationThreshold`` (48 MB) is a ``LocalRelation``, every
  key a row in the query plan, which each micro-batch analysed, planned and shipped to its tasks again: about 6
  JVM CPU seconds per batch for a million keys, against about 0.5 for the broadcast itself (docs/benchmarks.md,
  "Lookups").

Writing (:meth:`DynamicTable.write`): the executors COPY the batch's new keys into a temp table and insert them
with ``ON CONFLICT DO NOTHING``, tagging each row with the pipeline, checkpoint and batch that first wrote it;
the driver records the write in ``cdcsync.batch_ledger`` like a sink, so a replayed batch skips it.

Exactness on replay: a batch must check against the table as it was before the batch's first attempt, even if
that attempt wrote its keys and then crashed before its sinks committed. The tags make that possible: the load
leaves out rows this pipeline's checkpoint wrote in the same batch or a later one.

``backend_type: in_memory`` tables live in the driver only: they start empty on every run and are filled by
their side output alone (Streamling's semantics; not exact across restarts).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.config.plan import INTEGER_KEY_TYPES, DynamicTableSpec
from cdcsync.core.errors import MigrationError
from cdcsync.db.executor_errors import task_failure
from cdcsync.db.ledger import LedgeredSink, OffsetRanges
from cdcsync.db.pgcopy import arrow_to_copy_csv, copy_then_insert
from cdcsync.sql.render import render

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql._typing import UserDefinedFunctionLike

    from cdcsync.config.pipeline import Pipeline


_LOCAL_RELATION_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"

CACHED_FROM = 10_000
"""Key sets at least this large are cached; smaller ones stay a LocalRelation, re-planned every batch (about 6 us
of JVM CPU a key) but broadcast from the driver without a Spark job (tens of milliseconds), which a table that
its side output changes every batch would otherwise pay on every batch."""


@contextmanager
def _conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """``key`` set to ``value`` in ``spark``'s session for the block (the query's own session: its batches run one
    at a time, so nothing else plans under the setting meanwhile)."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


@dataclass(frozen=True)
class KeyWriter:
    """Executor side of a side output (picklable): lands one partition of new keys, yields how many were new."""

    dsn: str
    statements: tuple[str, str, str]  # create temp table, copy, insert
    params: dict[str, Any]
    label: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psycopg
        import pyarrow as pa

        keys = [batch.column("key") for batch in batches if batch.num_rows]
        written = 0
        if keys:
            payload = arrow_to_copy_csv([pa.chunked_array(keys)])
            try:
                written = max(copy_then_insert(self.dsn, self.statements, payload, self.params), 0)
            except psycopg.Error as error:
                raise task_failure(f"{self.label}: writing keys of batch {self.params['batch_id']}", error) from None
        yield pa.RecordBatch.from_pydict({"rows": [written]}, schema=pa.schema([("rows", pa.int64())]))


class DynamicTable(LedgeredSink):
    """Driver side of one dynamic table for one source's query (each query keeps its own cache and session)."""

    def __init__(self, pipeline: Pipeline, spec: DynamicTableSpec, dsn: str) -> None:
        super().__init__(pipeline, f"dynamic_table:{spec.id}", dsn)
        self.spec = spec
        values = {
            "table": (spec.schema, spec.table),
            "key_column": spec.key_column,
            "key_type": spec.key_type.sql,
        }
        self._counter_sql = render("postgres/runtime/dynamic_counter.sql.j2")
        self._integer = spec.key_type.name in INTEGER_KEY_TYPES
        self._load_sql = render("postgres/runtime/dynamic_keys_load.sql.j2", **values, integer=self._integer)
        self._later_sql = render("postgres/runtime/dynamic_keys_later.sql.j2", **values)
        self._write_statements = (
            render("postgres/runtime/dynamic_keys_temp.sql.j2", **values),
            render("postgres/runtime/dynamic_keys_copy.sql.j2", **values),
            render("postgres/runtime/dynamic_keys_insert.sql.j2", **values),
        )
        self._held: Any = None
        """The keys batches check against: a DataFrame, or a broadcast variable (``checked_by_function``)."""
        self._held_counter: int | None = None
        """The change counter ``_held`` holds the keys of; None when they were right for one batch only."""
        self.cached_from = CACHED_FROM
        self.loads = 0
        """How many times the keys were read from Postgres (the live view and tests show it)."""

    @property
    def label(self) -> str:
        return f"dynamic table '{self.spec.id}'"

    @property
    def in_memory(self) -> bool:
        return self.spec.backend == "in_memory"

    # -- reading -------------------------------------------------------------------------------------------
    def prior_keys(self, spark: SparkSession, checkpoint_id: str, batch_id: int) -> DataFrame:
        """The keys batch ``batch_id`` checks against (column ``key``, unique), reloaded only when they changed."""
        if self.in_memory:
            if self._held is None:
                self._held = self._empty(spark)
            return self._held
        loaded = self._reload(checkpoint_id, batch_id)
        if loaded is not None:
            self._hold(self._to_dataframe(spark, loaded[0]), loaded[1])
        return self._held

    def key_check(self, spark: SparkSession, checkpoint_id: str, batch_id: int) -> UserDefinedFunctionLike:
        """The function batch ``batch_id``'s checks call when the spec is ``checked_by_function``: true when its
        argument is among the keys :meth:`prior_keys` would give, reloaded only when they changed."""
        from pyspark.sql.functions import arrow_udf

        from cdcsync.transforms.key_check import key_check, sorted_keys

        loaded = self._reload(checkpoint_id, batch_id)
        if loaded is not None:
            self._hold(spark.sparkContext.broadcast(sorted_keys(loaded[0])), loaded[1])
        # The stubs ask for functionType, which PySpark warns against: the function's type hints say it.
        return arrow_udf(key_check(self._held), "boolean")  # type: ignore[call-overload]

    def _reload(self, checkpoint_id: str, batch_id: int) -> tuple[Any, int | None] | None:
        """None when the held keys are still right for batch ``batch_id``; else the keys read again (integer keys
        packed in bytes, others a list of their text forms: ``dynamic_keys_load.sql.j2``), and the change counter
        they are right for (None: for this batch only)."""
        params = {
            "pipeline": self.pipeline.name,
            "checkpoint_id": checkpoint_id,
            "batch_id": batch_id,
            "schema": self.spec.schema,
            "table": self.spec.table,
        }
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                counter = self._counter(conn, params)
                if self._held is not None and counter == self._held_counter:
                    return None
                loaded = conn.execute(self._load_sql, params).fetchone()[0]  # type: ignore[index]
                complete = not conn.execute(self._later_sql, params).fetchone()[0]  # type: ignore[index]
        except psycopg.Error as error:
            raise self._error(f"reading keys for batch {batch_id}", error) from None
        self.loads += 1
        # A load that left out this checkpoint's own later rows (a replay) is right for this batch only.
        return loaded, (counter if complete else None)

    def _hold(self, keys: Any, counter: int | None) -> None:
        """Hold ``keys`` (a DataFrame or a broadcast variable) for the batches the counter says they are right for,
        releasing the keys held before: the batch that used them has ended (a query's batches run one at a
        time)."""
        from pyspark import Broadcast

        if isinstance(self._held, Broadcast):
            self._held.destroy()
        elif self._held is not None:
            self._held.unpersist()
        self._held, self._held_counter = keys, counter

    def _counter(self, conn: Any, params: dict[str, Any]) -> int:
        row = conn.execute(self._counter_sql, params).fetchone()
        if row is None:
            raise MigrationError(
                f"{self.label}: {self.spec.schema}.{self.spec.table} has no change counter",
                hint="run `cdcsync init` and apply the migration that creates the table (`cdcsync migrate`)",
            )
        return int(row[0])

    def _to_dataframe(self, spark: SparkSession, loaded: Any) -> DataFrame:
        import pyarrow as pa
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        if self._integer:
            from cdcsync.transforms.key_check import sorted_keys

            table = pa.table({"key": pa.array(sorted_keys(loaded))})
        else:
            table = pa.table({"key": pa.array(loaded, type=pa.string())})
        if table.num_rows < self.cached_from:
            frame = spark.createDataFrame(table)
            return frame.select(F.col("key").cast(self.spec.key_type.spark_type).alias("key"))
        with _conf(spark, _LOCAL_RELATION_THRESHOLD, "0"):  # an RDD of Arrow batches, not a LocalRelation
            frame = spark.createDataFrame(table)
        keys = frame.select(F.col("key").cast(self.spec.key_type.spark_type).alias("key")).coalesce(1)
        return keys.persist(StorageLevel.MEMORY_AND_DISK)  # filled by the first batch's broadcast, in its job

    def _empty(self, spark: SparkSession) -> DataFrame:
        return spark.createDataFrame([], f"key {self.spec.key_type.spark_type}")

    # -- writing -------------------------------------------------------------------------------------------
    def write(
        self, batch_keys: DataFrame, checkpoint_id: str, batch_id: int, offsets: OffsetRanges | None = None
    ) -> int | None:
        """Land this batch's side output (``key`` column, unique); None when the ledger shows it landed before.

        In memory, the keys join the set only here, so call it once the batch's sinks have landed: a batch
        retried after a failure must not see its own keys."""
        if self.in_memory:
            base = self._held if self._held is not None else self._empty(batch_keys.sparkSession)
            self._held = base.union(batch_keys.select("key")).distinct().localCheckpoint()
            return None
        import psycopg

        ledger_key = self.ledger_key(batch_id, checkpoint_id, offsets)
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                if self.landed(conn, ledger_key):
                    return None
        except psycopg.Error as error:
            raise self._error(f"looking up batch {batch_id}", error) from None
        writer = KeyWriter(
            dsn=self.dsn,
            statements=self._write_statements,
            params={"pipeline": self.pipeline.name, "checkpoint_id": checkpoint_id, "batch_id": batch_id},
            label=self.label,
        )
        from cdcsync.db.executor_errors import executor_error

        try:
            counts = batch_keys.select("key").mapInArrow(writer, "rows bigint").collect()
        except Exception as error:  # Spark wraps executor failures
            raise executor_error(error, f"{self.label}: writing batch {batch_id}") from None
        written = sum(int(row["rows"]) for row in counts)
        try:
            with psycopg.connect(self.dsn) as conn, conn.transaction():
                self.enter_fence(conn)
                conn.execute(self._ledger_record_sql, ledger_key)
                conn.execute(self._ledger_rows_sql, {**ledger_key, "rows_written": written})
        except psycopg.Error as error:
            raise self._error(f"recording batch {batch_id}", error) from None
        return written
