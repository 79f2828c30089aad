"""The source schemas ``cdcsync init`` recorded in the state line of the Postgres migrations (see
:func:`cdcsync.migrations.postgres.sources_state`), read back by ``validate`` and ``run``, which then need neither
a schema registry nor Kafka to know a source's columns.

``run`` refuses to start unless every migration is applied, so these are exactly the columns the applied
migrations created.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cdcsync.config.pipeline import NO_COLUMNS
from cdcsync.migrations.files import list_migration_files, migrations_path
from cdcsync.migrations.plan import last_state
from cdcsync.migrations.postgres import POSTGRES

if TYPE_CHECKING:
    from cdcsync.config.pipeline import KafkaSource, SchemaLookup, SourceSchema, TopicSchemas


def recorded_schemas(migrations_dir: Path | str, pipeline_name: str) -> dict[str, tuple[str, SourceSchema]]:
    """(topic, schema) of each source whose schema the last Postgres migration's state records, by source id."""
    from cdcsync.config.pipeline import SourceSchema

    last_path, last = last_state(POSTGRES, list_migration_files(migrations_dir, pipeline_name, POSTGRES.name))
    recorded: dict[str, tuple[str, SourceSchema]] = {}
    for source_id, entry in ((last or {}).get("sources") or {}).items():
        key = entry.get("primary_key")
        schema = SourceSchema(
            columns=tuple((str(c["name"]), str(c["type"])) for c in entry.get("columns") or []),
            primary_key=tuple(key) if key else None,
            origin=str(last_path),
        )
        recorded[source_id] = (str(entry.get("topic")), schema)
    return recorded


def recorded_tables(
    recorded: dict[str, tuple[str, SourceSchema]], source_id: str, pattern: str
) -> dict[str, SourceSchema | str]:
    """The tables of ``topic_pattern`` source ``source_id`` that the migrations record (topic -> schema): those
    ``init`` found, as long as their topic still matches the pattern."""
    from cdcsync.config.routing import matches, table_source_id

    return {
        topic: schema
        for table_id, (topic, schema) in recorded.items()
        if table_id == table_source_id(source_id, topic) and matches(pattern, topic)
    }


def recorded_lookup(migrations_dir: Path | str) -> SchemaLookup:
    """A ``schema_for`` for :func:`~cdcsync.config.load.load_pipeline`: the schemas recorded in the
    migrations. A source whose topic changed since has none (``init`` reads the new topic's)."""
    cache: dict[str, dict[str, tuple[str, SourceSchema]]] = {}

    def lookup(pipeline_name: str, source_id: str, source: KafkaSource) -> SourceSchema | TopicSchemas | str | None:
        if pipeline_name not in cache:
            cache[pipeline_name] = recorded_schemas(migrations_dir, pipeline_name)
        if source.topic_pattern is not None:
            return recorded_tables(cache[pipeline_name], source_id, source.topic_pattern)
        topic, schema = cache[pipeline_name].get(source_id, (None, None))
        if schema is None or topic != source.topic:
            directory = migrations_path(migrations_dir, pipeline_name, POSTGRES.name)
            return NO_COLUMNS.replace("no migration", f"no migration in {directory}")
        return schema

    return lookup
