"""The pipeline YAML: typed, validated in one place, every problem reported with its exact YAML path.

Vocabulary follows Streamling (``sources`` / ``transforms`` / ``sinks``, ``from``, ``primary_key``) so that a
Streamling pipeline reads naturally here. Validation runs before Spark starts: :func:`load_pipeline` either
returns a fully checked :class:`Pipeline` or raises :class:`~cdcsync.errors.ConfigError` listing *every*
problem as ``path.to.key: what is wrong``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cdcsync.config.aggregate import resolve as resolve_aggregation
from cdcsync.config.types import PgType, UnknownTypeError, parse_pg_type
from cdcsync.errors import ConfigError

METADATA_COLUMNS: tuple[str, ...] = (
    "_cdc_op",
    "_cdc_version",
    "_cdc_ts",
    "_cdc_topic",
    "_cdc_partition",
    "_cdc_offset",
)
"""Columns every decoded change row carries beside the business columns (DESIGN.md, "Metadata columns")."""

RESERVED_COLUMNS: tuple[str, ...] = ("_batch_id", "_dlq_reason", "_dlq_key", "_dlq_value")
"""Used by staging tables and the decoder's dead-letter fields."""

POSTGRES_MAX_IDENTIFIER = 63
_PIPELINE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class _Model(BaseModel):
    """Unknown keys are refused: a typo in YAML must never be silently ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _as_key_list(value: str | list[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


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
SchemaLookup = Callable[[str, str, "KafkaSource"], "SourceSchema | str | None"]
"""(pipeline name, source id, source) -> its schema, or why there is none (shown when it declares no columns)."""


class KafkaSource(_Model):
    """A Debezium changelog topic."""

    type: Literal["kafka"]
    topic: str = Field(min_length=1)
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
PLANNED_TRANSFORM_TYPES = ("sql", "dynamic_table")


class Pipeline(_Model):
    name: str
    sources: dict[str, KafkaSource]
    transforms: dict[str, Any] = Field(default_factory=dict)
    sinks: dict[str, SinkModel]
    path: Path | None = Field(default=None, exclude=True)
    source_schemas: dict[str, SourceSchema] = Field(default_factory=dict, exclude=True)
    """The schemas the sources' columns were completed from (recorded by ``init``), by source id."""

    def source_of(self, sink: SinkModel) -> KafkaSource:
        return self.sources[sink.from_]

    def postgres_sinks(self) -> dict[str, AnySink]:
        """The sinks that land in Postgres (mirrors and aggregations)."""
        return {sid: s for sid, s in self.sinks.items() if not isinstance(s, ClickHouseSink)}

    def clickhouse_sinks(self) -> dict[str, ClickHouseSink]:
        """The sinks that land in ClickHouse; only a pipeline with some needs a ClickHouse server at all."""
        return {sid: s for sid, s in self.sinks.items() if isinstance(s, ClickHouseSink)}

    def sink_primary_key(self, sink: SinkModel) -> list[str]:
        """The sink's key: its own ``primary_key``, else its source's (validation guarantees one exists)."""
        key = sink.primary_key or self.source_of(sink).primary_key
        assert key is not None, "validated pipelines always have a sink key"
        return key

    def sinks_of(self, source_id: str) -> dict[str, SinkModel]:
        return {sink_id: sink for sink_id, sink in self.sinks.items() if sink.from_ == source_id}


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
            problems.append(f"{where}.options.{option}: set by cdcsync itself; use 'topic' instead")


def _check_sink(
    pipeline_name: str,
    sink_id: str,
    sink: SinkModel,
    sources: dict[str, KafkaSource],
    declared_sources: set[str],
    problems: list[str],
) -> None:
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
    if sink.from_ in declared_sources and sink.from_ not in sources:
        return  # the source itself is invalid and already reported
    if sink.from_ not in sources:
        known = sorted(declared_sources)
        problems.append(
            f"{where}.from: '{sink.from_}' is not a source{_did_you_mean(sink.from_, known)}; "
            f"known: {', '.join(known) or 'none'}"
        )
        return
    source = sources[sink.from_]
    key = sink.primary_key or source.primary_key
    if key is None:
        problems.append(
            f"{where}.primary_key: required, because source '{sink.from_}' declares no primary_key "
            "(the mirror table needs its key before the first message arrives)"
        )
        return
    for column in key:
        if column not in source.columns:
            problems.append(
                f"{where}.primary_key: column '{column}' is not in source '{sink.from_}'"
                f"{_did_you_mean(column, list(source.columns))}"
            )
    if len(set(key)) != len(key):
        problems.append(f"{where}.primary_key: a column is listed twice")
    if isinstance(sink, PostgresAggregateSink):
        problems.extend(f"{where}.{problem}" for problem in resolve_aggregation(sink, source).problems)
    if isinstance(sink, ClickHouseSink):
        _check_clickhouse_columns(where, sink, source, key, problems)
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
    where: str, sink: ClickHouseSink, source: KafkaSource, key: list[str], problems: list[str]
) -> None:
    from cdcsync.config.clickhouse_types import METADATA_COLUMNS as CH_METADATA
    from cdcsync.config.clickhouse_types import is_string_type

    types = source.column_types() if all(_parses(t) for t in source.columns.values()) else {}
    for column in sink.low_cardinality:
        if column not in source.columns:
            problems.append(
                f"{where}.low_cardinality: column '{column}' is not in source '{sink.from_}'"
                f"{_did_you_mean(column, list(source.columns))}"
            )
        elif column in types and not is_string_type(types[column]):
            problems.append(
                f"{where}.low_cardinality: column '{column}' is {types[column].sql}; only columns stored as "
                "String in ClickHouse (text, varchar, char, json, ...) can be LowCardinality"
            )
        elif column in key:
            problems.append(f"{where}.low_cardinality: '{column}' is a key column; keep keys plain")
    for name, _ in CH_METADATA:
        if name in source.columns:
            problems.append(
                f"{where}: source column '{name}' clashes with the column cdcsync adds to ClickHouse tables"
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


def _complete_sources(
    pipeline_name: str | None,
    sources: dict[str, KafkaSource],
    schema_for: SchemaLookup | None,
    problems: list[str],
) -> dict[str, SourceSchema]:
    """Complete each source's columns from its schema (``schema_for``), in place; the schemas used."""
    used: dict[str, SourceSchema] = {}
    for source_id, source in list(sources.items()):
        where = _path("sources", source_id, "columns")
        found = schema_for(pipeline_name, source_id, source) if schema_for and pipeline_name else None
        if isinstance(found, SourceSchema) and not source.adds_nothing(found):
            used[source_id] = found
            sources[source_id] = source.with_schema(found)
            for name, why in found.unmapped:
                if name not in source.columns:
                    problems.append(f"{where}.{name}: {why}; declare its type here")
        if not sources[source_id].columns:
            problems.append(f"{where}: {found if isinstance(found, str) else NO_COLUMNS}")
    return used


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

    transforms = raw.get("transforms") or {}
    if not isinstance(transforms, dict):
        problems.append("transforms: expected a mapping of id -> definition")
        transforms = {}
    for transform_id, transform in transforms.items():
        kind = transform.get("type") if isinstance(transform, dict) else None
        problems.append(
            f"transforms.{transform_id}.type: '{kind}' transforms are not available in this version of cdcsync yet; "
            "leave 'transforms' empty"
        )
    for duplicate in set(sources) & set(transforms):
        problems.append(f"transforms.{duplicate}: id is already used by a source")

    declared_sources = {str(k) for k in raw["sources"]} if isinstance(raw.get("sources"), dict) else set()
    valid_name = name if isinstance(name, str) and _PIPELINE_NAME_RE.match(name) else None
    source_schemas = _complete_sources(valid_name, sources, schema_for, problems)
    for source_id, source in sources.items():
        _check_source(source_id, source, problems)
    seen_tables: dict[tuple[str, str, str], str] = {}
    for sink_id, sink in sinks.items():
        _check_sink(str(name), sink_id, sink, sources, declared_sources, problems)
        kind, namespace = ("clickhouse", sink.database) if isinstance(sink, ClickHouseSink) else ("pg", sink.schema_)
        for key, table in _target_tables(sink):
            if (kind, namespace, table) in seen_tables:
                owner = seen_tables[(kind, namespace, table)]
                problems.append(f"sinks.{sink_id}.{key}: {namespace}.{table} is already the target of sink '{owner}'")
            seen_tables[(kind, namespace, table)] = sink_id

    if problems:
        raise ConfigError(f"{where} is invalid", problems, hint="fix the keys above, then run `cdcsync validate` again")
    return Pipeline(
        name=name, sources=sources, transforms=transforms, sinks=sinks, path=path, source_schemas=source_schemas
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
