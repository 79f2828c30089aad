"""Per-table routing of a ``topic_pattern`` source: which topics it reads and what each table is called.

A source with ``topic_pattern`` (a regular expression matched against the *whole* topic name, as Spark's
``subscribePattern`` and Kafka's Java client do) reads every matching topic; each topic is one source table.
A ``type: postgres`` sink fed by such a source is *routed*: its ``schema`` and ``table`` are templates rendered
per topic, so every source table lands in a table of its own.

Template placeholders, written ``{name}`` or, as in the Kafka Connect JDBC sink's ``table.name.format``,
``${name}``:

* ``{schema}`` and ``{table}``: the last two dot-separated parts of the topic name, which is how Debezium names
  topics (``<topic.prefix>.<schema>.<table>``). Topics with fewer than three parts have neither.
* ``{topic}``: the whole topic name with ``.`` replaced by ``_`` (as the JDBC sink's default naming does).

Internally each matching topic becomes a source of its own, :func:`table_source_id`, and each routed sink one
sink per topic, :func:`table_sink_id`: the rest of cdcsync (migrations, sinks, ledgers) handles them like any
other source and sink.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

PLACEHOLDERS = ("schema", "table", "topic")
_PLACEHOLDER_RE = re.compile(r"\$?\{([^{}]*)\}")

if TYPE_CHECKING:
    from cdcsync.config.pipeline import KafkaSource, SchemaLookup, SourceSchema, TopicSchemas


def table_source_id(source_id: str, topic: str) -> str:
    """The id of one table of a pattern source: ``cdc[shop.public.orders]``, read like a YAML path."""
    return f"{source_id}[{topic}]"


def table_sink_id(sink_id: str, topic: str) -> str:
    """The id of one routed table of a sink; its ledger rows, staging and tombstone tables are keyed by it."""
    return f"{sink_id}[{topic}]"


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` is no usable regular expression, or None."""
    try:
        re.compile(pattern)
    except re.error as error:
        return f"not a valid regular expression: {error}"
    return None


def matches(pattern: str, topic: str) -> bool:
    """Whether ``topic`` matches ``pattern`` as a whole (Java's ``Matcher.matches``)."""
    return re.fullmatch(pattern, topic) is not None


def placeholders(template: str) -> list[str]:
    """The placeholders ``template`` uses, in order; ValueError naming an unknown one."""
    used = []
    for match in _PLACEHOLDER_RE.finditer(template):
        name = match.group(1).strip()
        if name not in PLACEHOLDERS:
            known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
            raise ValueError(f"unknown placeholder '{match.group(0)}'; known: {known}")
        used.append(name)
    return used


def name_parts(topic: str) -> dict[str, str]:
    """The values of the placeholders for ``topic`` (``schema`` and ``table`` only for Debezium-style names)."""
    parts = topic.split(".")
    values = {"topic": topic.replace(".", "_")}
    if len(parts) >= 3 and all(parts[-2:]):
        values.update(schema=parts[-2], table=parts[-1])
    return values


def render_name(template: str, topic: str) -> str:
    """``template`` with the placeholders of ``topic`` filled in; ValueError when the topic has no value for one."""
    values = name_parts(topic)
    missing = [name for name in placeholders(template) if name not in values]
    if missing:
        raise ValueError(
            f"topic {topic} is not named <prefix>.<schema>.<table>, so it has no {{{missing[0]}}}; "
            "use {topic}, or narrow topic_pattern"
        )
    return _PLACEHOLDER_RE.sub(lambda match: values[match.group(1).strip()], template)


def evolved_lookup(recorded: SchemaLookup, changed_id: str, topic: str, schema: SourceSchema) -> SchemaLookup:
    """``recorded`` with ``schema`` as the schema of source ``changed_id``, which reads ``topic``: a source of
    its own, or a table (new or not) of a ``topic_pattern`` source."""

    def lookup(pipeline_name: str, source_id: str, source: KafkaSource) -> SourceSchema | TopicSchemas | str | None:
        found = recorded(pipeline_name, source_id, source)
        if source_id == changed_id:
            return schema
        if isinstance(found, dict) and table_source_id(source_id, topic) == changed_id:
            return {**found, topic: schema}
        return found

    return lookup
