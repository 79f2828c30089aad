"""The ``type: delta`` bounded source: a Delta table's snapshot (or its change feed, newest change per key) read
through the run's Spark session, in chunks of key ranges planned like a Postgres source's
(:mod:`cdcsync.sources.bounded`). Nothing here runs on the executors by hand: each chunk is a filtered Delta scan.

The snapshot is pinned when the backfill is planned: a given ``version`` or ``timestamp``, else the table's newest
version then, kept with the progress, so every chunk (after a restart too) reads the same snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcsync.config.bounded import DeltaTableSource
from cdcsync.config.types import PgType
from cdcsync.core.errors import ServiceError, first_line
from cdcsync.sources.bounded import Bound

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

_CHANGE_KINDS = {"insert": "c", "update_postimage": "u", "delete": "d"}
"""Delta's ``_change_type`` as Debezium's op; pre-images are dropped."""


def newest_version(spark: SparkSession, source: DeltaTableSource) -> int:
    """The table's newest version: what a snapshot without ``version``/``timestamp``, and a change feed, read up to."""
    from delta.tables import DeltaTable

    try:
        table = (
            DeltaTable.forName(spark, source.table)
            if source.table is not None
            else DeltaTable.forPath(spark, str(source.path))
        )
        return int(table.history(1).select("version").first()[0])  # type: ignore[index]
    except Exception as error:
        raise ServiceError(f"{source.label}: reading its newest version: {first_line(error)[:300]}") from None


def changes(
    spark: SparkSession,
    source: DeltaTableSource,
    columns: tuple[tuple[str, PgType], ...],
    key: tuple[str, ...],
    pinned: int,
) -> DataFrame:
    """The rows to backfill, typed as ``columns``, with ``_cdc_op``: the snapshot's rows (``c``), or the change
    feed's newest change per key from ``starting_version`` to ``pinned`` (``c``, ``u`` or ``d``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    reader = spark.read.format("delta")
    if source.change_data_feed:
        reader = reader.option("readChangeFeed", "true").option("startingVersion", source.starting_version)
        reader = reader.option("endingVersion", pinned)
    elif source.timestamp is not None:
        reader = reader.option("timestampAsOf", source.timestamp)
    else:
        reader = reader.option("versionAsOf", source.version if source.version is not None else pinned)
    frame = reader.table(source.table) if source.table is not None else reader.load(source.path)
    typed = [F.col(name).cast(pg.spark_type).alias(name) for name, pg in columns]
    if not source.change_data_feed:
        return frame.select(*typed, F.lit("c").alias("_cdc_op"))
    op = F.col("_change_type")
    kinds = F.create_map(*(F.lit(part) for pair in _CHANGE_KINDS.items() for part in pair))
    newest = Window.partitionBy(*key).orderBy(F.col("_commit_version").desc(), (op == "delete").asc())
    return (
        frame.where(op != "update_preimage")
        .withColumn("_cdc_rank", F.row_number().over(newest))
        .where(F.col("_cdc_rank") == 1)
        .select(*typed, kinds[op].alias("_cdc_op"))
    )


def key_bounds(rows: DataFrame, source: DeltaTableSource, key: tuple[str, ...]) -> list[list[str]]:
    """The first key of every ``chunk_size`` rows of ``rows``, in key order (one Spark job)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.orderBy(*key)
    numbered = rows.select(*key).withColumn("_cdc_row", F.row_number().over(order))
    firsts = numbered.where((F.col("_cdc_row") - 1) % source.chunk_size == 0).orderBy("_cdc_row")
    return [
        [str(row[name]) for name in key] for row in firsts.select(*(F.col(k).cast("string") for k in key)).collect()
    ]


def in_range(columns: tuple[tuple[str, PgType], ...], key: tuple[str, ...], lower: Bound, upper: Bound) -> Column:
    """The filter of one key range: the key as a struct, compared with the bounds cast back to its types."""
    from pyspark.sql import functions as F

    types = dict(columns)
    row = F.struct(*(F.col(name) for name in key))

    def bound(values: list[str]) -> Column:
        return F.struct(
            *(F.lit(value).cast(types[name].spark_type).alias(name) for name, value in zip(key, values, strict=True))
        )

    condition = F.lit(True)
    if lower is not None:
        condition = condition & (row >= bound(lower))
    if upper is not None:
        condition = condition & (row < bound(upper))
    return condition
