"""The decoder's entry points: a spec's plan by format, the ``mapInArrow`` body, and its Spark schema.

:func:`decode_batches` is the body of a Spark ``mapInArrow`` call, so everything it reaches runs on executors:
pure Python plus pyarrow, picklable, and it never raises for bad input. A message that cannot be decoded becomes
a *dead-letter row*: business and ``_cdc_*`` value columns null, ``_cdc_topic`` / ``_cdc_partition`` /
``_cdc_offset`` set, ``_dlq_reason`` saying what is wrong, ``_dlq_report`` the same as a
:class:`~cdcsync.core.reports.Report` (a schema change is one too: the task stops the batch at it), and
``_dlq_key`` / ``_dlq_value`` holding the raw bytes. Good rows have the ``_dlq_*`` columns null. A tombstone (null
value) is a delete of its key with a null ``_cdc_version`` (``RowPlan.decode_tombstone``);
one without a key produces no row.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import TYPE_CHECKING

from cdcsync.core.errors import DecodeError
from cdcsync.sources.debezium.json import JsonPlan
from cdcsync.sources.debezium.plan import RowPlan
from cdcsync.sources.debezium.spec import DecodeSpec, output_fields

if TYPE_CHECKING:
    import pyarrow as pa


@lru_cache(maxsize=64)
def plan_for(spec: DecodeSpec) -> RowPlan:
    """The spec's plan, built once per executor process (it compiles a row decoder and caches schemas)."""
    if spec.format == "avro":
        from cdcsync.sources.debezium.avro import AvroPlan

        return AvroPlan(spec)
    if spec.format != "json":
        raise DecodeError(f"source '{spec.source_id}': format '{spec.format}' is not one of json, avro")
    return JsonPlan(spec)


def decode_batches(batches: Iterator[pa.RecordBatch], spec: DecodeSpec) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body (one call is one Spark task): Kafka source batches (key, value, topic, partition,
    offset, timestamp, ...) in, decoded change rows and dead letters out (schema
    :func:`~cdcsync.sources.debezium.spec.output_arrow_schema`). Never raises for bad input."""
    plan = plan_for(spec)
    plan.begin_task()
    for batch in batches:
        if batch.num_rows == 0:
            continue
        out = plan.decode_batch(batch)
        if out.num_rows:
            yield out


def _quote_ddl(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def output_spark_schema(spec: DecodeSpec, *, dead_letters: bool = True) -> str:
    """Spark DDL of :func:`decode_batches`' output: business columns, ``_cdc_*``, then ``_dlq_*`` (unless
    ``dead_letters`` is false: the changes alone, as :class:`~cdcsync.sources.kafka.DecodeTask` passes them on).

    Also checks the spec (every type decodable, key columns declared) so that a bad one fails on the driver
    with a :class:`~cdcsync.core.errors.DecodeError`, before Spark ships it to executors."""
    plan_for(spec)
    return ", ".join(f"{_quote_ddl(name)} {spark_type}" for name, spark_type in output_fields(spec, dead_letters))
