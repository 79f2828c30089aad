"""Plugins in a pipeline: operators found through the entry-point group ``cdcsync.plugins``, named
``<namespace>.<operator>`` in YAML with their ``options:``, and checked before Spark starts.

An unknown namespace or operator is refused with the closest installed one; options are validated by the
operator's own ``Options`` model and every problem is reported with its YAML path (``sinks.out.options.mode``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from cdcsync.config.base import StrictModel, as_key_list, did_you_mean
from cdcsync.config.code_transforms import CodeTransform, ScriptTransform, output_problems, script_problems
from cdcsync.config.plan import PluginSourceStep, PluginStep
from cdcsync.config.types import PgType
from cdcsync.core.plugins import ENTRY_POINT_GROUP, Operator, Plugin, SinkPlugin, SourcePlugin, TransformPlugin

Kind = Literal["sources", "transforms", "sinks"]
_BASES: dict[str, type[Operator]] = {"sources": SourcePlugin, "transforms": TransformPlugin, "sinks": SinkPlugin}
_ID_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")
OptionValue = str | int | float | bool


def is_plugin_type(type_name: object) -> bool:
    """``namespace.operator``: a plugin's id (built-in types have no dot)."""
    return isinstance(type_name, str) and "." in type_name


@dataclass(frozen=True)
class Installed:
    """One installed operator, as ``cdcsync plugins`` lists it."""

    id: str
    kind: Kind
    operator: type[Operator]
    distribution: str
    version: str

    @property
    def summary(self) -> str:
        doc = (self.operator.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


@dataclass(frozen=True)
class Registry:
    operators: dict[str, Installed]
    problems: tuple[str, ...]
    """Entry points that could not be loaded (shown by ``cdcsync plugins``, and by validation when used)."""

    def of_kind(self, kind: Kind) -> dict[str, Installed]:
        return {op_id: found for op_id, found in self.operators.items() if found.kind == kind}


@functools.cache
def installed() -> Registry:
    """Every operator of every installed plugin (loaded once per process)."""
    from importlib.metadata import entry_points

    operators: dict[str, Installed] = {}
    problems: list[str] = []
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        where = f"plugin '{entry.name}' ({entry.value})"
        try:
            plugin = entry.load()
        except Exception as error:  # a broken plugin must not break cdcsync itself
            problems.append(f"{where}: cannot be loaded: {type(error).__name__}: {error}")
            continue
        if not isinstance(plugin, Plugin):
            problems.append(f"{where}: is a {type(plugin).__name__}, not a cdcsync.core.plugins.Plugin")
            continue
        dist = getattr(entry, "dist", None)
        groups: tuple[tuple[Kind, Mapping[str, type[Operator]]], ...] = (
            ("sources", plugin.sources),
            ("transforms", plugin.transforms),
            ("sinks", plugin.sinks),
        )
        for kind, members in groups:
            for name, operator in members.items():
                if not (isinstance(operator, type) and issubclass(operator, _BASES[kind])):
                    problems.append(f"{where}: {kind} '{name}' is not a {_BASES[kind].__name__}")
                    continue
                op_id = f"{entry.name}.{name}"
                operators[op_id] = Installed(
                    op_id,
                    kind,
                    operator,
                    dist.name if dist else "?",
                    dist.version if dist else "?",
                )
    return Registry(operators, tuple(problems))


def find(kind: Kind, where: str, type_name: str, builtin: list[str]) -> tuple[Installed | None, list[str]]:
    """The installed operator ``type_name`` of ``kind``, or the problems naming the closest ones."""
    registry = installed()
    found = registry.operators.get(type_name)
    if found is not None and found.kind == kind:
        return found, []
    if found is not None:
        return None, [f"{where}.type: '{type_name}' is a plugin {found.kind[:-1]}, not a {kind[:-1]}"]
    if not _ID_RE.match(type_name):
        return None, [f"{where}.type: '{type_name}' is not a plugin id (namespace.operator, letters, digits, '_')"]
    choices = [*builtin, *registry.of_kind(kind)]
    known = ", ".join(registry.of_kind(kind)) or "none installed"
    problems = [
        f"{where}.type: '{type_name}' is not an installed plugin {kind[:-1]}{did_you_mean(type_name, choices)}; "
        f"plugin {kind}: {known} (see `cdcsync plugins`)"
    ]
    problems += [f"{where}.type: {problem}" for problem in registry.problems if type_name.split(".")[0] in problem]
    return None, problems


def check_options(where: str, operator: type[Operator], options: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The options as the operator's ``Options`` model validates them (or as given), and the problems found."""
    model = operator.Options
    if model is None:
        bad = [
            f"{where}.options.{name}: must be a string, number or boolean"
            for name, value in options.items()
            if not isinstance(value, OptionValue)
        ]
        return dict(options), bad
    try:
        return model.model_validate(dict(options)), []
    except ValidationError as error:
        from cdcsync.config.checks import pydantic_problems

        return None, pydantic_problems(f"{where}.options", error, model)


class _PluginEntry(StrictModel):
    type: str
    options: dict[str, Any] = Field(default_factory=dict)
    """Checked by the operator's ``Options`` model."""
    primary_key: list[str] | None = None

    _normalise_pk = field_validator("primary_key", mode="before")(as_key_list)


class PluginSource(_PluginEntry):
    """``type: namespace.operator``: a plugin source, a streaming DataFrame of rows (docs/plugins.md); its key
    defaults to the operator's ``primary_key()``."""


class PluginTransform(_PluginEntry):
    """``type: namespace.operator``: a plugin transform of one stream (a source or a transform); its key defaults
    to the input's."""

    from_: str = Field(alias="from", min_length=1)


class PluginSink(_PluginEntry):
    """``type: namespace.operator``: a plugin sink, ledgered and given idempotency keys by the runtime."""

    from_: str = Field(alias="from", min_length=1)
    batch_size: int = Field(default=10_000, gt=0)
    """Changes per :meth:`~cdcsync.core.plugins.SinkPlugin.write` call, at most."""


def validate_plugin_entry(
    kind: Kind, entry_id: str, raw: dict[str, Any], builtin: list[str]
) -> tuple[StrictModel | None, list[str]]:
    """A plugin transform's or sink's entry, its operator found and its options checked."""
    from cdcsync.config.checks import pydantic_problems

    where = f"{kind}.{entry_id}"
    operator, problems = find(kind, where, str(raw["type"]), builtin)
    models: dict[str, type[PluginSource | PluginTransform | PluginSink]] = {
        "sources": PluginSource,
        "transforms": PluginTransform,
        "sinks": PluginSink,
    }
    model = models[kind]
    try:
        entry = model.model_validate(raw)
    except ValidationError as error:
        return None, [*problems, *pydantic_problems(where, error, model)]
    if operator is None:
        return None, problems
    _, option_problems = check_options(where, operator.operator, entry.options)
    if option_problems:
        return None, option_problems
    return entry, []


def operator_of(type_name: str) -> type[Operator]:
    """The operator class of a validated plugin entry."""
    return installed().operators[type_name].operator


def options_of(type_name: str, options: Mapping[str, Any]) -> Any:
    """The options a validated entry's operator is built with (its ``Options`` model, or the mapping)."""
    validated, problems = check_options("", operator_of(type_name), options)
    assert not problems, "validated entries have valid options"
    return validated


def plan_transforms(
    transforms: Mapping[str, PluginTransform | CodeTransform],
    columns: dict[str, dict[str, PgType]],
    primary_keys: dict[str, list[str] | None],
    invalid: set[str],
    problems: list[str],
) -> dict[str, PluginStep]:
    """Plan the plugin, handler and script transforms over the planned nodes (``columns``, ``primary_keys``:
    updated in place with each planned one); those whose input is unknown, invalid or a cycle are reported (or
    skipped, when their input was reported already) and added to ``invalid``."""
    steps: dict[str, PluginStep] = {}
    pending = dict(transforms)
    while pending:
        ready = [tid for tid, t in pending.items() if t.from_ in columns or t.from_ in invalid]
        if not ready:
            for tid, transform in sorted(pending.items()):
                known = sorted(columns)
                if transform.from_ in pending:
                    problems.append(
                        f"transforms.{tid}.from: plugin, handler or script transforms read each other in a cycle"
                    )
                else:
                    problems.append(
                        f"transforms.{tid}.from: '{transform.from_}' is not a source or transform"
                        f"{did_you_mean(transform.from_, known)}; known: {', '.join(known) or 'none'}"
                    )
                invalid.add(tid)
            return steps
        for tid in ready:
            transform = pending.pop(tid)
            where = f"transforms.{tid}"
            if transform.from_ in invalid:
                invalid.add(tid)
                continue
            inputs = columns[transform.from_]
            if isinstance(transform, PluginTransform):
                output = _plugin_output(where, transform, inputs, problems)
            else:
                output = _code_output(where, transform, inputs, primary_keys.get(transform.from_), problems)
            if output is None:
                invalid.add(tid)
                continue
            key = transform.primary_key or primary_keys.get(transform.from_) or []
            missing = [column for column in key if column not in output]
            if missing:
                problems.append(f"{where}.primary_key: column(s) {', '.join(missing)} not among its output columns")
                invalid.add(tid)
                continue
            options = (
                transform.options if isinstance(transform, PluginTransform) else transform.model_dump(by_alias=True)
            )
            steps[tid] = PluginStep(
                id=tid,
                input=transform.from_,
                type=transform.type,
                options=tuple(options.items()),
                primary_key=tuple(key),
                columns=tuple(output.items()),
            )
            columns[tid] = output
            primary_keys[tid] = list(key)
    return steps


def _plugin_output(
    where: str, transform: PluginTransform, inputs: dict[str, PgType], problems: list[str]
) -> dict[str, PgType] | None:
    """A plugin transform's output columns, as its operator declares them from its input's."""
    from cdcsync.config.types import UnknownTypeError, parse_pg_type

    try:
        operator = operator_of(transform.type)(options_of(transform.type, transform.options))
        declared = dict(operator.output_columns({n: t.sql for n, t in inputs.items()}))  # type: ignore[attr-defined]
        return {name: parse_pg_type(type_text) for name, type_text in declared.items()}
    except UnknownTypeError as error:
        problems.append(f"{where}.type: '{transform.type}' declares an output column type cdcsync lacks: {error}")
    except Exception as error:  # plugin code: its failure is the pipeline's problem, reported as such
        problems.append(f"{where}.options: '{transform.type}' refused them: {type(error).__name__}: {error}")
    return None


def _code_output(
    where: str,
    transform: CodeTransform,
    inputs: dict[str, PgType],
    input_key: list[str] | None,
    problems: list[str],
) -> dict[str, PgType] | None:
    """A handler's or script's output columns: its input's with ``schema_overrides`` applied; a script that
    cannot run in the sandbox, and overrides that touch the key, are reported."""
    from cdcsync.config.types import UnknownTypeError, parse_pg_type

    declared, found = output_problems(where, {n: t.sql for n, t in inputs.items()}, transform.schema_overrides)
    if isinstance(transform, ScriptTransform):
        found += script_problems(where, transform)
    key = transform.primary_key or input_key or []
    for name in transform.schema_overrides:
        if name in key:
            found.append(f"{where}.schema_overrides.{name}: '{name}' is in the key, which passes through unchanged")
    output: dict[str, PgType] = {}
    for name, type_text in declared.items():
        try:
            same = name in inputs and type_text == inputs[name].sql
            output[name] = inputs[name] if same else parse_pg_type(type_text)
        except UnknownTypeError as error:
            found.append(f"{where}.schema_overrides.{name}: {error}")
    problems.extend(found)
    return None if found else output


def plan_sources(
    sources: Mapping[str, PluginSource],
    columns: dict[str, dict[str, PgType]],
    primary_keys: dict[str, list[str] | None],
    invalid: set[str],
    problems: list[str],
) -> dict[str, PluginSourceStep]:
    """The plugin sources' columns and keys, from their operators (``columns``, ``primary_keys``: updated in
    place); those whose operator refuses its options or declares a type cdcsync lacks are reported."""
    from cdcsync.config.types import UnknownTypeError, parse_pg_type

    steps: dict[str, PluginSourceStep] = {}
    for source_id, source in sources.items():
        where = f"sources.{source_id}"
        try:
            operator = operator_of(source.type)(options_of(source.type, source.options))
            output = {name: parse_pg_type(text) for name, text in operator.columns().items()}  # type: ignore[attr-defined]
            key = source.primary_key or list(operator.primary_key())  # type: ignore[attr-defined]
        except UnknownTypeError as error:
            problems.append(f"{where}.type: '{source.type}' declares a column type cdcsync lacks: {error}")
            invalid.add(source_id)
            continue
        except Exception as error:  # plugin code: its failure is the pipeline's problem, reported as such
            problems.append(f"{where}.options: '{source.type}' refused them: {type(error).__name__}: {error}")
            invalid.add(source_id)
            continue
        missing = [column for column in key if column not in output]
        if not key or missing:
            problems.append(
                f"{where}.primary_key: "
                + (
                    f"column(s) {', '.join(missing)} not among its columns"
                    if missing
                    else "required (the plugin names none)"
                )
                + f"; its columns: {', '.join(output)}"
            )
            invalid.add(source_id)
            continue
        steps[source_id] = PluginSourceStep(
            source_id, source.type, tuple(source.options.items()), tuple(key), tuple(output.items())
        )
        columns[source_id] = output
        primary_keys[source_id] = list(key)
    return steps
