"""What to decode, and the shape of what decoding yields.

A :class:`DecodeSpec` travels to the executors with every task, so it is a frozen dataclass of tuples: picklable,
hashable (plans are cached per spec) and small.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcsync.config.types import PgType
from cdcsync.core.errors import DecodeError
from cdcsync.sources.debezium.envelope import CDC_COLUMNS, DLQ_COLUMNS

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.config.pipeline import KafkaSource
    from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess

_DECIMAL_TYPE_RE = re.compile(r"decimal\((\d+),(\d+)\)")


@dataclass(frozen=True)
class DecodeSpec:
    """What to decode: the source's business columns (declared order) and where its primary key comes from."""

    source_id: str
    columns: tuple[tuple[str, PgType], ...]
    primary_key: tuple[str, ...] | None = None
    """Key columns; ``None`` takes them from the fields of the Kafka message key."""
    format: str = "json"
    """``json`` (JsonConverter, :mod:`~cdcsync.sources.debezium.json`) or ``avro`` (Confluent wire format,
    :mod:`~cdcsync.sources.debezium.avro`)."""
    schema_registry: SchemaRegistryAccess | None = None
    """Where ``avro`` writer schemas come from (its secrets stay out of ``repr``); None for ``json``."""
    time_precision_mode: str = "adaptive"
    """The connector's ``time.precision.mode``: the unit of integer times in JSON messages without schemas."""
    detect_schema_changes: bool = False
    """Stop at a message whose schema (JSON wrapper, Avro writer schema) has a field the columns lack, or a
    recorded column of another type (:func:`schema_change_of`); the runtime sets it for every source."""
    schema_types: tuple[tuple[str, str], ...] = ()
    """Column -> the type its schema mapped to when ``cdcsync init`` read it (recorded in the migrations)."""

    @classmethod
    def from_source(
        cls,
        source_id: str,
        source: KafkaSource,
        schema_registry: SchemaRegistryAccess | None = None,
        schema_types: tuple[tuple[str, str], ...] = (),
    ) -> DecodeSpec:
        primary_key = tuple(source.primary_key) if source.primary_key else None
        return cls(
            source_id=source_id,
            columns=tuple(source.column_types().items()),
            primary_key=primary_key,
            format=source.format,
            # Only Avro sources carry the registry (and its credentials) to the executors.
            schema_registry=schema_registry if source.format == "avro" else None,
            time_precision_mode=source.time_precision_mode,
            detect_schema_changes=True,
            schema_types=schema_types,
        )


def output_fields(spec: DecodeSpec, dead_letters: bool) -> list[tuple[str, str]]:
    fields = [(name, pg_type.spark_type) for name, pg_type in spec.columns]
    return [*fields, *CDC_COLUMNS, *(DLQ_COLUMNS if dead_letters else ())]


def arrow_type(spark_type: str) -> pa.DataType:
    import pyarrow as pa

    simple = {
        "smallint": pa.int16(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "string": pa.string(),
        "binary": pa.binary(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "timestamp_ntz": pa.timestamp("us"),
    }
    if spark_type in simple:
        return simple[spark_type]
    match = _DECIMAL_TYPE_RE.fullmatch(spark_type)
    if match:
        return pa.decimal128(int(match.group(1)), int(match.group(2)))
    if spark_type.startswith("array<") and spark_type.endswith(">"):
        return pa.list_(arrow_type(spark_type[6:-1]))
    raise DecodeError(f"Spark type '{spark_type}' has no Arrow counterpart in the decoder")


def output_arrow_schema(spec: DecodeSpec, *, dead_letters: bool = True) -> pa.Schema:
    """The Arrow schema of the batches :func:`decode_batches` yields; matches :func:`output_spark_schema`."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(name, arrow_type(spark_type), nullable=True)
            for name, spark_type in output_fields(spec, dead_letters)
        ]
    )
