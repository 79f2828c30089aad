"""Validation of each entry of a pipeline on its own (a source, a sink, a dynamic table), and of the tables the
sinks own across entries; :func:`cdcsync.config.load.validate_pipeline_dict` runs them. Every problem is one
``yaml.path: what is wrong`` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from cdcsync.config import toast
from cdcsync.config.aggregate import resolve as resolve_aggregation
from cdcsync.config.base import StrictModel, did_you_mean
from cdcsync.config.operators import KafkaSink, OperatorSink
from cdcsync.config.pipeline import (
    METADATA_COLUMNS,
    POSTGRES_MAX_IDENTIFIER,
    RESERVED_COLUMNS,
    ClickHouseSink,
    DeltaSink,
    KafkaSource,
    PostgresAggregateSink,
    PostgresSink,
    RoutedClickHouseSink,
    RoutedPostgresSink,
    SinkModel,
)
from cdcsync.config.plan import PipelinePlan
from cdcsync.config.plugins import PluginSink, is_plugin_type, validate_plugin_entry
from cdcsync.config.transforms import DynamicTable
from cdcsync.config.types import PgType, UnknownTypeError, parse_pg_type


def yaml_path(*parts: Any) -> str:
    """``sinks.revenue.aggregate``: where a problem is, as the user would look for it in the YAML."""
    return ".".join(str(p) for p in parts if p != "")


def pydantic_problems(prefix: str, error: ValidationError, model: type[BaseModel]) -> list[str]:
    """Turn pydantic's errors into ``yaml.path: message`` lines with friendlier wording."""
    problems = []
    allowed = sorted(f.alias or name for name, f in model.model_fields.items() if name != "path")
    for item in error.errors():
        loc = list(item["loc"])
        path = yaml_path(prefix, *loc)
        kind = item["type"]
        if kind == "extra_forbidden":
            key = str(loc[-1])
            message = f"unknown key{did_you_mean(key, allowed)}; allowed keys: {', '.join(allowed)}"
        elif kind == "missing":
            message = "required key is missing"
        elif kind == "literal_error":
            expected = str(item.get("ctx", {}).get("expected", "")).replace("'", "").replace(" or ", ", ")
            message = f"{item['input']!r} is not one of {expected}"
        else:
            message = item["msg"].removeprefix("Value error, ")
            key, _, rest = message.partition(": ")
            if not loc and key in model.model_fields:  # a model validator's finding about one key
                path, message = yaml_path(prefix, key), rest
        problems.append(f"{path}: {message}")
    return problems


def validate_entry(
    section: str, entry_id: str, raw: Any, registry: dict[str, type[StrictModel]], planned: tuple[str, ...]
) -> tuple[StrictModel | None, list[str]]:
    where = yaml_path(section, entry_id)
    if not isinstance(raw, dict):
        return None, [f"{where}: expected a mapping of keys, got {type(raw).__name__}"]
    kind = raw.get("type")
    if kind is None:
        return None, [f"{where}.type: required key is missing; one of {', '.join(registry)}"]
    if is_plugin_type(kind) and section in ("sources", "transforms", "sinks"):
        return validate_plugin_entry(section, entry_id, raw, [*registry, *planned])  # type: ignore[arg-type]
    if kind not in registry:
        if kind in planned:
            return None, [f"{where}.type: '{kind}' is not available in this version of cdcsync yet"]
        choices = list(registry) + list(planned)
        return None, [f"{where}.type: '{kind}' is not one of {', '.join(registry)}{did_you_mean(str(kind), choices)}"]
    model = registry[kind]
    try:
        return model.model_validate(raw), []
    except ValidationError as error:
        return None, pydantic_problems(where, error, model)


def check_identifier(path: str, name: str, problems: list[str]) -> None:
    if len(name.encode()) > POSTGRES_MAX_IDENTIFIER:
        problems.append(f"{path}: '{name}' is longer than Postgres' {POSTGRES_MAX_IDENTIFIER}-byte identifier limit")
    if any(ord(ch) < 32 for ch in name):
        problems.append(f"{path}: identifiers cannot contain control characters")


def check_source(source_id: str, source: KafkaSource, problems: list[str]) -> None:
    where = yaml_path("sources", source_id)
    if source.topic_pattern is not None:
        for key, given in (("columns", source.columns), ("primary_key", source.primary_key)):
            if given:
                problems.append(
                    f"{where}.{key}: not supported with topic_pattern: each table's columns and key come from its "
                    "own topic (run `cdcsync init`); read a table that needs them with a source of its own (topic:)"
                )
    for name, type_text in source.columns.items():
        check_identifier(f"{where}.columns.{name}", name, problems)
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
                f"{did_you_mean(key, list(source.columns))}"
            )
    if source.primary_key is not None and len(set(source.primary_key)) != len(source.primary_key):
        problems.append(f"{where}.primary_key: a column is listed twice")
    for option in source.options:
        if option in {"subscribe", "subscribePattern", "assign", "includeHeaders"}:
            problems.append(f"{where}.options.{option}: set by cdcsync itself; use 'topic' or 'topic_pattern'")


def check_toasted_columns(source_id: str, source: KafkaSource, problems: list[str]) -> None:
    """Arrays whose unchanged TOASTed value Debezium cannot send (it sends NULL: :mod:`cdcsync.config.toast`) are
    refused unless the source says the table's replica identity is FULL or the column is never TOASTed."""
    where = yaml_path("sources", source_id)
    columns = source.column_types()
    for name in source.untoasted_columns:
        if columns and name not in columns:  # (no columns yet: `init` has not read them; reported elsewhere)
            problems.append(
                f"{where}.untoasted_columns: '{name}' is not a column of the source{did_you_mean(name, list(columns))}"
            )
    if source.replica_identity == "full":
        return
    for name, pg in columns.items():
        if toast.lacks_placeholder(pg) and name not in source.untoasted_columns:
            problems.append(
                f"{where}.columns.{name}: Debezium has no placeholder for an unchanged large (TOASTed) {pg.sql}: an "
                "update that leaves such a value unchanged arrives as NULL and would overwrite it. Set REPLICA "
                "IDENTITY FULL on the source table and declare `replica_identity: full` on the source, or, if the "
                f"column's values stay under 2 kB, list '{name}' in its untoasted_columns"
            )


@dataclass(frozen=True)
class Inputs:
    """What sinks may read: sources and planned SQL transforms with their columns, and what to stay quiet about."""

    columns: dict[str, dict[str, PgType]]
    primary_keys: dict[str, list[str] | None]
    transforms: set[str]
    dynamic_tables: set[str]
    invalid: set[str]
    """Declared sources and transforms whose own definition has problems (already reported)."""

    def describe(self, node_id: str) -> str:
        return f"{'transform' if node_id in self.transforms else 'source'} '{node_id}'"


def _check_sink(pipeline_name: str, sink_id: str, sink: SinkModel, inputs: Inputs, problems: list[str]) -> None:
    where = yaml_path("sinks", sink_id)
    if isinstance(sink, ClickHouseSink):
        _check_clickhouse_names(where, sink, problems)
    elif isinstance(sink, DeltaSink):
        pass  # its location is checked by the model; its columns below
    elif isinstance(sink, PostgresAggregateSink):
        check_identifier(f"{where}.schema", sink.schema_, problems)
        check_identifier(f"{where}.landing_table", sink.landing_table, problems)
        check_identifier(f"{where}.agg_table", sink.agg_table, problems)
        for name in [*sink.group_by, *sink.aggregate]:
            check_identifier(f"{where}.{'group_by' if name in sink.group_by else 'aggregate'}.{name}", name, problems)
        if sink.landing_table == sink.agg_table:
            problems.append(f"{where}.agg_table: must differ from landing_table ('{sink.landing_table}')")
    elif not isinstance(sink, OperatorSink | PluginSink):
        check_identifier(f"{where}.schema", sink.schema_, problems)
        check_identifier(f"{where}.table", sink.table, problems)
    if not _input_known(where, sink.from_, inputs, problems):
        return
    if isinstance(sink, OperatorSink | PluginSink):
        for column in sink.primary_key or []:
            if column not in inputs.columns[sink.from_]:
                problems.append(f"{where}.primary_key: column '{column}' is not in {inputs.describe(sink.from_)}")
        if isinstance(sink, KafkaSink) and not (sink.primary_key or inputs.primary_keys[sink.from_]):
            problems.append(
                f"{where}.primary_key: required, because {inputs.describe(sink.from_)} declares no primary_key "
                "(every message is keyed by it, as Debezium keys its topics)"
            )
        return  # owns no table: needs no key (a kafka sink: for its messages only), and no internal tables
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
                f"{where}.primary_key: column '{column}' is not in {described}{did_you_mean(column, list(columns))}"
            )
    if len(set(key)) != len(key):
        problems.append(f"{where}.primary_key: a column is listed twice")
    if isinstance(sink, PostgresAggregateSink):
        problems.extend(f"{where}.{problem}" for problem in resolve_aggregation(sink, columns, described).problems)
    if isinstance(sink, ClickHouseSink):
        _check_clickhouse_columns(where, sink, columns, described, key, problems)
    if isinstance(sink, DeltaSink):
        _check_delta_columns(where, sink, columns, described, problems)
        return  # no staging tables in Postgres
    if isinstance(sink, RoutedPostgresSink | RoutedClickHouseSink):
        return  # its internal tables have bounded names
    internal_name = f"{pipeline_name}__{sink_id}__tombstones"
    check_identifier(where, sink_id, problems)
    if len(internal_name.encode()) > POSTGRES_MAX_IDENTIFIER:
        problems.append(f"{where}: pipeline name plus sink id is too long for the internal staging table names")


def _input_known(where: str, from_: str, inputs: Inputs, problems: list[str]) -> bool:
    """Whether ``from_`` names a stream a sink can read; else the problem (unless it was reported already)."""
    if from_ in inputs.invalid:
        return False  # the input itself is invalid and already reported
    if from_ in inputs.dynamic_tables:
        problems.append(
            f"{where}.from: '{from_}' is a dynamic table, not a stream; a sink reads a source or a sql transform"
        )
        return False
    if from_ not in inputs.columns:
        known = sorted(inputs.columns)
        problems.append(
            f"{where}.from: '{from_}' is not a source or sql transform{did_you_mean(from_, known)}; "
            f"known: {', '.join(known) or 'none'}"
        )
        return False
    return True


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
                f"{where}.low_cardinality: column '{column}' is not in {described}{did_you_mean(column, list(types))}"
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


DELTA_ADDED_COLUMNS = ("_cdc_op", "_cdc_version", "_cdc_ts", "_cdc_deleted", "_valid_from", "_valid_to", "_is_current")
"""Columns cdcsync adds to Delta tables (:mod:`cdcsync.sinks.delta`)."""


def _check_delta_columns(
    where: str, sink: DeltaSink, types: dict[str, PgType], described: str, problems: list[str]
) -> None:
    for column in sink.partition_by:
        if column not in types:
            problems.append(
                f"{where}.partition_by: column '{column}' is not in {described}{did_you_mean(column, list(types))}"
            )
    if len(set(sink.partition_by)) != len(sink.partition_by):
        problems.append(f"{where}.partition_by: a column is listed twice")
    for name in DELTA_ADDED_COLUMNS:
        if name in types:
            problems.append(
                f"{where}: column '{name}' of {described} clashes with a column cdcsync adds to Delta tables"
            )


def parses(type_text: str) -> bool:
    try:
        parse_pg_type(type_text)
    except UnknownTypeError:
        return False
    return True


def _target_tables(sink: PostgresSink | PostgresAggregateSink | ClickHouseSink | DeltaSink) -> list[tuple[str, str]]:
    """(YAML key, table name) of every table in ``sink.schema`` the sink owns."""
    if isinstance(sink, ClickHouseSink):
        return [("table", sink.table)] + ([("view", sink.view_name)] if sink.view_name else [])
    if isinstance(sink, DeltaSink):
        return [("path", sink.path)] if sink.path is not None else [("table", sink.table or "")]
    if isinstance(sink, PostgresAggregateSink):
        return [("landing_table", sink.landing_table), ("agg_table", sink.agg_table)]
    return [("table", sink.table)]


def check_dynamic_table(table_id: str, table: DynamicTable, problems: list[str]) -> None:
    where = yaml_path("transforms", table_id)
    if table.backend_type == "postgres":
        check_identifier(f"{where}.schema", table.schema_, problems)
        check_identifier(f"{where}.backend_entity_name", table.backend_entity_name, problems)
    if table.key_column is not None:
        check_identifier(f"{where}.key_column", table.key_column, problems)
        if table.key_column.startswith("_cdc_"):
            problems.append(f"{where}.key_column: names starting with '_cdc_' are reserved for cdcsync")


def check_sinks(
    pipeline_name: str, sinks: dict[str, SinkModel], plan: PipelinePlan, inputs: Inputs, problems: list[str]
) -> None:
    """Each sink on its own, and that no two sinks or dynamic tables own the same table."""
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
        _check_sink(pipeline_name, sink_id, sink, inputs, problems)
        if isinstance(sink, KafkaSink) and plan.source_of_node.get(sink.from_, sink.from_) in plan.plugin_sources:
            problems.append(
                f"sinks.{sink_id}.from: a kafka sink reads Kafka sources (directly or through transforms), not "
                f"plugin source '{plan.source_of_node.get(sink.from_, sink.from_)}': its transactions record how far "
                "it got per source Kafka partition"
            )
        if isinstance(sink, OperatorSink | PluginSink):
            continue  # owns no table
        if isinstance(sink, DeltaSink):
            kind, namespace = "delta", "delta"
        elif isinstance(sink, ClickHouseSink):
            kind, namespace = "clickhouse", sink.database
        else:
            kind, namespace = "pg", sink.schema_
        for key, table in _target_tables(sink):
            if (kind, namespace, table) in seen_tables:
                owner = seen_tables[(kind, namespace, table)]
                problems.append(f"sinks.{sink_id}.{key}: {namespace}.{table} is already the target of {owner}")
            seen_tables[(kind, namespace, table)] = f"sink '{sink_id}'"
