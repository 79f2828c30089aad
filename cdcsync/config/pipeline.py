"""The pipeline YAML: typed, validated in one place, every problem reported with its exact YAML path.

Vocabulary follows Streamling (``sources`` / ``transforms`` / ``sinks``, ``from``, ``primary_key``) so that a
Streamling pipeline reads naturally here. Validation runs before Spark starts: :func:`load_pipeline` either
returns a fully checked :class:`Pipeline` or raises :class:`~cdcsync.core.errors.ConfigError` listing *every*
problem as ``path.to.key: what is wrong``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SkipValidation, ValidationError, field_validator, model_validator

from cdcsync.config.aggregate import resolve as resolve_aggregation
from cdcsync.config.base import StrictModel as _Model
from cdcsync.config.base import as_key_list as _as_key_list
from cdcsync.config.plan import PipelinePlan, TransformStep
from cdcsync.config.routing import check_pattern, placeholders, render_name, table_sink_id, table_source_id
from cdcsync.config.transforms import TRANSFORM_TYPES, DynamicTable, SqlTransform, TransformModel
from cdcsync.config.types import PgType, UnknownTypeError, parse_pg_type
from cdcsync.core import names
from cdcsync.core.errors import ConfigError

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
_PIPELINE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


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
    on_decode_error: Literal["dlq", "fail"] = "dlq"
    time_precision_mode: Literal["adaptive", "adaptive_time_microseconds", "connect"] = "adaptive"
    """The connector's ``time.precision.mode``, for integer times and timestamps in JSON without schemas (with
    schemas, the logical type names say the unit): ``adaptive`` writes ``time(0-3)``/``timestamp(0-3)`` in
    milliseconds and finer ones in microseconds, ``adaptive_time_microseconds`` every ``time`` in microseconds,
    ``connect`` everything in milliseconds."""
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

    @field_validator("columns")
    @classmethod
    def _column_types_parse(cls, columns: dict[str, str]) -> dict[str, str]:
        for name, type_text in columns.items():
            if not isinstance(type_text, str):
                raise ValueError(f"column '{name}': type must be a string such as 'bigint'")
        return columns

    def column_types(self) -> dict[str, PgType]:
        return {name: parse_pg_type(type_text) for name, type_text in self.columns.items()}

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
SinkModel = PostgresSink | PostgresAggregateSink | ClickHouseSink

SOURCE_TYPES: dict[str, type[_Model]] = {"kafka": KafkaSource}
SINK_TYPES: dict[str, type[_Model]] = {
    "postgres": PostgresSink,
    "postgres_aggregate": PostgresAggregateSink,
    "clickhouse": ClickHouseSink,
}
PLANNED_SINK_TYPES = ("dynamic_table", "delta", "print")


class Pipeline(_Model):
    name: str
    sources: dict[str, KafkaSource]
    transforms: dict[str, TransformModel] = Field(default_factory=dict)
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
        step = self.step_of(node_id)
        return dict(step.columns) if step is not None else self.sources[node_id].column_types()

    def primary_key_of(self, node_id: str) -> list[str] | None:
        step = self.step_of(node_id)
        return list(step.primary_key) if step is not None else self.sources[node_id].primary_key

    def postgres_sinks(self) -> dict[str, AnySink]:
        """The sinks that land in Postgres (mirrors and aggregations)."""
        return {sid: s for sid, s in self.sinks.items() if not isinstance(s, ClickHouseSink)}

    def clickhouse_sinks(self) -> dict[str, ClickHouseSink]:
        """The sinks that land in ClickHouse; only a pipeline with some needs a ClickHouse server at all."""
        return {sid: s for sid, s in self.sinks.items() if isinstance(s, ClickHouseSink)}

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


# --------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------


def _path(*parts: Any) -> str:
    return ".".join(str(p) for p in parts if p != "")


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _pydantic_problems(prefix: str, error: ValidationError, model: type[BaseModel]) -> list[str]:
    """Turn pydantic's errors into ``yaml.path: message`` lines with friendlier wording."""
    problems = []
    allowed = sorted(f.alias or name for name, f in model.model_fields.items() if name != "path")
    for item in error.errors():
        loc = list(item["loc"])
        path = _path(prefix, *loc)
        kind = item["type"]
        if kind == "extra_forbidden":
            key = str(loc[-1])
            message = f"unknown key{_did_you_mean(key, allowed)}; allowed keys: {', '.join(allowed)}"
        elif kind == "missing":
            message = "required key is missing"
        elif kind == "literal_error":
            expected = str(item.get("ctx", {}).get("expected", "")).replace("'", "").replace(" or ", ", ")
            message = f"{item['input']!r} is not one of {expected}"
        else:
            message = item["msg"].removeprefix("Value error, ")
            key, _, rest = message.partition(": ")
            if not loc and key in model.model_fields:  # a model validator's finding about one key
                path, message = _path(prefix, key), rest
        problems.append(f"{path}: {message}")
    return problems


def _validate_entry(
    section: str, entry_id: str, raw: Any, registry: dict[str, type[_Model]], planned: tuple[str, ...]
) -> tuple[_Model | None, list[str]]:
    where = _path(section, entry_id)
    if not isinstance(raw, dict):
        return None, [f"{where}: expected a mapping of keys, got {type(raw).__name__}"]
    kind = raw.get("type")
    if kind is None:
        return None, [f"{where}.type: required key is missing; one of {', '.join(registry)}"]
    if kind not in registry:
        if kind in planned:
            return None, [f"{where}.type: '{kind}' is not available in this version of cdcsync yet"]
        choices = list(registry) + list(planned)
        return None, [f"{where}.type: '{kind}' is not one of {', '.join(registry)}{_did_you_mean(str(kind), choices)}"]
    model = registry[kind]
    try:
        return model.model_validate(raw), []
    except ValidationError as error:
        return None, _pydantic_problems(where, error, model)


def _check_identifier(path: str, name: str, problems: list[str]) -> None:
    if len(name.encode()) > POSTGRES_MAX_IDENTIFIER:
        problems.append(f"{path}: '{name}' is longer than Postgres' {POSTGRES_MAX_IDENTIFIER}-byte identifier limit")
    if any(ord(ch) < 32 for ch in name):
        problems.append(f"{path}: identifiers cannot contain control characters")


def _check_source(source_id: str, source: KafkaSource, problems: list[str]) -> None:
    where = _path("sources", source_id)
    if source.topic_pattern is not None:
        for key, given in (("columns", source.columns), ("primary_key", source.primary_key)):
            if given:
                problems.append(
                    f"{where}.{key}: not supported with topic_pattern: each table's columns and key come from its "
                    "own topic (run `cdcsync init`); read a table that needs them with a source of its own (topic:)"
                )
    for name, type_text in source.columns.items():
        _check_identifier(f"{where}.columns.{name}", name, problems)
        if name in METADATA_COLUMNS or name.startswith("_cdc_") or name in RESERVED_COLUMNS:
            problems.append(
                f"{where}.columns.{name}: names starting with '_cdc_' and {', '.join(RESERVED_COLUMNS)} are reserved"
            )
        try:
            parse_pg_type(type_text)
        except UnknownTypeError as error:
            problems.append(f"{where}.columns.{name}: {error}")
    for key in source.primary_key or []:
        if key not in source.columns:
            problems.append(
                f"{where}.primary_key: column '{key}' is not in the source's columns"
                f"{_did_you_mean(key, list(source.columns))}"
            )
    if source.primary_key is not None and len(set(source.primary_key)) != len(source.primary_key):
        problems.append(f"{where}.primary_key: a column is listed twice")
    for option in source.options:
        if option in {"subscribe", "subscribePattern", "assign", "includeHeaders"}:
            problems.append(f"{where}.options.{option}: set by cdcsync itself; use 'topic' or 'topic_pattern'")


@dataclass(frozen=True)
class _Inputs:
    """What sinks may read: sources and planned SQL transforms with their columns, and what to stay quiet about."""

    columns: dict[str, dict[str, PgType]]
    primary_keys: dict[str, list[str] | None]
    transforms: set[str]
    dynamic_tables: set[str]
    invalid: set[str]
    """Declared sources and transforms whose own definition has problems (already reported)."""

    def describe(self, node_id: str) -> str:
        return f"{'transform' if node_id in self.transforms else 'source'} '{node_id}'"


def _check_sink(pipeline_name: str, sink_id: str, sink: SinkModel, inputs: _Inputs, problems: list[str]) -> None:
    where = _path("sinks", sink_id)
    if isinstance(sink, ClickHouseSink):
        _check_clickhouse_names(where, sink, problems)
    elif isinstance(sink, PostgresAggregateSink):
        _check_identifier(f"{where}.schema", sink.schema_, problems)
        _check_identifier(f"{where}.landing_table", sink.landing_table, problems)
        _check_identifier(f"{where}.agg_table", sink.agg_table, problems)
        for name in [*sink.group_by, *sink.aggregate]:
            _check_identifier(f"{where}.{'group_by' if name in sink.group_by else 'aggregate'}.{name}", name, problems)
        if sink.landing_table == sink.agg_table:
            problems.append(f"{where}.agg_table: must differ from landing_table ('{sink.landing_table}')")
    else:
        _check_identifier(f"{where}.schema", sink.schema_, problems)
        _check_identifier(f"{where}.table", sink.table, problems)
    if sink.from_ in inputs.invalid:
        return  # the input itself is invalid and already reported
    if sink.from_ in inputs.dynamic_tables:
        problems.append(
            f"{where}.from: '{sink.from_}' is a dynamic table, not a stream; a sink reads a source or a sql transform"
        )
        return
    if sink.from_ not in inputs.columns:
        known = sorted(inputs.columns)
        problems.append(
            f"{where}.from: '{sink.from_}' is not a source or sql transform{_did_you_mean(sink.from_, known)}; "
            f"known: {', '.join(known) or 'none'}"
        )
        return
    columns = inputs.columns[sink.from_]
    described = inputs.describe(sink.from_)
    key = sink.primary_key or inputs.primary_keys[sink.from_]
    if key is None:
        problems.append(
            f"{where}.primary_key: required, because {described} declares no primary_key "
            "(the mirror table needs its key before the first message arrives)"
        )
        return
    for column in key:
        if column not in columns:
            problems.append(
                f"{where}.primary_key: column '{column}' is not in {described}{_did_you_mean(column, list(columns))}"
            )
    if len(set(key)) != len(key):
        problems.append(f"{where}.primary_key: a column is listed twice")
    if isinstance(sink, PostgresAggregateSink):
        problems.extend(f"{where}.{problem}" for problem in resolve_aggregation(sink, columns, described).problems)
    if isinstance(sink, ClickHouseSink):
        _check_clickhouse_columns(where, sink, columns, described, key, problems)
    if isinstance(sink, RoutedPostgresSink | RoutedClickHouseSink):
        return  # its internal tables have bounded names
    internal_name = f"{pipeline_name}__{sink_id}__tombstones"
    _check_identifier(where, sink_id, problems)
    if len(internal_name.encode()) > POSTGRES_MAX_IDENTIFIER:
        problems.append(f"{where}: pipeline name plus sink id is too long for the internal staging table names")


def _check_clickhouse_names(where: str, sink: ClickHouseSink, problems: list[str]) -> None:
    for key, name in (("database", sink.database), ("table", sink.table), ("view", sink.view_name)):
        if name is not None and (any(ord(ch) < 32 for ch in name) or "`" in name):
            problems.append(f"{where}.{key}: ClickHouse names here cannot contain control characters or '`'")
    if sink.view is not None and not sink.legacy_server:
        problems.append(f"{where}.view: only used with legacy_server: true (servers older than 23.2)")


def _check_clickhouse_columns(
    where: str, sink: ClickHouseSink, types: dict[str, PgType], described: str, key: list[str], problems: list[str]
) -> None:
    from cdcsync.config.clickhouse_types import METADATA_COLUMNS as CH_METADATA
    from cdcsync.config.clickhouse_types import is_string_type

    for column in sink.low_cardinality:
        if column not in types:
            problems.append(
                f"{where}.low_cardinality: column '{column}' is not in {described}{_did_you_mean(column, list(types))}"
            )
        elif not is_string_type(types[column]):
            problems.append(
                f"{where}.low_cardinality: column '{column}' is {types[column].sql}; only columns stored as "
                "String in ClickHouse (text, varchar, char, json, ...) can be LowCardinality"
            )
        elif column in key:
            problems.append(f"{where}.low_cardinality: '{column}' is a key column; keep keys plain")
    for name, _ in CH_METADATA:
        if name in types:
            problems.append(
                f"{where}: column '{name}' of {described} clashes with the column cdcsync adds to ClickHouse tables"
            )


def _parses(type_text: str) -> bool:
    try:
        parse_pg_type(type_text)
    except UnknownTypeError:
        return False
    return True


def _target_tables(sink: SinkModel) -> list[tuple[str, str]]:
    """(YAML key, table name) of every table in ``sink.schema`` the sink owns."""
    if isinstance(sink, ClickHouseSink):
        return [("table", sink.table)] + ([("view", sink.view_name)] if sink.view_name else [])
    if isinstance(sink, PostgresAggregateSink):
        return [("landing_table", sink.landing_table), ("agg_table", sink.agg_table)]
    return [("table", sink.table)]


def _check_dynamic_table(table_id: str, table: DynamicTable, problems: list[str]) -> None:
    where = _path("transforms", table_id)
    if table.backend_type == "postgres":
        _check_identifier(f"{where}.schema", table.schema_, problems)
        _check_identifier(f"{where}.backend_entity_name", table.backend_entity_name, problems)
    if table.key_column is not None:
        _check_identifier(f"{where}.key_column", table.key_column, problems)
        if table.key_column.startswith("_cdc_"):
            problems.append(f"{where}.key_column: names starting with '_cdc_' are reserved for cdcsync")


def _plan(
    sources: dict[str, KafkaSource], transforms: dict[str, TransformModel], declared: set[str], problems: list[str]
) -> tuple[PipelinePlan, _Inputs]:
    """Plan the transforms (sqlglot is imported only when there are some) and gather what sinks may read."""
    typed = {sid: s for sid, s in sources.items() if all(_parses(t) for t in s.columns.values())}
    invalid = declared - set(sources) - set(transforms)
    plan = PipelinePlan(source_of_node={source_id: source_id for source_id in sources})
    if transforms:
        from cdcsync.config.compile import build_plan

        streams = {sid: s.column_types() for sid, s in typed.items()}
        plan, plan_problems = build_plan(streams, transforms, invalid | (set(sources) - set(typed)))
        problems.extend(plan_problems)
    planned = {step.id for step in plan.steps}
    invalid |= {tid for tid, t in transforms.items() if isinstance(t, SqlTransform) and tid not in planned}
    columns: dict[str, dict[str, PgType]] = {
        sid: {n: parse_pg_type(t) if _parses(t) else PgType("text") for n, t in s.columns.items()}
        for sid, s in sources.items()
    }
    primary_keys: dict[str, list[str] | None] = {sid: s.primary_key for sid, s in sources.items()}
    for step in plan.steps:
        columns[step.id] = dict(step.columns)
        primary_keys[step.id] = list(step.primary_key)
    dynamic_tables = {tid for tid, t in transforms.items() if isinstance(t, DynamicTable)}
    return plan, _Inputs(columns, primary_keys, planned, dynamic_tables, invalid)


def _route_tables(
    source_id: str,
    source: KafkaSource,
    found: SourceSchema | TopicSchemas | str | None,
    sources: dict[str, KafkaSource],
    used: dict[str, SourceSchema],
    problems: list[str],
) -> dict[str, str]:
    """Add a source per table (known topic) of the ``topic_pattern`` source ``source_id``; topic -> its id."""
    where = _path("sources", source_id, "topic_pattern")
    if isinstance(found, str):
        problems.append(f"{where}: {found}")
    route: dict[str, str] = {}
    for topic, schema in sorted((found if isinstance(found, dict) else {}).items()):
        if isinstance(schema, str):
            problems.append(f"{where}: topic {topic}: {schema}")
            continue
        table_id = table_source_id(source_id, topic)
        for name, why in schema.unmapped:
            problems.append(
                f"{where}: topic {topic}, column '{name}': {why}; a routed table cannot declare column types yet: "
                "read that topic with a source of its own (topic:) and declare the type there"
            )
        sources[table_id] = source.model_copy(update={"topic": topic, "topic_pattern": None}).with_schema(schema)
        used[table_id] = schema
        route[topic] = table_id
    return route


def _complete_sources(
    pipeline_name: str | None,
    sources: dict[str, KafkaSource],
    schema_for: SchemaLookup | None,
    problems: list[str],
    routes: dict[str, dict[str, str]],
) -> dict[str, SourceSchema]:
    """Complete each source's columns from its schema (``schema_for``), in place; the schemas used. A
    ``topic_pattern`` source gains a source per known topic instead (listed in ``routes``)."""
    used: dict[str, SourceSchema] = {}
    for source_id, source in list(sources.items()):
        where = _path("sources", source_id, "columns")
        found = schema_for(pipeline_name, source_id, source) if schema_for and pipeline_name else None
        if source.topic_pattern is not None:
            routes[source_id] = _route_tables(source_id, source, found, sources, used, problems)
            continue
        assert not isinstance(found, dict), "only topic_pattern sources have tables"
        if isinstance(found, SourceSchema) and not source.adds_nothing(found):
            used[source_id] = found
            sources[source_id] = source.with_schema(found)
            for name, why in found.unmapped:
                if name not in source.columns:
                    problems.append(f"{where}.{name}: {why}; declare its type here")
        if not sources[source_id].columns:
            problems.append(f"{where}: {found if isinstance(found, str) else NO_COLUMNS}")
    return used


def _route_sinks(
    sinks: dict[str, SinkModel], routes: dict[str, dict[str, str]], problems: list[str]
) -> dict[str, PostgresSink | ClickHouseSink]:
    """Replace each sink fed by a ``topic_pattern`` source, in place, by one routed sink per table of that
    source (:class:`RoutedPostgresSink`, :class:`RoutedClickHouseSink`); the declared routed sinks, by id."""
    routed: dict[str, PostgresSink | ClickHouseSink] = {}
    for sink_id, sink in list(sinks.items()):
        if sink.from_ not in routes:
            continue
        where = _path("sinks", sink_id)
        del sinks[sink_id]
        if type(sink) not in (PostgresSink, ClickHouseSink):
            problems.append(
                f"{where}.type: '{sink.type}' cannot read source '{sink.from_}', which reads a topic_pattern: only "
                "postgres and clickhouse sinks route each of its tables to a table of their own"
            )
            continue
        assert isinstance(sink, PostgresSink | ClickHouseSink)
        refused = [("primary_key", "each routed table's key is its topic's message key")]
        if isinstance(sink, ClickHouseSink):
            refused += [("low_cardinality", "the tables have different columns"), ("view", "it would be one view")]
        for key, why in refused:
            if getattr(sink, key):
                problems.append(f"{where}.{key}: not allowed on a sink fed by a topic_pattern: {why}")
        templates = (
            {"database": sink.database, "table": sink.table}
            if isinstance(sink, ClickHouseSink)
            else {"schema": sink.schema_, "table": sink.table}
        )
        used: list[str] = []
        for key, template in templates.items():
            try:
                used += placeholders(template)
            except ValueError as error:
                problems.append(f"{where}.{key}: {error}")
                used.append("?")
        if "?" in used:
            continue
        if not {"table", "topic"} & set(used):
            problems.append(
                f"{where}.table: '{sink.table}' names one table for every topic of source '{sink.from_}'; use a "
                "template such as '{schema}_{table}' or '{table}' (placeholders: {schema}, {table}, {topic})"
            )
            continue
        routed[sink_id] = sink
        model: type[RoutedPostgresSink | RoutedClickHouseSink] = (
            RoutedClickHouseSink if isinstance(sink, ClickHouseSink) else RoutedPostgresSink
        )
        for topic, table_id in routes[sink.from_].items():
            try:
                rendered = {key: render_name(template, topic) for key, template in templates.items()}
            except ValueError as error:
                problems.append(f"{where}.table: {error}")
                continue
            values = sink.model_dump(by_alias=True, exclude={"from_", "schema_", "database", "table"})
            values.update(rendered, routed_from=sink_id, topic=topic)
            values["from"] = table_id
            sinks[table_sink_id(sink_id, topic)] = model.model_validate(values)
    return routed


def validate_pipeline_dict(raw: Any, path: Path | None = None, schema_for: SchemaLookup | None = None) -> Pipeline:
    """Validate a parsed YAML document; raise ConfigError with every problem found.

    ``schema_for`` supplies each source's schema: what ``init`` reads from the registry or topic, or what the
    migrations recorded (``validate``, ``run``). Without it only declared ``columns:`` count."""
    where = str(path) if path else "pipeline"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the pipeline file must be a YAML mapping with name, sources and sinks")
    problems: list[str] = []
    allowed_top = ["name", "sources", "transforms", "sinks"]
    for key in raw:
        if key not in allowed_top:
            problems.append(
                f"{key}: unknown key{_did_you_mean(str(key), allowed_top)}; allowed: {', '.join(allowed_top)}"
            )

    name = raw.get("name")
    if name is None:
        problems.append("name: required key is missing (it namespaces checkpoints, ledger rows and consumer groups)")
    elif not isinstance(name, str) or not _PIPELINE_NAME_RE.match(name):
        problems.append(f"name: {name!r} must start with a letter or digit and use only letters, digits, '_' and '-'")

    sources: dict[str, KafkaSource] = {}
    sinks: dict[str, SinkModel] = {}
    for section, registry, planned, into in (
        ("sources", SOURCE_TYPES, (), sources),
        ("sinks", SINK_TYPES, PLANNED_SINK_TYPES, sinks),
    ):
        entries = raw.get(section)
        if not entries:
            problems.append(f"{section}: at least one entry is required")
            continue
        if not isinstance(entries, dict):
            problems.append(f"{section}: expected a mapping of id -> definition")
            continue
        for entry_id, entry in entries.items():
            model, entry_problems = _validate_entry(section, str(entry_id), entry, registry, planned)
            problems.extend(entry_problems)
            if model is not None:
                into[str(entry_id)] = model  # type: ignore[assignment]

    transforms: dict[str, TransformModel] = {}
    raw_transforms = raw.get("transforms") or {}
    if not isinstance(raw_transforms, dict):
        problems.append("transforms: expected a mapping of id -> definition")
        raw_transforms = {}
    for transform_id, transform in raw_transforms.items():
        model, entry_problems = _validate_entry("transforms", str(transform_id), transform, TRANSFORM_TYPES, ())
        problems.extend(entry_problems)
        if model is not None:
            transforms[str(transform_id)] = model  # type: ignore[assignment]
    for duplicate in sorted({str(k) for k in raw_transforms} & {str(k) for k in raw.get("sources") or {}}):
        problems.append(f"transforms.{duplicate}: id is already used by a source")

    declared = {
        str(k) for section in ("sources", "transforms") if isinstance(raw.get(section), dict) for k in raw[section]
    }
    valid_name = name if isinstance(name, str) and _PIPELINE_NAME_RE.match(name) else None
    routes: dict[str, dict[str, str]] = {}
    source_schemas = _complete_sources(valid_name, sources, schema_for, problems, routes)
    tables = {table_id: pattern_id for pattern_id, route in routes.items() for table_id in route.values()}
    for sink_id, sink in sinks.items():
        if sink.from_ in tables:
            problems.append(
                f"sinks.{sink_id}.from: '{sink.from_}' is a table of topic_pattern source '{tables[sink.from_]}'; "
                "a sink reads the pattern source (routed), or a source of its own (topic:)"
            )
    routed_sinks = _route_sinks(sinks, routes, problems)
    for transform_id, transform in transforms.items():
        for input_id in (transform.from_ or []) if isinstance(transform, SqlTransform) else []:
            if input_id in routes or input_id in tables:
                problems.append(
                    f"transforms.{transform_id}.from: '{input_id}' reads a topic_pattern; SQL transforms read "
                    "sources of one topic (topic:)"
                )
    for source_id, source in sources.items():
        _check_source(source_id, source, problems)
    for transform_id, transform in transforms.items():
        if isinstance(transform, DynamicTable):
            _check_dynamic_table(transform_id, transform, problems)
    plan, inputs = _plan(sources, transforms, declared, problems)
    seen_tables: dict[tuple[str, str, str], str] = {}
    for table_id, spec in sorted(plan.dynamic_tables.items()):
        if spec.backend == "postgres":
            if ("pg", spec.schema, spec.table) in seen_tables:
                problems.append(
                    f"transforms.{table_id}.backend_entity_name: {spec.schema}.{spec.table} is already the table of "
                    f"{seen_tables[('pg', spec.schema, spec.table)]}"
                )
            seen_tables[("pg", spec.schema, spec.table)] = f"dynamic table '{table_id}'"
    for sink_id, sink in sinks.items():
        _check_sink(str(name), sink_id, sink, inputs, problems)
        kind, namespace = ("clickhouse", sink.database) if isinstance(sink, ClickHouseSink) else ("pg", sink.schema_)
        for key, table in _target_tables(sink):
            if (kind, namespace, table) in seen_tables:
                owner = seen_tables[(kind, namespace, table)]
                problems.append(f"sinks.{sink_id}.{key}: {namespace}.{table} is already the target of {owner}")
            seen_tables[(kind, namespace, table)] = f"sink '{sink_id}'"

    if problems:
        raise ConfigError(f"{where} is invalid", problems, hint="fix the keys above, then run `cdcsync validate` again")
    return Pipeline(
        name=name,
        sources=sources,
        transforms=transforms,
        sinks=sinks,
        path=path,
        plan=plan,
        source_schemas=source_schemas,
        routes=routes,
        routed_sinks=routed_sinks,
    )


def load_pipeline(path: Path, schema_for: SchemaLookup | None = None) -> Pipeline:
    """Read and validate a pipeline file (``schema_for``: see :func:`validate_pipeline_dict`)."""
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such pipeline file") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the pipeline file: {error.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{path}: not valid YAML{at}: {problem}") from None
    return validate_pipeline_dict(raw, path, schema_for)
