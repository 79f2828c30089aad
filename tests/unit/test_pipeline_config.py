"""Every invalid pipeline is refused with the exact YAML path of the problem."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcsync import migrations
from cdcsync.config.load import load_pipeline, validate_pipeline_dict
from cdcsync.config.types import UnknownTypeError, parse_pg_type
from cdcsync.core.errors import ConfigError, exit_code_for
from cdcsync.migrations import DELTA, POSTGRES

pytestmark = pytest.mark.unit

VALID: dict[str, Any] = {
    "name": "shop",
    "sources": {
        "orders": {
            "type": "kafka",
            "topic": "shop.public.orders",
            "primary_key": "id",
            "columns": {"id": "bigint", "customer_id": "bigint", "Amount": "double precision"},
        }
    },
    "sinks": {
        "orders_mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders", "primary_key": "id"}
    },
}


def with_change(path: str, value: Any, base: dict[str, Any] = VALID) -> dict[str, Any]:
    """A copy of ``base`` with the dotted ``path`` set to ``value`` (``...`` deletes the key)."""
    doc = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return doc


def problems_of(doc: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(doc)
    assert exit_code_for(caught.value) == 2
    return caught.value.problems or [caught.value.message]


def test_valid_pipeline_loads_with_defaults() -> None:
    pipeline = validate_pipeline_dict(VALID)
    sink = pipeline.sinks["orders_mirror"]
    assert pipeline.sink_primary_key(sink) == ["id"]
    assert sink.delete_mode == "hard"
    assert pipeline.sources["orders"].on_decode_error == "fail"  # Kafka Connect's default
    assert pipeline.sources["orders"].format == "json"


def test_sink_key_defaults_to_source_key() -> None:
    pipeline = validate_pipeline_dict(with_change("sinks.orders_mirror.primary_key", ...))
    assert pipeline.sink_primary_key(pipeline.sinks["orders_mirror"]) == ["id"]


def test_composite_keys_are_lists() -> None:
    doc = with_change("sources.orders.primary_key", ["id", "customer_id"])
    doc["sinks"]["orders_mirror"]["primary_key"] = ["id", "customer_id"]
    pipeline = validate_pipeline_dict(doc)
    assert pipeline.sink_primary_key(pipeline.sinks["orders_mirror"]) == ["id", "customer_id"]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            "sinks.orders_mirror.primary_key",
            "idd",
            "sinks.orders_mirror.primary_key: column 'idd' is not in source 'orders' (did you mean 'id'?)",
        ),
        (
            "sources.orders.primary_key",
            "order_id",
            "sources.orders.primary_key: column 'order_id' is not in the source's columns",
        ),
        (
            "sinks.orders_mirror.from",
            "orderz",
            "sinks.orders_mirror.from: 'orderz' is not a source or sql transform (did you mean 'orders'?)",
        ),
        (
            "sinks.orders_mirror.delete_mode",
            "purge",
            "sinks.orders_mirror.delete_mode: 'purge' is not one of hard, soft",
        ),
        (
            "sinks.orders_mirror.delet_mode",
            "soft",
            "sinks.orders_mirror.delet_mode: unknown key (did you mean 'delete_mode'?)",
        ),
        (
            "sinks.orders_mirror.type",
            "postgress",
            "sinks.orders_mirror.type: 'postgress' is not one of postgres, postgres_aggregate, clickhouse, delta, "
            "print, blackhole, webhook, kafka (did you mean 'postgres'?)",
        ),
        (
            "sinks.orders_mirror.type",
            "dynamic_table",
            "sinks.orders_mirror.type: 'dynamic_table' is not available in this version",
        ),
        ("sinks.orders_mirror.table", ..., "sinks.orders_mirror.table: required key is missing"),
        (
            "sinks.orders_mirror.table",
            "t" * 64,
            "sinks.orders_mirror.table: '" + "t" * 64 + "' is longer than Postgres' 63-byte",
        ),
        ("sources.orders.topic", ..., "sources.orders.topic: required key is missing"),
        ("sources.orders.type", ..., "sources.orders.type: required key is missing"),
        ("sources.orders.type", "kinesis", "sources.orders.type: 'kinesis' is not one of kafka"),
        ("sources.orders.format", "protobuf", "sources.orders.format: 'protobuf' is not one of json, avro"),
        (
            "sources.orders.on_decode_error",
            "ignore",
            "sources.orders.on_decode_error: 'ignore' is not one of dlq, fail",
        ),
        ("sources.orders.columns", {}, "sources.orders.columns:"),
        (
            "sources.orders.options",
            {"minPartitions": "8"},
            "sources.orders.options: 'minPartitions' is not supported: it splits one Kafka partition",
        ),
        (
            "sources.orders.options",
            {"maxRecordsPerPartition": "1000"},
            "sources.orders.options: 'maxRecordsPerPartition'",
        ),
        (
            "sources.orders.columns",
            {"id": "bigint", "x": "bignum"},
            "sources.orders.columns.x: 'bignum' is not a Postgres type",
        ),
        (
            "sources.orders.columns",
            {"id": "bigint", "x": "numeric(2,5)"},
            "sources.orders.columns.x: 'numeric(2,5)': numeric scale",
        ),
        (
            "sources.orders.columns",
            {"id": "bigint", "_cdc_op": "text"},
            "sources.orders.columns._cdc_op: names starting with '_cdc_' and _batch_id",
        ),
        ("sources.orders.columns", {"id": "bigint", "x": 5}, "sources.orders.columns"),
        ("sources.orders.columns", {"id": "bigint", "_batch_id": "int"}, "sources.orders.columns._batch_id: names"),
        ("sinks.orders_mirror.primary_key", ["id", "id"], "sinks.orders_mirror.primary_key: a column is listed twice"),
        (
            "sources.orders.max_offsets_per_trigger",
            0,
            "sources.orders.max_offsets_per_trigger: Input should be greater than 0",
        ),
        ("sources.orders.options", {"subscribe": "x"}, "sources.orders.options.subscribe: set by cdcsync itself"),
        ("name", ..., "name: required key is missing"),
        ("name", "shop pipeline!", "name: 'shop pipeline!' must start with a letter or digit"),
        ("sinks", {}, "sinks: at least one entry is required"),
        ("sources", [], "sources: at least one entry is required"),
        ("sinks", ["a"], "sinks: expected a mapping"),
        ("sinks.orders_mirror", "postgres", "sinks.orders_mirror: expected a mapping of keys, got str"),
        ("transforms", {"big": {"type": "sql"}}, "transforms.big.sql: required key is missing"),
        ("transforms", {"big": {"type": "python"}}, "transforms.big.type: 'python' is not one of sql, dynamic_table"),
        ("extra", 1, "extra: unknown key"),
    ],
)
def test_invalid_pipelines_name_the_yaml_path(path: str, value: Any, expected: str) -> None:
    problems = problems_of(with_change(path, value))
    assert any(p.startswith(expected) for p in problems), problems


def test_an_invalid_source_does_not_cascade_into_its_sinks() -> None:
    problems = problems_of(with_change("sources.orders.on_decode_error", "ignore"))
    assert problems == ["sources.orders.on_decode_error: 'ignore' is not one of dlq, fail"]


def test_every_problem_is_reported_at_once() -> None:
    doc = with_change("sinks.orders_mirror.primary_key", "idd")
    doc["sources"]["orders"]["columns"]["x"] = "bignum"
    doc["sinks"]["other"] = {"type": "postgres", "from": "nope", "table": "t"}
    problems = problems_of(doc)
    assert len(problems) >= 3, problems


def test_sink_without_any_key_is_refused() -> None:
    doc = with_change("sources.orders.primary_key", ...)
    doc["sinks"]["orders_mirror"].pop("primary_key")
    assert any("sinks.orders_mirror.primary_key: required" in p for p in problems_of(doc))


def test_two_sinks_on_one_table_are_refused() -> None:
    doc = copy.deepcopy(VALID)
    doc["sinks"]["again"] = dict(doc["sinks"]["orders_mirror"])
    assert any(
        "sinks.again.table: app.orders is already the target of sink 'orders_mirror'" in p for p in problems_of(doc)
    )


def test_not_a_mapping() -> None:
    assert problems_of(["a", "b"])


def test_load_pipeline_reports_yaml_syntax_with_position(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: shop\nsources:\n  orders: [unclosed\n")
    with pytest.raises(ConfigError, match=r"p.yaml: not valid YAML at line \d+, column \d+"):
        load_pipeline(path)


def test_load_pipeline_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such pipeline file"):
        load_pipeline(tmp_path / "missing.yaml")


def test_bundled_example_is_valid() -> None:
    example = Path(__file__).parents[2] / "examples" / "shop.yaml"
    pipeline = load_pipeline(example)
    assert set(pipeline.sinks) == {"orders_mirror", "orders_audit", "revenue"}
    assert yaml.safe_load(example.read_text())["name"] == pipeline.name
    migrations_dir = example.parents[1] / "migrations"
    assert migrations.plan(POSTGRES, pipeline, migrations_dir) == [], (
        "run `cdcsync init examples/shop.yaml` and commit the file"
    )


@pytest.mark.parametrize(
    ("text", "sql", "spark"),
    [
        ("bigint", "bigint", "bigint"),
        ("int8", "bigint", "bigint"),
        ("INT", "integer", "int"),
        ("numeric(12, 2)", "numeric(12,2)", "decimal(12,2)"),
        ("numeric", "numeric", "string"),
        ("numeric(60,2)", "numeric(60,2)", "string"),
        ("double precision", "double precision", "double"),
        ("varchar(40)", "character varying(40)", "string"),
        ("timestamptz", "timestamp with time zone", "timestamp"),
        ("timestamp", "timestamp without time zone", "timestamp_ntz"),
        ("jsonb", "jsonb", "string"),
        ("bytea", "bytea", "binary"),
    ],
)
def test_pg_types_parse_to_canonical_sql_and_spark(text: str, sql: str, spark: str) -> None:
    parsed = parse_pg_type(text)
    assert parsed.sql == sql
    assert parsed.spark_type == spark


@pytest.mark.parametrize("text", ["bignum", "varchar(0)", "integer(4)", "numeric(3,4)", "text; drop table x", ""])
def test_bad_pg_types_are_refused(text: str) -> None:
    with pytest.raises(UnknownTypeError):
        parse_pg_type(text)


def test_bundled_backfill_example_is_valid() -> None:
    example = Path(__file__).parents[2] / "examples" / "backfill.yaml"
    pipeline = load_pipeline(example)
    assert pipeline.bounded["orders"].streams and pipeline.sources["orders"].topic == "shop.public.orders"
    assert set(pipeline.sinks_of("orders")) == {"orders_mirror", "revenue", "orders_lake"}
    assert set(pipeline.delta_sinks()) == {"orders_lake"}  # the backfill and the stream into a lakehouse copy too
    for target in (POSTGRES, DELTA):
        assert migrations.plan(target, pipeline, example.parents[1] / "migrations") == [], (
            "run `cdcsync init examples/backfill.yaml` and commit the files"
        )
