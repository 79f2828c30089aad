"""The pipeline YAML as typed models: sources, sinks and the :class:`Pipeline` that holds them.

Vocabulary follows Streamling (``sources`` / ``transforms`` / ``sinks``, ``from``, ``primary_key``) so that a
Streamling pipeline reads naturally here. A :class:`Pipeline` is only ever built by
:func:`cdcsync.config.load.load_pipeline` (or ``validate_pipeline_dict``), which checks every entry and across
entries before Spark starts (:mod:`cdcsync.config.checks`); what each model checks of itself is here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SkipValidation, field_validator, model_validator

from cdcsync.config import toast
from cdcsync.config.base import StrictModel as _Model
from cdcsync.config.base import as_key_list as _as_key_list
from cdcsync.config.bounded import (
    BoundedPlan,
    ClickHouseTableSource,
    DeltaTableSource,
    HybridSource,
    PostgresTableSource,
)
from cdcsync.config.code_transforms import CodeTransform
from cdcsync.config.operators import OPERATOR_SINK_TYPES, OperatorSink
from cdcsync.config.plan import PipelinePlan, TransformStep
from cdcsync.config.plugins import PluginSink, PluginTransform
from cdcsync.config.routing import check_pattern
from cdcsync.config.transforms import TransformModel
from cdcsync.config.types import PgType, parse_pg_type
from cdcsync.core import names

METADATA_COLUMNS: tuple[str, ...] = (
    "_cdc_op",
    "_cdc_version",
    "_cdc_ts",
    "_cdc_topic",
    "_cdc_partition",
    "_cdc_offset",
)
"""Columns every decoded change row carries beside the business columns (DESIGN.md, "Metadata columns")."""

RESERVED_COLUMNS: tuple[str, ...] = ("_batch_id", "_dlq_reason", "_dlq_report", "_dlq_key", "_dlq_value")
"""Used by staging tables and the decoder's dead-letter fields."""

POSTGRES_MAX_IDENTIFIER = 63


@dataclass(frozen=True)
class SourceSchema:
    """A source's columns as its topic's schema types them: read by ``cdcsync init`` (schema registry or the
    newest JsonConverter message) and recorded in the migrations' state, where ``validate`` and ``run`` find them
    without asking the registry or Kafka. Declared ``columns:`` override these types (see
    :meth:`KafkaSource.with_schema`)."""

    columns: tuple[tuple[str, str], ...]
    """(name, canonical Postgres type), in the schema's order."""
    primary_key: tuple[str, ...] | None = None
    """The fields of the message key's schema, the default ``primary_key``."""
    unmapped: tuple[tuple[str, str], ...] = ()
    """(name, why) of columns whose schema type maps to no Postgres type: they must be declared."""
    origin: str = ""
    """Where the schema was read (for messages)."""


NO_COLUMNS = (
    "not declared, and no migration records them: run `cdcsync init` (it reads them from the schema registry or "
    "the topic), or declare them"
)
TopicSchemas = dict[str, "SourceSchema | str"]
"""Topic -> its schema, or why it has none: the tables of a ``topic_pattern`` source."""
SchemaLookup = Callable[[str, str, "KafkaSource"], "SourceSchema | TopicSchemas | str | None"]
"""(pipeline name, source id, source) -> its schema, or why there is none (shown when it declares no columns);
for a ``topic_pattern`` source, the schema of each matching topic it knows."""


_PARTITION_SPLITTING_OPTIONS = frozenset({"minpartitions", "maxrecordsperpartition"})


class KafkaSource(_Model):
    """A Debezium changelog topic."""

    type: Literal["kafka"]
    topic: str | None = Field(default=None, min_length=1)
    topic_pattern: str | None = Field(default=None, min_length=1)
    """A regular expression matched against whole topic names (Spark's ``subscribePattern``): every matching topic
    is a source table of its own, routed by the sinks fed by this source (:mod:`cdcsync.config.routing`)."""
    format: Literal["json", "avro"] = "json"
    """``avro``: the Confluent wire format, writer schemas fetched by id from the schema registry."""
    primary_key: list[str] | None = None
    columns: dict[str, str] = Field(default_factory=dict)
    """Name -> Postgres type. Optional once ``cdcsync init`` has read the topic's schema; given, they override
    the types read from it (and add columns it lacks)."""
    schema_evolution: Literal["stop", "auto"] = "stop"
    """What ``run`` does when the topic's schema gains a column: ``stop`` (exit 2: run ``cdcsync init`` and
    ``cdcsync migrate``) or ``auto`` (write and apply that migration itself, then carry on)."""
    on_decode_error: Literal["dlq", "fail"] = "fail"
    """``fail`` (Kafka Connect's own default, ``errors.tolerance=none``): an undecodable message stops the run,
    naming it, before anything after it is merged. ``dlq`` records it in ``cdcsync.dead_letters`` and goes on, so
    the key's target row stays stale until ``cdcsync dead-letters replay`` applies it: a choice to make knowingly,
    not a default that forks a mirror silently."""
    time_precision_mode: Literal["adaptive", "adaptive_time_microseconds", "connect"] = "adaptive"
    """The connector's ``time.precision.mode``, for integer times and timestamps in JSON without schemas (with
    schemas, the logical type names say the unit): ``adaptive`` writes ``time(0-3)``/``timestamp(0-3)`` in
    milliseconds and finer ones in microseconds, ``adaptive_time_microseconds`` every ``time`` in microseconds,
    ``connect`` everything in milliseconds."""
    replica_identity: Literal["default", "full"] = "default"
    """The source table's ``REPLICA IDENTITY`` (``default`` covers ``DEFAULT`` and ``USING INDEX``). Only with
    ``FULL`` does Debezium send every value of an update; otherwise a large (TOASTed) value the update left
    unchanged arrives as a placeholder, which limits what transforms may compute from it (docs/transforms.md)."""
    untoasted_columns: list[str] = Field(default_factory=list)
    """Columns whose values always stay under Postgres' TOAST threshold (about 2 kB), so that Debezium always
    sends them: transforms may filter and compute on them, and arrays of them need no placeholder."""
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)
    options: dict[str, str] = Field(default_factory=dict)
    """Native Kafka consumer / Spark Kafka source options passed through verbatim (e.g. ``kafka.security.protocol``)."""

    _normalise_pk = field_validator("primary_key", mode="before")(_as_key_list)

    @model_validator(mode="after")
    def _one_subscription(self) -> KafkaSource:
        if self.topic is None and self.topic_pattern is None:
            raise ValueError("topic: required key is missing (or topic_pattern, to read every matching topic)")
        if self.topic is not None and self.topic_pattern is not None:
            raise ValueError("topic_pattern: give either topic (one topic) or topic_pattern (many topics), not both")
        return self

    @field_validator("topic_pattern")
    @classmethod
    def _pattern_compiles(cls, pattern: str | None) -> str | None:
        problem = check_pattern(pattern) if pattern is not None else None
        if problem is not None:
            raise ValueError(problem)
        return pattern

    @field_validator("options")
    @classmethod
    def _one_task_per_partition(cls, options: dict[str, str]) -> dict[str, str]:
        # Within a batch, a key's changes are ordered, collapsed and their TOAST placeholders filled by the one
        # task that reads its partition; Spark options that split a partition's offsets over several tasks would
        # let a key's changes race each other in different tasks.
        for name in options:
            if name.lower() in _PARTITION_SPLITTING_OPTIONS:
                raise ValueError(
                    f"'{name}' is not supported: it splits one Kafka partition over several Spark tasks, and cdcsync "
                    "orders each key's changes within the task that reads its partition; to use more cores, give "
                    "the topic more partitions"
                )
        return options

    @field_validator("columns")
    @classmethod
    def _column_types_parse(cls, columns: dict[str, str]) -> dict[str, str]:
        for name, type_text in columns.items():
            if not isinstance(type_text, str):
                raise ValueError(f"column '{name}': type must be a string such as 'bigint'")
        return columns

    def column_types(self) -> dict[str, PgType]:
        return {name: parse_pg_type(type_text) for name, type_text in self.columns.items()}

    def placeholder_columns(self) -> dict[str, str]:
        """Value columns whose unchanged large values Debezium may send as its placeholder, by kind
        (:mod:`cdcsync.config.toast`): none under ``replica_identity: full``."""
        if self.replica_identity == "full":
            return {}
        exempt = {*self.untoasted_columns, *(self.primary_key or [])}
        return toast.toastable(self.column_types(), exempt)

    def adds_nothing(self, schema: SourceSchema) -> bool:
        """True when the declaration already says all ``schema`` says (every column, the key): the declared
        columns stand as they are then, and nothing is recorded, so fully declared pipelines keep the migrations
        they always had."""
        names = {name for name, _ in (*schema.columns, *schema.unmapped)}
        return names <= set(self.columns) and (self.primary_key is not None or not schema.primary_key)

    def with_schema(self, schema: SourceSchema) -> KafkaSource:
        """This source with the columns of ``schema`` (in its order), declared types winning, declared columns
        the schema lacks after them; the key defaults to the schema's message key."""
        columns = {name: self.columns.get(name, type_text) for name, type_text in schema.columns}
        for name, type_text in self.columns.items():
            columns.setdefault(name, type_text)
        primary_key = self.primary_key or (list(schema.primary_key) if schema.primary_key else None)
        return self.model_copy(update={"columns": columns, "primary_key": primary_key})


class PostgresSink(_Model):
    """A mirror table: one row per primary key, newest version wins."""

    type: Literal["postgres"]
    from_: str = Field(alias="from", min_length=1)
    schema_: str = Field(default="public", alias="schema", min_length=1)
    table: str = Field(min_length=1)
    primary_key: list[str] | None = None
    delete_mode: Literal["hard", "soft"] = "hard"
    on_truncate: Literal["apply", "ignore"] = "apply"
    """``apply``: a source TRUNCATE empties the table (in version order with the changes around it)."""

    _normalise_pk = field_validator("primary_key", mode="before")(_as_key_list)


class RoutedPostgresSink(PostgresSink):
    """One table of a routed sink (a ``type: postgres`` sink fed by a ``topic_pattern`` source): made by
    validation, one per topic, with ``schema`` and ``table`` rendered from the declared templates."""

    routed_from: str
    """The declared sink's id."""
    topic: str


class GroupColumn(_Model):
    """One ``group_by`` entry: a column of the aggregation table's key."""

    from_: str | None = Field(default=None, alias="from", min_length=1)
    """The input column; defaults to the entry's name."""
    type: str | None = None
    """Postgres type of the key column; defaults to the input column's type."""


AggregateFunction = Literal["sum", "count", "avg", "min", "max"]


class AggregateColumn(_Model):
    """One ``aggregate`` entry: a column of the aggregation table kept by the triggers."""

    fn: AggregateFunction
    from_: str | None = Field(default=None, alias="from", min_length=1)
    """The input column; defaults to the entry's name, except that ``count`` without ``from`` counts rows."""
    type: str | None = None
    """Postgres type of the stored value; defaults to the type Postgres' own aggregate function returns."""


def _as_group_mapping(value: Any) -> Any:
    """``group_by: [a, b]`` and ``group_by: {a: }`` are shorthands for ``{a: {}, b: {}}``."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        return {name: {} for name in value}
    if isinstance(value, dict):
        return {name: {} if entry is None else entry for name, entry in value.items()}
    return value


class PostgresAggregateSink(_Model):
    """Streamling's ``postgres_aggregate``: a keyed landing table plus an aggregation table kept by triggers.

    The landing table is a hard-delete mirror written through the same ledgered merge as ``type: postgres``;
    statement-level triggers on it maintain ``agg_table`` (see ``templates/postgres/aggregate.sql.j2``).
    """

    type: Literal["postgres_aggregate"]
    from_: str = Field(alias="from", min_length=1)
    schema_: str = Field(default="public", alias="schema", min_length=1)
    landing_table: str = Field(min_length=1)
    agg_table: str = Field(min_length=1)
    primary_key: list[str] | None = None
    group_by: dict[str, GroupColumn] = Field(default_factory=dict)
    aggregate: dict[str, AggregateColumn] = Field(min_length=1)
    empty_groups: Literal["delete", "keep"] = "delete"
    on_truncate: Literal["apply", "ignore"] = "apply"
    """``apply``: a source TRUNCATE empties the landing table, and so every group."""
    batch_size: int | None = Field(default=None, gt=0)
    """Accepted for Streamling compatibility; each micro-batch is merged as one transaction whatever its size."""
    batch_flush_interval: str | None = None
    """Accepted for Streamling compatibility; the stream's trigger decides when a micro-batch is merged."""

    _normalise_pk = field_validator("primary_key", mode="before")(_as_key_list)
    _normalise_groups = field_validator("group_by", mode="before")(_as_group_mapping)

    @property
    def table(self) -> str:
        """The keyed table the ledgered merge writes: the landing table."""
        return self.landing_table

    @property
    def delete_mode(self) -> Literal["hard"]:
        """Landing rows are deleted when their source row is, so that the triggers retract them."""
        return "hard"


_CH_SETTING_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ClickHouseSink(_Model):
    """Streamling's ``clickhouse`` sink, on a ``ReplacingMergeTree(_version, _is_deleted)`` table that a migration
    creates (``templates/clickhouse/table.sql.j2``) and ``cdcsync run`` checks at start.

    ``partition_by`` and ``ttl`` are ClickHouse expressions, written into the DDL as given (a DBA reviews the
    migration); they may not contain ``;`` or comments. ``settings`` become the table's ``SETTINGS``.
    """

    type: Literal["clickhouse"]
    from_: str = Field(alias="from", min_length=1)
    database: str = Field(default="default", min_length=1)
    table: str = Field(min_length=1)
    primary_key: list[str] | None = None
    compression: Literal["none", "gzip", "lz4", "zstd"] = "none"
    """Compression of the insert bodies (clickhouse-connect's ``compress``)."""
    compression_level: int | None = Field(default=None, ge=0, le=9)
    """Accepted for Streamling compatibility; clickhouse-connect picks the level itself."""
    append_only_mode: bool = True
    """True: deletes are rows with ``_is_deleted = 1``. False: deletes are lightweight ``DELETE``s of the key."""
    partition_by: str | None = None
    ttl: str | None = None
    settings: dict[str, str | int | float | bool] = Field(default_factory=dict)
    low_cardinality: list[str] = Field(default_factory=list)
    legacy_server: bool = False
    """For ClickHouse older than 23.2: ``ReplacingMergeTree(_version)`` plus a view hiding deleted rows."""
    view: str | None = None
    """The view ``legacy_server`` creates; defaults to ``<table>_current``."""

    _normalise_pk = field_validator("primary_key", mode="before")(_as_key_list)
    _normalise_lc = field_validator("low_cardinality", mode="before")(_as_key_list)

    @field_validator("partition_by", "ttl")
    @classmethod
    def _plain_expression(cls, value: str | None) -> str | None:
        if value is not None and (";" in value or "--" in value or "/*" in value or not value.strip()):
            raise ValueError("must be one ClickHouse expression, without ';' or comments")
        return value

    @field_validator("settings")
    @classmethod
    def _setting_names(cls, settings: dict[str, Any]) -> dict[str, Any]:
        for name in settings:
            if not _CH_SETTING_RE.match(name):
                raise ValueError(f"'{name}' is not a ClickHouse setting name")
        return settings

    @property
    def view_name(self) -> str | None:
        """The view hiding deleted rows (legacy servers only)."""
        return (self.view or f"{self.table}_current") if self.legacy_server else None


_DELTA_LOCATION_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DELTA_SCHEMES = ("file", "s3a", "abfss", "gs", "hdfs", "dbfs")


class DeltaSink(_Model):
    """A Delta Lake table written through the run's own Spark session (:mod:`cdcsync.sinks.delta`).

    ``mode: mirror`` keeps one row per key like a Postgres mirror; ``mode: history`` keeps every version of each
    key (SCD type 2). The table is created by a migration (``migrations/<pipeline>/delta/``) and checked at start.
    """

    type: Literal["delta"]
    from_: str = Field(alias="from", min_length=1)
    path: str | None = Field(default=None, min_length=1)
    """Where the table lives: a local directory, or a URI Spark's Hadoop conf can reach (``s3a://``,
    ``abfss://``, ``gs://``; credentials through ``spark.conf``, see docs/delta.md)."""
    table: str | None = Field(default=None, min_length=1)
    """A catalog table (``name`` or ``database.name``) instead of a path."""
    primary_key: list[str] | None = None
    partition_by: list[str] = Field(default_factory=list)
    mode: Literal["mirror", "history"] = "mirror"
    delete_mode: Literal["hard", "soft"] = "hard"
    """Mirror only. ``hard``: a delete removes the row, and the key's delete version is kept in a tombstone table
    beside it so that an older change replayed later cannot bring the key back. ``soft``: the row stays, with
    ``_cdc_deleted = true``."""
    change_data_feed: bool = True
    """``delta.enableChangeDataFeed`` on the table, so that others can read its row-level changes."""
    properties: dict[str, str] = Field(default_factory=dict)
    """More table properties (``TBLPROPERTIES``), e.g. ``delta.logRetentionDuration``."""

    _normalise_pk = field_validator("primary_key", mode="before")(_as_key_list)
    _normalise_partitions = field_validator("partition_by", mode="before")(_as_key_list)

    @model_validator(mode="after")
    def _one_location(self) -> DeltaSink:
        if self.path is None and self.table is None:
            raise ValueError("path: required key is missing (or table, for a catalog table)")
        if self.path is not None and self.table is not None:
            raise ValueError("table: give either path (a directory or URI) or table (a catalog table), not both")
        if self.mode == "history" and "delete_mode" in self.model_fields_set:
            raise ValueError("delete_mode: only for mode: mirror (a history table keeps deletes as rows)")
        return self

    @field_validator("path")
    @classmethod
    def _known_scheme(cls, path: str | None) -> str | None:
        if path is not None and _DELTA_LOCATION_RE.match(path):
            scheme = path.split("://", 1)[0].lower()
            if scheme not in _DELTA_SCHEMES:
                raise ValueError(f"scheme '{scheme}://' is not one of {', '.join(s + '://' for s in _DELTA_SCHEMES)}")
        return path

    @field_validator("table")
    @classmethod
    def _table_name(cls, table: str | None) -> str | None:
        if table is not None:
            parts = table.split(".")
            if len(parts) > 3 or any(not part or "`" in part or any(ord(c) < 32 for c in part) for part in parts):
                raise ValueError("must be 'name', 'database.name' or 'catalog.database.name', without '`'")
        return table

    @field_validator("properties")
    @classmethod
    def _property_names(cls, properties: dict[str, str]) -> dict[str, str]:
        for name, value in properties.items():
            if not isinstance(value, str):
                raise ValueError(f"'{name}': values are strings (quote them in YAML)")
            if name.lower() == "delta.enablechangedatafeed":
                raise ValueError(f"'{name}': set change_data_feed instead")
        return properties

    @property
    def target_name(self) -> str:
        """How messages name the table."""
        return self.table if self.table is not None else f"delta.`{self.path}`"


def internal_tables(pipeline_name: str, sink_id: str, sink: PostgresSink | PostgresAggregateSink) -> tuple[str, str]:
    """The staging and tombstone tables of a Postgres sink, in the internal schema. A routed table's names are
    readable and of bounded length: the declared sink id and the target table (not the topic)."""
    if isinstance(sink, RoutedPostgresSink):
        parts = (pipeline_name, sink.routed_from, sink.schema_, sink.table)
        return names.bounded(*parts, "stage"), names.bounded(*parts, "tombstones")
    return names.stage_table(pipeline_name, sink_id), names.tombstone_table(pipeline_name, sink_id)


class RoutedClickHouseSink(ClickHouseSink):
    """One table of a routed ``clickhouse`` sink (see :class:`RoutedPostgresSink`)."""

    routed_from: str
    topic: str


AnySink = PostgresSink | PostgresAggregateSink
"""Sinks that land in Postgres through the ledgered merge."""
SinkModel = PostgresSink | PostgresAggregateSink | ClickHouseSink | DeltaSink | OperatorSink | PluginSink

SOURCE_TYPES: dict[str, type[_Model]] = {
    "kafka": KafkaSource,
    "postgres": PostgresTableSource,
    "clickhouse": ClickHouseTableSource,
    "delta": DeltaTableSource,
    "hybrid": HybridSource,
}
SINK_TYPES: dict[str, type[_Model]] = {
    "postgres": PostgresSink,
    "postgres_aggregate": PostgresAggregateSink,
    "clickhouse": ClickHouseSink,
    "delta": DeltaSink,
    **OPERATOR_SINK_TYPES,
}
PLANNED_SINK_TYPES = ("dynamic_table",)


class Pipeline(_Model):
    name: str
    sources: dict[str, KafkaSource]
    """Kafka sources, the Kafka phase of hybrid sources included; bounded sources alone are in ``bounded``."""
    job_mode: bool = False
    """End the run after the bounded phases (every source must be bounded or hybrid)."""
    transforms: dict[str, TransformModel | PluginTransform | CodeTransform] = Field(default_factory=dict)
    sinks: dict[str, SinkModel]
    path: Path | None = Field(default=None, exclude=True)
    plan: SkipValidation[PipelinePlan] = Field(default_factory=PipelinePlan, exclude=True)
    """The transform graph as validated; the runtime executes it (:mod:`cdcsync.config.plan`)."""

    def root_of(self, node_id: str) -> str:
        """The source whose micro-batches feed ``node_id`` (a source, or a SQL transform)."""
        return self.plan.source_of_node.get(node_id, node_id)

    source_schemas: dict[str, SourceSchema] = Field(default_factory=dict, exclude=True)
    """The schemas the sources' columns were completed from (recorded by ``init``), by source id."""
    routes: dict[str, dict[str, str]] = Field(default_factory=dict, exclude=True)
    """``topic_pattern`` source id -> topic -> the id of that table's source (also in ``sources``)."""
    routed_sinks: dict[str, PostgresSink | ClickHouseSink] = Field(default_factory=dict, exclude=True)
    """Routed sinks as declared, by id; ``sinks`` holds one :class:`RoutedPostgresSink` per table instead."""
    bounded: SkipValidation[dict[str, BoundedPlan]] = Field(default_factory=dict, exclude=True)
    """The bounded phases of hybrid sources and bounded sources alone, by source id (:mod:`cdcsync.config.bounded`)."""

    def streams(self) -> dict[str, KafkaSource]:
        """The sources read by a streaming query each: all but the tables of ``topic_pattern`` sources, which
        their pattern source's query reads."""
        tables = {table_id for route in self.routes.values() for table_id in route.values()}
        return {source_id: source for source_id, source in self.sources.items() if source_id not in tables}

    def stream_of(self, source_id: str) -> str:
        """The source whose query reads ``source_id``: its pattern source for a table, else itself."""
        for pattern_id, route in self.routes.items():
            if source_id in route.values():
                return pattern_id
        return source_id

    def source_of(self, sink: SinkModel) -> KafkaSource:
        """The source whose micro-batches feed ``sink``, through any transforms (the runtime groups sinks by it)."""
        return self.sources[self.root_of(sink.from_)]

    def step_of(self, node_id: str) -> TransformStep | None:
        """The SQL transform ``node_id``, as planned; None for a source."""
        return next((step for step in self.plan.steps if step.id == node_id), None)

    def columns_of(self, node_id: str) -> dict[str, PgType]:
        """Business columns of a source or SQL transform, in order (the ``_cdc_*`` columns are implied)."""
        step = self.step_of(node_id) or self.plan.plugin_steps.get(node_id) or self.plan.plugin_sources.get(node_id)
        if step is None and node_id not in self.sources and node_id in self.bounded:
            return dict(self.bounded[node_id].columns)
        return dict(step.columns) if step is not None else self.sources[node_id].column_types()

    def primary_key_of(self, node_id: str) -> list[str] | None:
        step = self.step_of(node_id) or self.plan.plugin_steps.get(node_id) or self.plan.plugin_sources.get(node_id)
        if step is None and node_id not in self.sources and node_id in self.bounded:
            return list(self.bounded[node_id].primary_key)
        return list(step.primary_key) if step is not None else self.sources[node_id].primary_key

    def postgres_sinks(self) -> dict[str, AnySink]:
        """The sinks that land in Postgres (mirrors and aggregations)."""
        return {sid: s for sid, s in self.sinks.items() if isinstance(s, PostgresSink | PostgresAggregateSink)}

    def clickhouse_sinks(self) -> dict[str, ClickHouseSink]:
        """The sinks that land in ClickHouse; only a pipeline with some needs a ClickHouse server at all."""
        return {sid: s for sid, s in self.sinks.items() if isinstance(s, ClickHouseSink)}

    def delta_sinks(self) -> dict[str, DeltaSink]:
        """The sinks that land in Delta tables; only a pipeline with some has ``delta`` migrations."""
        return {sid: s for sid, s in self.sinks.items() if isinstance(s, DeltaSink)}

    def sink_primary_key(self, sink: SinkModel) -> list[str]:
        """The sink's key: its own ``primary_key``, else its input's (validation guarantees one exists)."""
        key = sink.primary_key or self.primary_key_of(sink.from_)
        assert key is not None, "validated pipelines always have a sink key"
        return key

    def sinks_of(self, source_id: str) -> dict[str, SinkModel]:
        """Sinks fed by ``source_id``'s micro-batches, directly or through transforms (for a ``topic_pattern``
        source: the sinks of all of its tables)."""
        return {
            sink_id: sink
            for sink_id, sink in self.sinks.items()
            if self.stream_of(self.root_of(sink.from_)) == source_id
        }
