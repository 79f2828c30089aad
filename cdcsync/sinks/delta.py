"""Delta Lake sink: a mirror (one row per key) or a history (SCD type 2) table, exactly-once effects per batch.

Unlike the Postgres and ClickHouse sinks, nothing is written on the executors: a Delta table is written by Spark
itself, so the driver runs one ``MERGE`` per batch over the batch's decoded changes (a DataFrame the engine keeps
cached, :mod:`cdcsync.engine.graph`).

How a micro-batch lands:

1. :meth:`DeltaTableSink.prepare`: the Postgres ledger (the same as every sink's) skips a batch that landed.
2. :meth:`DeltaTableSink.merge_changes`: the changes, without truncates and tombstones (the delete before a
   tombstone carries the version), collapsed to the newest per key by ``_cdc_version`` (mirror) or kept whole
   (history), are MERGEd under Delta's idempotent-write options: the session conf
   ``spark.databricks.delta.write.txnAppId`` (``cdcsync/<pipeline>/<sink>/<checkpoint id>``) and ``txnVersion``
   (the batch id). Delta records the pair in the commit and skips a write whose version it already holds for that
   app id, so a batch replayed after the commit (a crash before step 3) changes nothing: the table's version does
   not advance.
3. The ledger row is recorded in Postgres.

Mirror: the MERGE overwrites only rows with an older ``_cdc_version``. ``delete_mode: hard`` removes a deleted key's
row and keeps its delete version in a tombstone table beside it (``<path>__cdcsync_tombstones``), merged first
under its own app id; changes older than a key's tombstone are dropped from the batch, so a replayed older change
never resurrects the key. A newer change of the key removes its tombstone. ``soft`` keeps the row, with
``_cdc_deleted = true`` and its version, which guards it the same way.

History: for every key the batch touches, the chain of the stored versions and the batch's new ones is recomputed
(``_valid_to`` = the next version's ``_valid_from``, ``_is_current`` on the newest unless it is a delete) and MERGEd
on (key, ``_cdc_version``): rows whose validity changed are updated, new versions inserted, in one commit, whatever
order the versions arrived in.

Debezium's placeholder for an unchanged TOASTed value, in every form the Postgres sinks recognise (text, json,
jsonb, hstore, bytea and the arrays that have one, :mod:`cdcsync.config.toast`): an older value of the same batch
is carried, else the MERGE keeps the stored one (mirrors; history rows take only the batch's carry).
"""

from __future__ import annotations

import itertools
import json
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcsync.config import toast
from cdcsync.config.toast import PLACEHOLDER_BYTES
from cdcsync.core.errors import MigrationError, SinkError
from cdcsync.core.names import KEY_MOVE_OP
from cdcsync.db.ledger import LedgeredSink
from cdcsync.migrations import delta as delta_migrations
from cdcsync.migrations.target import column_problems
from cdcsync.sinks import positions
from cdcsync.sql.render import delta_table_ref, render

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cdcsync.config.pipeline import DeltaSink, Pipeline

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
_VIEW_COUNTER = itertools.count()


class DeltaTableSink(LedgeredSink):
    """Driver side of one ``type: delta`` sink."""

    def __init__(self, pipeline: Pipeline, sink_id: str, sink: DeltaSink, dsn: str) -> None:
        super().__init__(pipeline, sink_id, dsn)
        self.sink = sink
        self.state = delta_migrations.sink_state(pipeline, sink)
        self.columns = tuple(pipeline.columns_of(sink.from_))
        self.primary_key = tuple(self.state["primary_key"])
        self.value_columns = tuple(c for c in self.columns if c not in self.primary_key)
        columns = pipeline.columns_of(sink.from_)
        kinds = toast.toastable({name: columns[name] for name in self.value_columns})
        self.carried = tuple(kinds)
        """Columns that may hold Debezium's placeholder (see the module doc)."""
        self.placeholders = {
            name: render(
                "delta/runtime/placeholder.sql.j2",
                kind=kind,
                spark_type=columns[name].spark_type,
                placeholder_hex=PLACEHOLDER_BYTES.hex(),
                **toast.TEMPLATE_VALUES,
            )
            for name, kind in kinds.items()
        }
        """Column -> the placeholder as a Spark SQL expression of the column's type."""
        self.location = self.state["location"]
        self.tombstones = delta_migrations.tombstone_table(self.state)

    @property
    def target_name(self) -> str:
        return delta_table_ref(self.location)

    def prepare(self, ledger_key: dict[str, Any]) -> bool:
        """False when the Postgres ledger already holds this batch with the same offset ranges."""
        return self.not_landed(ledger_key)

    def app_id(self, checkpoint_id: str, table: str = "") -> str:
        """The ``txnAppId`` of this sink's commits for one checkpoint (a reset checkpoint starts a new one)."""
        suffix = f"/{table}" if table else ""
        return f"cdcsync/{self.pipeline.name}/{self.sink_id}/{checkpoint_id}{suffix}"

    def merge_changes(self, ledger_key: dict[str, Any], changes: DataFrame) -> int | None:
        """MERGE one batch's changes (decoded rows, business and ``_cdc_*`` columns) and record it in the ledger;
        the rows the MERGE touched, or None when another attempt recorded the batch first."""
        batch_id = ledger_key["batch_id"]
        spark = changes.sparkSession
        rows = self._changes(changes)
        mark, seen = self._position_mark()
        found = positions.batch_positions(rows, mark, seen)
        if found.lowest is not None and mark is not None:
            raise positions.went_back(self.sink_id, self.pipeline.source_of(self.sink), mark, found.lowest, found.below)
        try:
            if self.sink.mode == "history":
                merged = self._merge_history(spark, rows, ledger_key)
            else:
                merged = self._merge_mirror(spark, rows, ledger_key)
        except SinkError:
            raise
        except Exception as error:  # Spark's and Delta's errors: py4j or pyspark exceptions
            raise self._spark_error(f"merging batch {batch_id} into {self.target_name}", error) from None
        if not self.record_landed(ledger_key, merged):
            return None
        self._save_positions(found)
        return merged

    # -- the source's positions (cdcsync.sinks.positions) ----------------------------------------------------
    def _position_mark(self) -> tuple[Decimal | None, Decimal | None]:
        """(the commit position of the newest change merged, the snapshot seen), or Nones before the first."""
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                return positions.read_mark(conn, self.pipeline.name, self.sink_id)
        except psycopg.Error as error:
            raise self._error("reading the source positions merged", error) from None

    def _save_positions(self, found: positions.BatchPositions) -> None:
        """Raise the mark after the batch landed (not atomic with Delta's commit: a crash in between leaves it
        lower, which only checks less)."""
        import psycopg

        if found.newest is None and found.snapshot is None:
            return
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                positions.save_mark(conn, self.pipeline.name, self.sink_id, found.newest, found.snapshot)
        except psycopg.Error as error:
            raise self._error("recording the source positions merged", error) from None

    # -- the batch's rows -----------------------------------------------------------------------------------
    def _changes(self, changes: DataFrame) -> DataFrame:
        """Changes that land: no truncates (not applied to Delta tables), no tombstones (versionless deletes), no
        key-move rows (the Postgres and ClickHouse sinks' bookkeeping of primary-key changes, :mod:`.key_moves`);
        placeholders replaced by an older value of the batch where there is one."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        rows = changes.where(~F.col("_cdc_op").isin("t", KEY_MOVE_OP) & F.col("_cdc_version").isNotNull())
        order = [F.col("_cdc_version").asc()]
        if "_cdc_offset" in changes.columns:
            order.append(F.col("_cdc_offset").asc())
        window = Window.partitionBy(*self.primary_key).orderBy(*order).rowsBetween(Window.unboundedPreceding, 0)
        for name in self.carried:
            holds = F.col(name).eqNullSafe(F.expr(self.placeholders[name]))
            # The newest older value that is not the placeholder (NULL included: a struct keeps it apart).
            known = F.last(F.when(~holds | F.col(name).isNull(), F.struct(F.col(name).alias("v"))), True).over(window)
            rows = rows.withColumn(name, F.when(holds & known.isNotNull(), known["v"]).otherwise(F.col(name)))
        keep = [*self.columns, "_cdc_op", "_cdc_version", "_cdc_ts"]
        return rows.select(*keep, *(["_cdc_offset"] if "_cdc_offset" in changes.columns else []))

    def _newest_per_key(self, rows: DataFrame) -> DataFrame:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        order = [F.col("_cdc_version").desc()]
        if "_cdc_offset" in rows.columns:
            order.append(F.col("_cdc_offset").desc())
        ranked = rows.withColumn(
            "_cdc_rank", F.row_number().over(Window.partitionBy(*self.primary_key).orderBy(*order))
        )
        return ranked.where(F.col("_cdc_rank") == 1).drop("_cdc_rank", "_cdc_offset")

    # -- mirror ---------------------------------------------------------------------------------------------
    def _merge_mirror(self, spark: SparkSession, rows: DataFrame, ledger_key: dict[str, Any]) -> int:
        from pyspark.sql import functions as F

        newest = self._newest_per_key(rows)
        view = _view_name("delta_mirror")
        values: dict[str, Any] = {
            "target": self.location,
            "source": view,
            "primary_key": self.primary_key,
            "value_columns": self.value_columns,
            "delete_mode": self.sink.delete_mode,
            "kept": self.placeholders,
        }
        if self.tombstones is not None:
            tombstones = _read(spark, self.tombstones["location"]).alias("d")
            joined = newest.alias("s").join(
                tombstones,
                [F.col(f"s.`{k}`").eqNullSafe(F.col(f"d.`{k}`")) for k in self.primary_key]
                + [F.col("d._cdc_version") > F.col("s._cdc_version")],
                "left_anti",
            )
            # Fixed now: the tombstone MERGE below must not change what this batch offers the table.
            newest = joined.localCheckpoint()
            newest.createOrReplaceTempView(view)
            tombstone_sql = render(
                "delta/runtime/merge_tombstones.sql.j2",
                tombstones=self.tombstones["location"],
                source=view,
                primary_key=self.primary_key,
            )
            self._idempotent(spark, tombstone_sql, self.app_id(ledger_key["checkpoint_id"], "tombstones"), ledger_key)
        else:
            newest.createOrReplaceTempView(view)
        try:
            sql = render("delta/runtime/merge_mirror.sql.j2", **values)
            return self._idempotent(spark, sql, self.app_id(ledger_key["checkpoint_id"]), ledger_key)
        finally:
            spark.catalog.dropTempView(view)

    # -- history --------------------------------------------------------------------------------------------
    def _merge_history(self, spark: SparkSession, rows: DataFrame, ledger_key: dict[str, Any]) -> int:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        key_version = [*self.primary_key, "_cdc_version"]
        fields = [*self.columns, "_cdc_op", "_cdc_version", "_cdc_ts"]
        batch = rows.drop("_cdc_offset").dropDuplicates(key_version).select(*fields)
        keys = batch.select(*self.primary_key).distinct()
        stored = _read(spark, self.location).join(keys, list(self.primary_key), "left_semi").select(*fields)
        new = batch.join(stored.select(*key_version), key_version, "left_anti")
        chain = stored.unionByName(new)
        window = Window.partitionBy(*self.primary_key).orderBy("_cdc_version")
        chain = (
            chain.withColumn("_valid_from", F.col("_cdc_ts"))
            .withColumn("_valid_to", F.lead("_cdc_ts").over(window))
            .withColumn("_is_current", F.lead("_cdc_version").over(window).isNull() & (F.col("_cdc_op") != "d"))
        )
        # Fixed now: the MERGE rewrites the stored rows this chain was computed from.
        chain = chain.localCheckpoint()
        view = _view_name("delta_history")
        chain.createOrReplaceTempView(view)
        try:
            sql = render(
                "delta/runtime/merge_history.sql.j2",
                target=self.location,
                source=view,
                primary_key=self.primary_key,
                value_columns=self.value_columns,
            )
            return self._idempotent(spark, sql, self.app_id(ledger_key["checkpoint_id"]), ledger_key)
        finally:
            spark.catalog.dropTempView(view)

    # -- Delta's idempotent writes --------------------------------------------------------------------------
    def _idempotent(self, spark: SparkSession, sql: str, app_id: str, ledger_key: dict[str, Any]) -> int:
        """Run one MERGE as the write (app id, batch id); the rows it touched (0 when Delta skipped it)."""
        spark.conf.set(TXN_APP_ID_CONF, app_id)
        spark.conf.set(TXN_VERSION_CONF, str(ledger_key["batch_id"]))
        try:
            result = spark.sql(sql).collect()
        finally:
            spark.conf.unset(TXN_APP_ID_CONF)
            spark.conf.unset(TXN_VERSION_CONF)
        return int(result[0][0] or 0) if result and len(result[0]) else 0

    def _spark_error(self, doing: str, error: Exception) -> SinkError:
        text = str(error).strip()
        message = text.splitlines()[0][:400] if text else type(error).__name__
        # Concurrent writers to one table (another job) fail a commit with a conflict: trying again helps.
        retriable = "Concurrent" in type(error).__name__ or "CONCURRENT" in text[:200] or "DELTA_CONCURRENT" in text
        failure = SinkError(f"{doing}: {message}", retriable=retriable)
        return failure.add_context(self.label)  # type: ignore[return-value]

    # -- startup check --------------------------------------------------------------------------------------
    def check_table(self, spark: SparkSession) -> None:
        """Refuse (exit 2) when the table (or its tombstone table) is missing or lacks a column the pipeline
        needs; extra columns are allowed."""
        tables = [(self.location, delta_migrations.table_columns(self.state))]
        if self.tombstones is not None:
            tables.append((self.tombstones["location"], self.tombstones["columns"]))
        for where, columns in tables:
            check_table(spark, self.sink_id, where, columns)


def check_table(spark: SparkSession, sink_id: str, where: dict[str, str], columns: list[dict[str, str]]) -> None:
    name = delta_table_ref(where)
    try:
        actual = {field.name: field.dataType.simpleString() for field in _read(spark, where).schema.fields}
    except Exception as error:
        text = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        raise MigrationError(
            f"sink '{sink_id}': Delta table {name} cannot be read: {text}",
            hint="run: cdcsync migrate PIPELINE.yaml (it creates the table)",
        ) from None
    problems = column_problems(columns, actual)
    if problems:
        raise MigrationError(
            f"sink '{sink_id}': Delta table {name} does not match the pipeline: " + "; ".join(problems),
            hint="the table was changed outside this pipeline's migrations: fix it, or change the pipeline to match",
        )


def _read(spark: SparkSession, where: dict[str, str]) -> DataFrame:
    if where.get("path") is not None:
        return spark.read.format("delta").load(where["path"])
    return spark.table(delta_table_ref(where))


def _view_name(kind: str) -> str:
    return f"cdcsync_{kind}_{next(_VIEW_COUNTER)}"


def table_summary(path: str) -> tuple[int, int] | None:
    """(version, live rows) of the Delta table at a local ``path``, from its transaction log alone (no Spark):
    the newest checkpoint, then the commits after it; rows from each live file's statistics, less the rows its
    deletion vector removes. None when there is no log there."""
    log = Path(path.removeprefix("file://")) / "_delta_log"
    if not log.is_dir():
        return None
    commits = sorted(int(p.name.split(".")[0]) for p in log.glob("*.json") if p.name.split(".")[0].isdigit())
    if not commits:
        return None
    files: dict[str, int] = {}
    start = -1
    last_checkpoint = log / "_last_checkpoint"
    if last_checkpoint.is_file():
        start = int(json.loads(last_checkpoint.read_text())["version"])
        files = _checkpoint_files(log, start)
    for version in (v for v in commits if v > start):
        for line in (log / f"{version:020d}.json").read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                files[action["add"]["path"]] = _live_rows(action["add"])
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
    return max(commits[-1], start), sum(files.values())


def _checkpoint_files(log: Path, version: int) -> dict[str, int]:
    import pyarrow.parquet as pq

    files: dict[str, int] = {}
    for part in sorted(log.glob(f"{version:020d}.checkpoint*.parquet")):
        for row in pq.read_table(part, columns=["add"]).column("add").to_pylist():
            if row is not None:
                files[row["path"]] = _live_rows(row)
    return files


def _live_rows(add: dict[str, Any]) -> int:
    stats = add.get("stats")
    records = int(json.loads(stats).get("numRecords", 0)) if stats else 0
    vector = add.get("deletionVector") or {}
    return records - int(vector.get("cardinality") or 0)
