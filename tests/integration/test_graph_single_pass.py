"""A transform graph whose batch one staging pass reads (two Postgres sinks on one SQL transform), on the tests'
Spark session and a real Postgres, without Kafka (the rows are Spark's Kafka source columns): that pass decodes,
transforms and stages the batch without caching it, yet an undecodable message under ``on_decode_error: fail``
still stops the batch with the decoder's report and nothing merged, even though the transform's WHERE would have
rejected its row and the stage already holds the other rows; the same batch without it then lands exactly. And the
check's safety net: a batch whose pass did not decode every partition is decoded again on its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import Pipeline
from cdcsync.core import names
from cdcsync.core.errors import CdcsyncError
from cdcsync.devstack import workload
from cdcsync.engine import graph as graph_module
from cdcsync.engine.batch import BatchSink
from cdcsync.engine.graph import SourceGraph, land_graph_batch
from cdcsync.migrations import POSTGRES
from cdcsync.runtime.wiring import build_graph, decode_specs
from cdcsync.sinks.postgres import PostgresUpsertSink
from cdcsync.sources.kafka import DecodeTask
from cdcsync.sources.kafka_fetch import KafkaBatch
from tests.e2e.conftest import ledger_batches, mirror_rows
from tests.integration.test_wrapper_cut import kafka_rows

pytestmark = pytest.mark.integration

CHECKPOINT = "5e1f-single-pass"
COLUMNS = list(workload.ORDERS_COLUMNS)


def _pipeline() -> Pipeline:
    source = {
        "type": "kafka",
        "topic": "shop.public.orders",
        "primary_key": "id",
        "columns": dict(workload.ORDERS_COLUMNS),
        "on_decode_error": "fail",
    }
    big = {"type": "sql", "sql": "SELECT * FROM orders WHERE amount > 100", "primary_key": "id"}
    sinks = {
        "mirror": {"type": "postgres", "from": "big", "schema": "app", "table": "big"},
        "audit": {"type": "postgres", "from": "big", "schema": "app", "table": "big_audit", "delete_mode": "soft"},
    }
    return validate_pipeline_dict(
        {"name": "onepass", "sources": {"orders": source}, "transforms": {"big": big}, "sinks": sinks}
    )


def _setup(dsn: str, root: Path) -> tuple[Pipeline, SourceGraph, dict[str, BatchSink], DecodeTask]:
    pipeline = _pipeline()
    migrations.init(POSTGRES, pipeline, root)
    with psycopg.connect(dsn) as conn:
        migrations.apply_pending(POSTGRES, conn, pipeline.name, root)
    graph = build_graph(pipeline, "orders", dsn)
    assert graph is not None
    sinks: dict[str, BatchSink] = {
        sink_id: PostgresUpsertSink(pipeline, sink_id, sink, dsn) for sink_id, sink in pipeline.sinks.items()
    }
    decode = DecodeTask(decode_specs(pipeline, "orders", None)["orders"], dead_letters=None)  # on_decode_error: fail
    return pipeline, graph, sinks, decode


def _staged(dsn: str, pipeline: Pipeline) -> int:
    query = sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(names.INTERNAL_SCHEMA, names.stage_table(pipeline.name, "mirror"))
    )
    with psycopg.connect(dsn) as conn:
        return int(conn.execute(query).fetchone()[0])  # type: ignore[index]


def test_a_decode_failure_stops_the_single_pass_batch_before_anything_merges(
    spark: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    pipeline, graph, sinks, decode = _setup(postgres_dsn, tmp_path)
    assert graph_module._one_pass(graph, sinks), "two Postgres sinks on one transform: one pass, no cache"
    load = workload.generate(600, 150, seed=3)
    good = [(e.key, e.value) for e in load.events]
    bad = [(e.key, e.value) for e in workload.malformed_events()[1:2]]  # text that is not JSON: its row is all nulls
    raw, _ = kafka_rows(spark, good[:300] + bad + good[300:])
    assert raw.rdd.getNumPartitions() > 1

    with pytest.raises(CdcsyncError) as failed:
        land_graph_batch(KafkaBatch(raw), 0, CHECKPOINT, decode, graph, sinks, "onepass.yaml")
    assert str(failed.value).startswith("message at shop.public.orders/")  # the decoder's report, as before
    assert "could not be decoded: value is not JSON" in str(failed.value)
    assert _staged(postgres_dsn, pipeline) > 0, "the pass staged before the check stopped it"
    assert ledger_batches(postgres_dsn, "onepass") == {}
    assert mirror_rows(postgres_dsn, "app", "big", COLUMNS) == {}
    assert mirror_rows(postgres_dsn, "app", "big_audit", COLUMNS) == {}

    fixed, _ = kafka_rows(spark, good)
    outcome = land_graph_batch(KafkaBatch(fixed), 0, CHECKPOINT, decode, graph, sinks, "onepass.yaml")
    assert not any(o.skipped for o in outcome.values())
    expected = {k: row for k, row in load.expected.items() if row["amount"] is not None and row["amount"] > 100}
    assert 0 < len(expected) < len(load.expected)
    assert mirror_rows(postgres_dsn, "app", "big", COLUMNS) == expected  # no row of the failed attempt's stage
    audit = mirror_rows(postgres_dsn, "app", "big_audit", [*COLUMNS, "_cdc_deleted"])
    assert {k: {c: r[c] for c in COLUMNS} for k, r in audit.items() if not r["_cdc_deleted"]} == expected
    assert ledger_batches(postgres_dsn, "onepass") == {"audit": [0], "mirror": [0]}
    assert _staged(postgres_dsn, pipeline) == 0


def test_partitions_the_pass_did_not_decode_are_decoded_again(spark: Any, postgres_dsn: str, tmp_path: Path) -> None:
    _, _, _, decode = _setup(postgres_dsn, tmp_path)
    events = [(e.key, e.value) for e in workload.generate(100, 30, seed=4).events]
    bad = [(e.key, e.value) for e in workload.malformed_events()[1:2]]
    unread = graph_module._DecodedInPass.of(KafkaBatch(kafka_rows(spark, events + bad)[0]), decode, 7, "onepass.yaml")
    with pytest.raises(CdcsyncError, match="could not be decoded"):
        unread.check()  # no pass ran: no partition reported its end
    graph_module._DecodedInPass.of(KafkaBatch(kafka_rows(spark, events)[0]), decode, 8, "onepass.yaml").check()
