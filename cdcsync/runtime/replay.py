"""``cdcsync dead-letters replay``: decode the dead letters again with the pipeline as it is now, and land those
that decode in every sink through the same micro-batch path as a streamed batch, exactly once.

Under ``on_decode_error: dlq`` a message the configuration could not decode (a column type too narrow, a decoding
mode the connector does not use) is set aside while the stream goes on, so the key's target rows fork from the
source. Once the configuration is fixed, a replay, per source:

1. decodes every dead letter of the source on the driver (they are few, and their raw bytes are at hand): those
   that still fail keep their row, with the reason they fail with now; a schema change stops the replay as it
   stops a run;
2. lands the ones that decode as one batch of Kafka rows (:func:`cdcsync.engine.batch.land_batch`, or the
   transform graph): decode on the executors, transforms, every sink (mirror, aggregate landing table,
   ClickHouse, lookup side outputs). Each Kafka partition's dead letters are read by one task in offset order,
   and each key collapses to its newest change by ``_cdc_version`` before a merge that only overwrites older
   rows, so the result is that of applying them in version order: a dead letter older than what the target holds
   changes nothing, a newer one lands;
3. removes the applied dead letters in one transaction.

Exactly once: step 2 is ledgered like any batch, under the checkpoint id ``dead-letters/<source>`` and a batch
id derived from the ids of the dead letters it applies. A replay that crashed between 2 and 3 finds the same
dead letters decoding the same way next time, so the same ledger key: sinks that merged are skipped, the others
merge, then step 3 runs. (Had the configuration changed in between so that more now decode, the key differs and
every sink merges the new set; the changes already merged are then older than or equal to what the targets hold,
which the version-wins merges ignore.)

The replay holds the pipeline's lock (:mod:`cdcsync.runtime.lock`): it never runs beside ``cdcsync run``.

What a replay cannot repair: a column whose unchanged TOASTed value Debezium left out (its placeholder) in a
change newer than the dead letter keeps the stored value; if the dead letter was the only change that carried the
value, the target keeps the placeholder's stand-in there until the column changes again (docs/operations.md).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdcsync.core.reports import Kind, Report, first_to_raise
from cdcsync.db.dead_letters import DeadLetter, read_dead_letters, settle_replayed
from cdcsync.db.ledger import fence_all
from cdcsync.db.retry import with_retries
from cdcsync.engine.batch import land_batch
from cdcsync.engine.graph import land_graph_batch
from cdcsync.runtime.lock import PipelineLock
from cdcsync.runtime.wiring import build_graph, build_sinks, decode_specs, source_decoder
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess
from cdcsync.sources.debezium.dispatch import decode_batches
from cdcsync.sources.kafka import DecodeTask
from cdcsync.sources.kafka_fetch import KafkaBatch

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from cdcsync.config.pipeline import Pipeline
    from cdcsync.config.settings import Settings
    from cdcsync.sources.debezium.spec import DecodeSpec

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "dead-letters/"
"""Ledger rows of replays have checkpoint ids ``dead-letters/<source>``; streamed batches have Spark's query id."""


@dataclass
class SourceReplay:
    source: str
    applied: int = 0
    still_failing: list[tuple[DeadLetter, str]] = field(default_factory=list)
    """Each with the reason it fails with now."""


def replay_dead_letters(
    pipeline: Pipeline,
    settings: Settings,
    start_spark: Callable[[], SparkSession],
    pipeline_file: str = "PIPELINE.yaml",
) -> list[SourceReplay]:
    """Replay every dead letter of ``pipeline`` (see the module doc); Spark starts only if one decodes now."""
    spark: SparkSession | None = None
    results = []
    with PipelineLock(settings.postgres_dsn, pipeline.name) as lock:
        lock.acquire(wait=False)
        letters = read_dead_letters(settings.postgres_dsn, pipeline.name)
        by_source: dict[str, list[DeadLetter]] = {}
        for letter in letters:
            by_source.setdefault(letter.source, []).append(letter)
        registry = SchemaRegistryAccess.from_settings(settings)
        for source_id, source_letters in by_source.items():
            result = SourceReplay(source_id)
            results.append(result)
            if source_id not in pipeline.streams():
                why = f"source '{source_id}' is not in the pipeline any more"
                result.still_failing = [(letter, why) for letter in source_letters]
                settle_replayed(settings.postgres_dsn, pipeline.name, [], {x.id: why for x, _ in result.still_failing})
                continue
            specs = decode_specs(pipeline, source_id, registry)
            failing = _decode_again(pipeline, source_id, specs, source_letters, pipeline_file)
            applied = [letter for letter in source_letters if letter.id not in failing]
            result.still_failing = [(letter, failing[letter.id]) for letter in source_letters if letter.id in failing]
            if applied:
                if spark is None:
                    spark = start_spark()
                _land(spark, pipeline, settings, source_id, specs, applied, pipeline_file, lock)
            settle_replayed(settings.postgres_dsn, pipeline.name, [x.id for x in applied], failing)
            result.applied = len(applied)
    return results


def _decode_again(
    pipeline: Pipeline, source_id: str, specs: dict[str, DecodeSpec], letters: list[DeadLetter], pipeline_file: str
) -> dict[int, str]:
    """Decode ``letters`` with the pipeline as it is now (on the driver); the ids that still fail, with why."""
    import pyarrow.compute as pc

    route = pipeline.routes.get(source_id)
    failing: dict[int, str] = {}
    by_spec: dict[str, list[DeadLetter]] = {}
    for letter in letters:
        decoded_id = source_id if route is None else route.get(letter.topic)
        if decoded_id is None:
            failing[letter.id] = f"topic {letter.topic} has no table in the pipeline: run `cdcsync init` first"
        else:
            by_spec.setdefault(decoded_id, []).append(letter)
    for decoded_id, group in by_spec.items():
        by_place = {(x.topic, x.partition, x.offset): x for x in group}
        stops: list[Report] = []
        for out in decode_batches(iter(kafka_rows(group).to_batches()), specs[decoded_id]):
            bad = out.filter(pc.is_valid(out.column("_dlq_report")))
            where = ("_cdc_topic", "_cdc_partition", "_cdc_offset", "_dlq_report", "_dlq_reason")
            columns = (bad.column(c).to_pylist() for c in where)
            for topic, partition, offset, report, reason in zip(*columns, strict=True):
                found = Report.decode(report)
                if found.kind is Kind.UNDECODABLE:
                    failing[by_place[(topic, partition, offset)].id] = reason
                else:
                    stops.append(found.located(source=decoded_id, topic=topic, partition=partition, offset=offset))
        stop = first_to_raise(stops)
        if stop is not None:  # a schema change: init and migrate first, as for a run
            raise stop.error("replaying dead letters", pipeline_file)
    return failing


def kafka_rows(letters: list[DeadLetter]) -> pa.Table:
    """Dead letters as the rows Spark's Kafka source gives (the decoder's input columns), in Kafka order. The
    message timestamp is unknown (it is only a fallback for ``_cdc_ts`` when a message has no ``ts_ms``)."""
    import pyarrow as pa

    ordered = sorted(letters, key=lambda x: (x.topic, x.partition, x.offset))
    return pa.table(
        {
            "key": pa.array([x.key for x in ordered], pa.binary()),
            "value": pa.array([x.value for x in ordered], pa.binary()),
            "topic": pa.array([x.topic for x in ordered], pa.string()),
            "partition": pa.array([x.partition for x in ordered], pa.int32()),
            "offset": pa.array([x.offset for x in ordered], pa.int64()),
            "timestamp": pa.nulls(len(ordered), pa.timestamp("us", tz="UTC")),
        }
    )


def replay_batch_id(ids: list[int]) -> int:
    """The ledger batch id of a replay of these dead letters: the same set, the same id (63 bits)."""
    digest = hashlib.blake2b(",".join(map(str, sorted(ids))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _land(
    spark: SparkSession,
    pipeline: Pipeline,
    settings: Settings,
    source_id: str,
    specs: dict[str, DecodeSpec],
    letters: list[DeadLetter],
    pipeline_file: str,
    lock: PipelineLock,
) -> None:
    # One task reads them all, in Kafka order: each key's changes meet in one task, as in a streamed batch.
    raw = KafkaBatch(spark.createDataFrame(kafka_rows(letters)).coalesce(1))
    batch_id = replay_batch_id([x.id for x in letters])
    checkpoint_id = f"{CHECKPOINT_PREFIX}{source_id}"
    decode = source_decoder(pipeline, source_id, specs, writer=None)  # they decoded on the driver: none fails now
    sinks = build_sinks(pipeline, source_id, settings)
    graph = build_graph(pipeline, source_id, settings.postgres_dsn)
    fence_all(lock.fence, [*sinks.values(), *(graph.tables.values() if graph else ())])  # only while locked
    if graph is None:
        land = functools.partial(land_batch, raw, batch_id, checkpoint_id, decode, sinks, pipeline_file)
    else:
        assert isinstance(decode, DecodeTask), "sources with transforms read one topic"
        land = functools.partial(land_graph_batch, raw, batch_id, checkpoint_id, decode, graph, sinks, pipeline_file)
    outcome = with_retries(land, describe=f"source '{source_id}': replaying {len(letters)} dead letter(s)")
    log.info("source '%s': replayed %d dead letter(s): %s", source_id, len(letters), outcome)
