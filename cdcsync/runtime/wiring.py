"""What a source's batches are landed with, built from the pipeline: its sinks' driver sides, its transforms and
dynamic tables, the tasks that decode its messages. Shared by the streaming queries, the bounded phases, plugin
sources and ``cdcsync dead-letters replay``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcsync.config.operators import BlackholeSink, KafkaSink, PrintSink, WebhookSink
from cdcsync.config.pipeline import ClickHouseSink, DeltaSink, Pipeline
from cdcsync.config.plugins import PluginSink
from cdcsync.config.settings import Settings
from cdcsync.db.dead_letters import DeadLetterWriter
from cdcsync.db.retry import RetryBudget
from cdcsync.engine.batch import BatchSink
from cdcsync.engine.graph import SourceGraph
from cdcsync.sinks.clickhouse import ClickHouseTableSink
from cdcsync.sinks.console import ConsoleTableSink
from cdcsync.sinks.delta import DeltaTableSink
from cdcsync.sinks.kafka import KafkaTableSink
from cdcsync.sinks.plugins import PluginTableSink
from cdcsync.sinks.postgres import PostgresUpsertSink
from cdcsync.sinks.webhook import WebhookTableSink
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.kafka import DecodeTask, TopicDecoders

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import SparkSession


def retry_budget(settings: Settings | None) -> RetryBudget:
    """The budget ``CDCSYNC__RETRY__BUDGET_S`` sets (the default without settings)."""
    return RetryBudget() if settings is None else RetryBudget(seconds=settings.retry.budget_s)


def build_sinks(pipeline: Pipeline, source_id: str, settings: Settings) -> dict[str, BatchSink]:
    """Driver side of every sink fed by ``source_id``."""
    sinks: dict[str, BatchSink] = {}
    dsn = settings.postgres_dsn
    for sink_id, sink in pipeline.sinks_of(source_id).items():
        if isinstance(sink, ClickHouseSink):
            sinks[sink_id] = ClickHouseTableSink(pipeline, sink_id, sink, dsn, settings.clickhouse_url)
        elif isinstance(sink, DeltaSink):
            sinks[sink_id] = DeltaTableSink(pipeline, sink_id, sink, dsn)
        elif isinstance(sink, PrintSink | BlackholeSink):
            sinks[sink_id] = ConsoleTableSink(pipeline, sink_id, sink, dsn)
        elif isinstance(sink, WebhookSink):
            sinks[sink_id] = WebhookTableSink(pipeline, sink_id, sink, dsn, retry_budget(settings))
        elif isinstance(sink, KafkaSink):
            sinks[sink_id] = KafkaTableSink(pipeline, sink_id, sink, dsn, settings)
        elif isinstance(sink, PluginSink):
            sinks[sink_id] = PluginTableSink(pipeline, sink_id, sink, dsn, retry_budget(settings))
        else:
            sinks[sink_id] = PostgresUpsertSink(pipeline, sink_id, sink, dsn)
    return sinks


def check_delta_tables(spark: SparkSession, sinks: dict[str, BatchSink]) -> None:
    """Refuse (exit 2) a Delta sink whose table is missing or lacks a column: read through Spark, so checked only
    once the session is up, before the sink's first batch."""
    for sink in sinks.values():
        if isinstance(sink, DeltaTableSink):
            sink.check_table(spark)


def build_graph(pipeline: Pipeline, source_id: str, dsn: str) -> SourceGraph | None:
    """The transforms and dynamic tables ``source_id`` feeds; None when its sinks read it directly."""
    # A sink reading a plugin transform reads the view that transform's chain starts from; the chain runs in the
    # sink's own executor pass (cdcsync.transforms.plugins).
    sinks = pipeline.sinks_of(source_id)
    sink_inputs = {sink_id: pipeline.plan.view_of(sink.from_) for sink_id, sink in sinks.items()}
    frames = any(isinstance(sink, DeltaSink) for sink in sinks.values())
    return SourceGraph.of(pipeline, source_id, sink_inputs, dsn, frames=frames)


def source_decoder(
    pipeline: Pipeline,
    source_id: str,
    specs: dict[str, DecodeSpec],
    writer: DeadLetterWriter | None,
    dead_letters: Accumulator[int] | None = None,
    wrappers: tuple[bytes, ...] = (),
    wrappers_met: Accumulator[set[bytes]] | None = None,
) -> DecodeTask | TopicDecoders:
    """What decodes ``source_id``'s Kafka rows on the executors: a :class:`DecodeTask`, or one per table of a
    ``topic_pattern`` source (by topic). ``writer`` None: an undecodable message stops the batch. ``wrappers``:
    the schema wrappers the batch's messages cross without (:class:`~cdcsync.sources.kafka.KnownWrappers`)."""
    tasks = {
        decoded_id: DecodeTask(spec, writer, dead_letters, wrappers=wrappers, wrappers_met=wrappers_met)
        for decoded_id, spec in specs.items()
    }
    route = pipeline.routes.get(source_id)
    if route is None:
        return tasks[source_id]
    return TopicDecoders(source_id, {topic: tasks[table_id] for topic, table_id in route.items()})


def decode_specs(
    pipeline: Pipeline, source_id: str, schema_registry: SchemaRegistryAccess | None
) -> dict[str, DecodeSpec]:
    """The decode spec of the source (of each of its tables, for a ``topic_pattern`` source), with the schema
    types ``init`` recorded (to notice a type change)."""
    specs = {}
    for decoded_id in pipeline.routes.get(source_id, {source_id: source_id}).values():
        schema = pipeline.source_schemas.get(decoded_id)
        specs[decoded_id] = DecodeSpec.from_source(
            decoded_id, pipeline.sources[decoded_id], schema_registry, schema.columns if schema is not None else ()
        )
    return specs
