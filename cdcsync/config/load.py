"""Loading a pipeline: read the YAML, validate every entry (:mod:`cdcsync.config.checks`), complete the sources'
columns from their recorded or introspected schemas, route ``topic_pattern`` sources to a source and sinks per
table, and plan the transforms. :func:`load_pipeline` either returns a fully checked
:class:`~cdcsync.config.pipeline.Pipeline` or raises :class:`~cdcsync.core.errors.ConfigError` listing *every*
problem as ``path.to.key: what is wrong``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdcsync.config.base import did_you_mean
from cdcsync.config.bounded import (
    BoundedModel,
    BoundedPlan,
    ClickHouseTableSource,
    DeltaTableSource,
    HybridSource,
    PostgresTableSource,
)
from cdcsync.config.checks import (
    Inputs,
    check_dynamic_table,
    check_sinks,
    check_source,
    check_toasted_columns,
    parses,
    pydantic_problems,
    validate_entry,
    yaml_path,
)
from cdcsync.config.code_transforms import HandlerTransform, ScriptTransform
from cdcsync.config.pipeline import (
    NO_COLUMNS,
    PLANNED_SINK_TYPES,
    SINK_TYPES,
    SOURCE_TYPES,
    ClickHouseSink,
    KafkaSource,
    Pipeline,
    PostgresSink,
    RoutedClickHouseSink,
    RoutedPostgresSink,
    SchemaLookup,
    SinkModel,
    SourceSchema,
    TopicSchemas,
)
from cdcsync.config.plan import PipelinePlan
from cdcsync.config.plugins import PluginSource, PluginTransform
from cdcsync.config.plugins import plan_sources as plan_plugin_sources
from cdcsync.config.plugins import plan_transforms as plan_plugin_transforms
from cdcsync.config.routing import placeholders, render_name, table_sink_id, table_source_id
from cdcsync.config.transforms import TRANSFORM_TYPES, DynamicTable, SqlTransform, TransformModel
from cdcsync.config.types import PgType, parse_pg_type
from cdcsync.core.errors import ConfigError

ExecutorTransform = PluginTransform | HandlerTransform | ScriptTransform
"""Transforms run on the executors inside the sinks' pass (:class:`~cdcsync.config.plan.PluginStep`)."""
_PIPELINE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def _plan(
    sources: dict[str, KafkaSource],
    all_transforms: dict[str, TransformModel | ExecutorTransform],
    declared: set[str],
    problems: list[str],
    plugin_sources: dict[str, PluginSource],
    bounded: dict[str, BoundedPlan],
) -> tuple[PipelinePlan, Inputs]:
    """Plan the transforms (sqlglot is imported only when there are some) and gather what sinks may read."""
    typed = {sid: s for sid, s in sources.items() if all(parses(t) for t in s.columns.values())}
    alone = {sid: plan for sid, plan in bounded.items() if not plan.streams}
    invalid = declared - set(sources) - set(all_transforms) - set(plugin_sources) - set(alone)
    plugins = {tid: t for tid, t in all_transforms.items() if isinstance(t, ExecutorTransform)}
    transforms = {tid: t for tid, t in all_transforms.items() if not isinstance(t, ExecutorTransform)}
    plan = PipelinePlan(source_of_node={source_id: source_id for source_id in [*sources, *alone]})
    for source_id, source in typed.items():
        check_toasted_columns(source_id, source, problems)
    if transforms:
        from cdcsync.config.compile import build_plan

        # A bounded source alone is read by SQL like a Kafka source: its chunks are change rows of its columns.
        streams = {sid: s.column_types() for sid, s in typed.items()} | {
            sid: dict(bounded_plan.columns) for sid, bounded_plan in alone.items()
        }
        placeholders = {sid: set(s.placeholder_columns()) for sid, s in typed.items()}
        unavailable = invalid | set(plugins) | set(plugin_sources) | (set(sources) - set(typed))
        plan, plan_problems = build_plan(streams, transforms, unavailable, placeholders)
        problems.extend(plan_problems)
        _refuse_plugin_inputs(transforms, {**plugins, **plugin_sources}, plan, problems)
    planned = {step.id for step in plan.steps}
    invalid |= {tid for tid, t in transforms.items() if isinstance(t, SqlTransform) and tid not in planned}
    columns: dict[str, dict[str, PgType]] = {
        sid: {n: parse_pg_type(t) if parses(t) else PgType("text") for n, t in s.columns.items()}
        for sid, s in sources.items()
    }
    primary_keys: dict[str, list[str] | None] = {sid: s.primary_key for sid, s in sources.items()}
    for sid, bounded_plan in alone.items():
        columns[sid] = dict(bounded_plan.columns)
        primary_keys[sid] = list(bounded_plan.primary_key)
    for step in plan.steps:
        columns[step.id] = dict(step.columns)
        primary_keys[step.id] = list(step.primary_key)
    dynamic_tables = {tid for tid, t in transforms.items() if isinstance(t, DynamicTable)}
    if plugin_sources:
        source_steps = plan_plugin_sources(plugin_sources, columns, primary_keys, invalid, problems)
        source_of_node = {**plan.source_of_node, **{source_id: source_id for source_id in source_steps}}
        plan = dataclasses.replace(plan, plugin_sources=source_steps, source_of_node=source_of_node)
    if plugins:
        steps = plan_plugin_transforms(plugins, columns, primary_keys, invalid, problems)
        source_of_node = {**plan.source_of_node}
        for plugin_step in steps.values():  # in planning order: a step's input is planned before it
            source_of_node[plugin_step.id] = source_of_node.get(plugin_step.input, plugin_step.input)
        plan = dataclasses.replace(plan, plugin_steps=steps, source_of_node=source_of_node)
        planned |= set(steps)
    return plan, Inputs(columns, primary_keys, planned, dynamic_tables, invalid)


def _refuse_plugin_inputs(
    transforms: dict[str, TransformModel], plugins: Mapping[str, object], plan: PipelinePlan, problems: list[str]
) -> None:
    """SQL transforms and dynamic tables run as Spark SQL over a decoded Kafka batch before the sinks, plugin
    transforms inside the sinks' executor pass: SQL cannot read a plugin transform or a plugin source."""
    planned = {step.id for step in plan.steps} | set(plan.dynamic_tables)
    for tid, transform in transforms.items():
        if tid in planned or transform.sql is None:
            continue
        read = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", transform.sql)
        for plugin_id in sorted(set(read) & set(plugins)):
            problems.append(
                f"transforms.{tid}.sql: reads '{plugin_id}', a plugin, handler or script operator; SQL transforms and "
                "dynamic tables read Kafka sources and SQL transforms only (those may read a SQL transform instead)"
            )


def _route_tables(
    source_id: str,
    source: KafkaSource,
    found: SourceSchema | TopicSchemas | str | None,
    sources: dict[str, KafkaSource],
    used: dict[str, SourceSchema],
    problems: list[str],
) -> dict[str, str]:
    """Add a source per table (known topic) of the ``topic_pattern`` source ``source_id``; topic -> its id."""
    where = yaml_path("sources", source_id, "topic_pattern")
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
        where = yaml_path("sources", source_id, "columns")
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
        where = yaml_path("sinks", sink_id)
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
    allowed_top = ["name", "job_mode", "sources", "transforms", "sinks"]
    for key in raw:
        if key not in allowed_top:
            problems.append(
                f"{key}: unknown key{did_you_mean(str(key), allowed_top)}; allowed: {', '.join(allowed_top)}"
            )

    name = raw.get("name")
    if name is None:
        problems.append("name: required key is missing (it namespaces checkpoints, ledger rows and consumer groups)")
    elif not isinstance(name, str) or not _PIPELINE_NAME_RE.match(name):
        problems.append(f"name: {name!r} must start with a letter or digit and use only letters, digits, '_' and '-'")

    sources: dict[str, KafkaSource] = {}
    plugin_sources: dict[str, PluginSource] = {}
    bounded_models: dict[str, HybridSource | BoundedModel] = {}
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
            model, entry_problems = validate_entry(section, str(entry_id), entry, registry, planned)
            problems.extend(entry_problems)
            if isinstance(model, PluginSource):
                plugin_sources[str(entry_id)] = model
            elif isinstance(model, HybridSource | PostgresTableSource | ClickHouseTableSource | DeltaTableSource):
                bounded_models[str(entry_id)] = model
                if isinstance(model, HybridSource):
                    _add_kafka_phase(str(entry_id), model, sources, problems)
            elif model is not None:
                into[str(entry_id)] = model  # type: ignore[assignment]

    transforms: dict[str, TransformModel | ExecutorTransform] = {}
    raw_transforms = raw.get("transforms") or {}
    if not isinstance(raw_transforms, dict):
        problems.append("transforms: expected a mapping of id -> definition")
        raw_transforms = {}
    for transform_id, transform in raw_transforms.items():
        model, entry_problems = validate_entry("transforms", str(transform_id), transform, TRANSFORM_TYPES, ())
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
        check_source(source_id, source, problems)
    for transform_id, transform in transforms.items():
        if isinstance(transform, DynamicTable):
            check_dynamic_table(transform_id, transform, problems)
    bounded = _plan_bounded(bounded_models, sources, problems)
    plan, inputs = _plan(sources, transforms, declared, problems, plugin_sources, bounded)
    check_sinks(str(name), sinks, plan, inputs, problems)
    job_mode = raw.get("job_mode", False)
    if not isinstance(job_mode, bool):
        problems.append(f"job_mode: {job_mode!r} must be true or false")
        job_mode = False
    if job_mode:
        problems.extend(job_mode_problems(sources, plugin_sources, bounded, "job_mode: true"))

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
        bounded=bounded,
        job_mode=job_mode,
    )


def _add_kafka_phase(
    source_id: str, hybrid: HybridSource, sources: dict[str, KafkaSource], problems: list[str]
) -> None:
    """The hybrid's ``unbounded_source`` as the Kafka source streamed under its id (module doc of
    :mod:`cdcsync.config.bounded`)."""
    from pydantic import ValidationError

    where = yaml_path("sources", source_id, "unbounded_source")
    try:
        sources[source_id] = KafkaSource.model_validate(hybrid.kafka_fields())
    except ValidationError as error:
        problems.extend(pydantic_problems(where, error, KafkaSource))
    except ValueError as error:
        problems.append(f"{where}.start_at: {error}")


def _plan_bounded(
    models: dict[str, HybridSource | BoundedModel], sources: dict[str, KafkaSource], problems: list[str]
) -> dict[str, BoundedPlan]:
    """The bounded phases of each hybrid (columns and key: its Kafka phase's, completed from its schema) and of
    each bounded source alone (its own, required)."""
    from cdcsync.config.bounded import check_phase_columns, plan_of

    plans: dict[str, BoundedPlan] = {}
    for source_id, model in models.items():
        where = yaml_path("sources", source_id)
        if isinstance(model, HybridSource):
            kafka = sources.get(source_id)
            if kafka is None or not all(parses(t) for t in kafka.columns.values()):
                continue  # reported with the Kafka phase
            if kafka.topic_pattern is not None:
                problems.append(f"{where}.unbounded_source.topic_pattern: a hybrid streams one topic (topic:)")
                continue
            for index, phase in enumerate(model.bounded_sources):
                for given in ("columns", "primary_key"):
                    if getattr(phase, given):
                        problems.append(f"{where}.bounded_sources.{index}.{given}: give it once, on the hybrid source")
            phases, columns, key = tuple(model.bounded_sources), kafka.columns, kafka.primary_key
            if not key:
                problems.append(f"{where}.primary_key: required (the bounded phases read the table by key ranges)")
                continue
        else:
            phases, columns, key = (model,), model.columns, model.primary_key
            missing = [name for name in ("columns", "primary_key") if not getattr(model, name)]
            if missing:
                problems.extend(f"{where}.{name}: required key is missing for a bounded source" for name in missing)
                continue
        bad = [name for name, text in columns.items() if not parses(text)]
        problems.extend(f"{where}.columns.{name}: '{columns[name]}' is not a type cdcsync knows" for name in bad)
        unknown = [k for k in key or [] if k not in columns]
        problems.extend(f"{where}.primary_key: '{k}' is not among its columns" for k in unknown)
        if bad or unknown:
            continue
        bounded_plan = plan_of(source_id, phases, columns, key, isinstance(model, HybridSource))
        for index, phase in enumerate(phases):
            at = f"{where}.bounded_sources.{index}" if bounded_plan.streams else where
            check_phase_columns(at, phase, dict(bounded_plan.columns), problems)
        plans[source_id] = bounded_plan
    return plans


def job_mode_problems(
    sources: Mapping[str, KafkaSource],
    plugin_sources: Mapping[str, object],
    bounded: Mapping[str, BoundedPlan],
    why: str,
) -> list[str]:
    """Job mode ends after the bounded phases: a source that only streams would never be read."""
    endless = [sid for sid in [*sources, *plugin_sources] if sid not in bounded]
    return [
        f"sources.{sid}.type: streams without end; {why} needs every source bounded (postgres, clickhouse, delta) "
        "or hybrid"
        for sid in endless
    ]


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
