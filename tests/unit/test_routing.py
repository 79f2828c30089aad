"""Issue 3, Deliver 6: a ``topic_pattern`` source and the sinks that route each of its tables to a table of its own.

Pure logic: template naming, validation (with the tables a migration state would record), the desired state
migrations render from, and the executor task that splits a batch by topic.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdcsync import migrations
from cdcsync.config import routing
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import KafkaSource, RoutedPostgresSink, SourceSchema
from cdcsync.core.errors import ConfigError, MigrationError, NewTopicError, exit_code_for
from cdcsync.core.reports import Kind, Report, ReportedFailure, broker_unavailable
from cdcsync.engine.batch import RoutedStageTask, raise_reported
from cdcsync.migrations import CLICKHOUSE, POSTGRES
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.kafka import DecodeTask, TopicDecoders, spark_kafka_options
from tests.unit.test_debezium_decode import change, dumps, kafka_batch

pytestmark = pytest.mark.unit

PATTERN: dict[str, Any] = {
    "name": "shop",
    "sources": {"cdc": {"type": "kafka", "topic_pattern": r"shop\.public\..*"}},
    "sinks": {"mirror": {"type": "postgres", "from": "cdc", "schema": "app", "table": "{schema}_{table}"}},
}
ORDERS = SourceSchema((("id", "bigint"), ("amount", "numeric(10,2)")), ("id",))
LINES = SourceSchema((("order_id", "bigint"), ("line", "integer"), ("sku", "text")), ("order_id", "line"))


def tables(**by_topic: SourceSchema | str) -> Any:
    """A ``schema_for`` that knows ``by_topic`` (``shop.public.<name>``) for every pattern source."""
    known = {f"shop.public.{name}": schema for name, schema in by_topic.items()}
    return lambda _pipeline, _source_id, source: known if source.topic_pattern else None


def problems_of(doc: dict[str, Any], schema_for: Any = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(doc, schema_for=schema_for or tables(orders=ORDERS))
    assert exit_code_for(caught.value) == 2
    return caught.value.problems


def changed(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(PATTERN)
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return doc


# ---- template naming -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "topic", "expected"),
    [
        ("{schema}_{table}", "shop.public.orders", "public_orders"),
        ("{table}", "shop.sales.order_lines", "order_lines"),
        ("${topic}", "shop.public.orders", "shop_public_orders"),  # the JDBC sink's spelling, dots to '_'
        ("mirror_${ table }", "a.b.c.d", "mirror_d"),
        ("Orders {table}", "x.y.Mixed Case", "Orders Mixed Case"),
    ],
)
def test_templates_render_the_names_of_debezium_topics(template: str, topic: str, expected: str) -> None:
    assert routing.render_name(template, topic) == expected


def test_a_topic_not_named_prefix_schema_table_has_only_topic() -> None:
    assert routing.render_name("t_{topic}", "orders") == "t_orders"
    with pytest.raises(ValueError, match=r"topic orders is not named <prefix>\.<schema>\.<table>, so it has no"):
        routing.render_name("{table}", "orders")


def test_unknown_placeholders_are_named() -> None:
    with pytest.raises(ValueError, match=r"unknown placeholder '\{tabel\}'; known: \{schema\}, \{table\}, \{topic\}"):
        routing.placeholders("{tabel}")


def test_patterns_match_whole_topic_names() -> None:
    assert routing.matches(r"shop\.public\..*", "shop.public.orders")
    assert not routing.matches(r"shop\.public", "shop.public.orders")  # Java's matches(), not find()
    assert routing.check_pattern("(") is not None and routing.check_pattern("a|b") is None


# ---- validation ----------------------------------------------------------------------------------------------


def test_each_known_topic_is_a_table_with_its_own_columns_key_and_sink() -> None:
    pipeline = validate_pipeline_dict(PATTERN, schema_for=tables(orders=ORDERS, lines=LINES))
    assert pipeline.routes == {
        "cdc": {"shop.public.lines": "cdc[shop.public.lines]", "shop.public.orders": "cdc[shop.public.orders]"}
    }
    assert list(pipeline.streams()) == ["cdc"]  # one query reads every table
    assert set(pipeline.sinks_of("cdc")) == {"mirror[shop.public.lines]", "mirror[shop.public.orders]"}
    lines = pipeline.sinks["mirror[shop.public.lines]"]
    assert isinstance(lines, RoutedPostgresSink) and (lines.schema_, lines.table) == ("app", "public_lines")
    assert pipeline.sink_primary_key(lines) == ["order_id", "line"]
    assert list(pipeline.columns_of(lines.from_)) == ["order_id", "line", "sku"]
    assert pipeline.sink_primary_key(pipeline.sinks["mirror[shop.public.orders]"]) == ["id"]
    assert list(pipeline.routed_sinks) == ["mirror"]


def test_clickhouse_sinks_route_too() -> None:
    from cdcsync.config.pipeline import RoutedClickHouseSink

    doc = changed("sinks.mirror", {"type": "clickhouse", "from": "cdc", "database": "{schema}", "table": "{table}"})
    pipeline = validate_pipeline_dict(doc, schema_for=tables(orders=ORDERS, lines=LINES))
    lines = pipeline.sinks["mirror[shop.public.lines]"]
    assert isinstance(lines, RoutedClickHouseSink) and (lines.database, lines.table) == ("public", "lines")
    state = CLICKHOUSE.desired_state(pipeline)["sinks"]
    assert state["mirror[shop.public.lines]"]["primary_key"] == ["order_id", "line"]
    assert [c["name"] for c in state["mirror[shop.public.orders]"]["columns"]] == ["id", "amount"]


def test_desired_state_has_a_table_per_topic_with_bounded_internal_names() -> None:
    doc = changed("sinks.mirror.table", "{table}")
    doc["name"] = "p" * 40
    pipeline = validate_pipeline_dict(doc, schema_for=tables(orders=ORDERS, lines=LINES))
    state = POSTGRES.desired_state(pipeline)
    lines = state["sinks"]["mirror[shop.public.lines]"]
    assert (lines["table"], lines["primary_key"]) == ("lines", ["order_id", "line"])
    assert all(len(name.encode()) <= 63 for name in (lines["stage_table"], lines["tombstone_table"]))
    assert lines["stage_table"] != state["sinks"]["mirror[shop.public.orders]"]["stage_table"]
    assert state["sources"]["cdc[shop.public.orders]"]["topic"] == "shop.public.orders"


def test_recorded_tables_are_what_validate_and_run_see(tmp_path: Path) -> None:
    written = migrations.init(POSTGRES, validate_pipeline_dict(PATTERN, schema_for=tables(orders=ORDERS)), tmp_path)
    assert [path.name for path in written] == ["0001_init.sql"]
    text = next(iter(written)).read_text()
    assert 'CREATE TABLE IF NOT EXISTS "app"."public_orders"' in text
    offline = validate_pipeline_dict(PATTERN, schema_for=migrations.recorded_lookup(tmp_path))
    assert list(offline.routes["cdc"]) == ["shop.public.orders"]
    assert offline.sink_primary_key(offline.sinks["mirror[shop.public.orders]"]) == ["id"]
    # A narrower pattern drops the recorded tables it no longer matches.
    narrower = changed("sources.cdc.topic_pattern", r"shop\.public\.lines")
    narrowed = validate_pipeline_dict(narrower, schema_for=migrations.recorded_lookup(tmp_path))
    assert narrowed.routes == {"cdc": {}}
    with pytest.raises(MigrationError, match=r"sink 'mirror\[shop\.public\.orders\]' was removed or renamed"):
        migrations.init(POSTGRES, narrowed, tmp_path)  # dropping its table is a DBA's decision


def test_a_new_topic_adds_only_its_table_in_the_next_migration(tmp_path: Path) -> None:
    migrations.init(POSTGRES, validate_pipeline_dict(PATTERN, schema_for=tables(orders=ORDERS)), tmp_path)
    grown = validate_pipeline_dict(PATTERN, schema_for=tables(orders=ORDERS, lines=LINES))
    [added] = list(migrations.init(POSTGRES, grown, tmp_path))
    text = added.read_text()
    assert added.name.startswith("0002_add_sink_mirror")
    assert '"app"."public_lines"' in text and 'PRIMARY KEY ("order_id", "line")' in text
    assert '"public_orders"' not in migrations.parse_migration(text).body


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("sources.cdc.topic", "shop.public.orders", "sources.cdc.topic_pattern: give either topic"),
        ("sources.cdc.topic_pattern", ..., "sources.cdc.topic: required key is missing (or topic_pattern"),
        ("sources.cdc.topic_pattern", "(", "sources.cdc.topic_pattern: not a valid regular expression"),
        ("sources.cdc.primary_key", "id", "sources.cdc.primary_key: not supported with topic_pattern"),
        ("sources.cdc.columns", {"id": "bigint"}, "sources.cdc.columns: not supported with topic_pattern"),
        ("sinks.mirror.primary_key", "id", "sinks.mirror.primary_key: not allowed on a sink fed by a topic_pattern"),
        ("sinks.mirror.table", "orders", "sinks.mirror.table: 'orders' names one table for every topic"),
        ("sinks.mirror.table", "{tabel}", "sinks.mirror.table: unknown placeholder '{tabel}'"),
        ("sinks.mirror.table", "x" * 60 + "_{table}", "sinks.mirror[shop.public.orders].table: 'xxxx"),
        (
            "sinks.mirror",
            {
                "type": "postgres_aggregate",
                "from": "cdc",
                "landing_table": "{table}",
                "agg_table": "a",
                "aggregate": {"n": {"fn": "count"}},
            },
            "sinks.mirror.type: 'postgres_aggregate' cannot read source 'cdc', which reads a topic_pattern",
        ),
        (
            "sinks.mirror",
            {"type": "clickhouse", "from": "cdc", "table": "{table}", "low_cardinality": ["amount"]},
            "sinks.mirror.low_cardinality: not allowed on a sink fed by a topic_pattern",
        ),
        (
            "transforms",
            {"big": {"type": "sql", "from": "cdc", "sql": "SELECT * FROM cdc", "primary_key": "id"}},
            "transforms.big.from: 'cdc' reads a topic_pattern",
        ),
        (
            "sinks.one",
            {"type": "postgres", "from": "cdc[shop.public.orders]", "table": "orders"},
            "sinks.one.from: 'cdc[shop.public.orders]' is a table of topic_pattern source 'cdc'",
        ),
    ],
)
def test_invalid_routing_names_the_yaml_path(path: str, value: Any, expected: str) -> None:
    problems = problems_of(changed(path, value))
    assert any(problem.startswith(expected) for problem in problems), problems


def test_a_long_routed_table_name_is_refused_with_the_table_named() -> None:
    [problem] = problems_of(changed("sinks.mirror.table", "x" * 60 + "_{table}"))
    assert "'" + "x" * 60 + "_orders' is longer than Postgres' 63-byte identifier limit" in problem


def test_two_topics_routed_to_one_table_are_refused() -> None:
    doc = changed("sinks.mirror.table", "{table}")
    doc["sources"]["cdc"]["topic_pattern"] = r".*\.orders"
    both = {"a.public.orders": ORDERS, "b.public.orders": ORDERS}
    problems = problems_of(doc, lambda *_: both)
    assert any("app.orders is already the target of sink 'mirror[a.public.orders]'" in p for p in problems), problems


def test_topics_init_could_not_read_are_named() -> None:
    problems = problems_of(PATTERN, tables(orders="topic shop.public.orders has no messages yet"))
    assert problems == [
        "sources.cdc.topic_pattern: topic shop.public.orders: topic shop.public.orders has no messages yet"
    ]


def test_the_stream_subscribes_to_the_pattern() -> None:
    from cdcsync.config.settings import load_settings

    source = KafkaSource.model_validate(PATTERN["sources"]["cdc"])
    options = spark_kafka_options("shop", source, load_settings())
    assert options["subscribePattern"] == r"shop\.public\..*" and "subscribe" not in options


# ---- the executor task ---------------------------------------------------------------------------------------


class Recorder:
    """An executor writer that keeps what it was given."""

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []

    def stage(self, table: pa.Table) -> int:
        self.tables.append(table)
        return table.num_rows


def topic_batch(topic: str, messages: list[tuple[bytes, bytes]], first_offset: int) -> pa.RecordBatch:
    batch = kafka_batch(messages, first_offset=first_offset)
    return batch.set_column(batch.schema.get_field_index("topic"), "topic", pa.array([topic] * len(messages)))


def decoder(source_id: str, columns: dict[str, str], key: tuple[str, ...]) -> DecodeTask:
    source = KafkaSource.model_validate(
        {"type": "kafka", "topic": "t", "columns": columns, "primary_key": list(key), "on_decode_error": "fail"}
    )
    return DecodeTask(spec=DecodeSpec.from_source(source_id, source), dead_letters=None)


def test_one_pass_decodes_each_topic_with_its_table_and_stages_it_into_its_sinks() -> None:
    orders = [(dumps({"id": i}), dumps(change("c", after={"id": i, "amount": f"{i}.50"}))) for i in (1, 2)]
    lines = [
        (dumps({"order_id": 1, "line": n}), dumps(change("c", after={"order_id": 1, "line": n, "sku": f"s{n}"})))
        for n in (1, 2, 3)
    ]
    decoders = TopicDecoders(
        "cdc",
        {
            "shop.public.orders": decoder("cdc[o]", {"id": "bigint", "amount": "text"}, ("id",)),
            "shop.public.lines": decoder("cdc[l]", {"order_id": "bigint", "line": "integer", "sku": "text"}, ()),
        },
    )
    to_orders, to_lines = Recorder(), Recorder()
    task = RoutedStageTask(decoders, (to_orders, to_lines), ("shop.public.orders", "shop.public.lines"))
    [counts] = list(
        task(iter([topic_batch("shop.public.orders", orders, 10), topic_batch("shop.public.lines", lines, 0)]))
    )
    assert counts.column("rows").to_pylist() == [2, 3] and counts.column("report").null_count == 2
    [staged_lines] = to_lines.tables
    assert staged_lines.column("sku").to_pylist() == ["s1", "s2", "s3"] and "amount" not in staged_lines.column_names
    assert to_orders.tables[0].column("id").to_pylist() == [1, 2]


def test_a_topic_init_did_not_know_stops_the_batch_naming_it() -> None:
    decoders = TopicDecoders("cdc", {"shop.public.orders": decoder("cdc[o]", {"id": "bigint"}, ("id",))})
    known = Recorder()
    task = RoutedStageTask(decoders, (known,), ("shop.public.orders",))
    message = [(dumps({"id": 1}), dumps(change("c", after={"id": 1})))]
    batches = [topic_batch("shop.public.orders", message, 5), topic_batch("shop.public.refunds", message, 7)]
    [report] = list(task(iter(batches)))
    failure = report.column("report")[0].as_py()
    assert Report.decode(failure) == Report(
        Kind.NEW_TOPIC, {"source": "cdc", "topic": "shop.public.refunds", "partition": 3, "offset": 7}
    )
    assert not known.tables  # nothing staged
    with pytest.raises(NewTopicError) as caught:
        raise_reported([failure], "staging batch 4", "shop.yaml")
    error = caught.value
    assert exit_code_for(error) == 2 and "read topic shop.public.refunds (partition 3, offset 7)" in str(error)
    assert "cdcsync init shop.yaml" in (error.hint or "") and "cdcsync migrate shop.yaml" in (error.hint or "")


def test_a_partition_without_messages_stages_nothing_and_a_failed_read_stops_the_batch() -> None:
    decoders = TopicDecoders("cdc", {"shop.public.orders": decoder("cdc[o]", {"id": "bigint"}, ("id",))})
    known = Recorder()
    task = RoutedStageTask(decoders, (known,), ("shop.public.orders",))
    [empty] = list(task(iter([])))  # a range of commit markers alone: the tasks' own read yields no batch
    assert empty.column("rows").to_pylist() == [0] and not known.tables

    def broker_away() -> Iterator[pa.RecordBatch]:
        yield topic_batch("shop.public.orders", [(dumps({"id": 1}), dumps(change("c", after={"id": 1})))], 0)
        raise ReportedFailure(broker_unavailable("no message of topic t partition 0 arrived within 1s"))

    [report] = list(task(broker_away()))
    assert Report.decode(report.column("report")[0].as_py()).kind is Kind.BROKER_UNAVAILABLE
    assert not known.tables  # nothing staged: the batch is retried as the broker's outage


def test_schema_evolution_auto_adds_a_new_table_to_the_recorded_ones(tmp_path: Path) -> None:
    from cdcsync.config.routing import evolved_lookup

    migrations.init(POSTGRES, validate_pipeline_dict(PATTERN, schema_for=tables(orders=ORDERS)), tmp_path)
    recorded = migrations.recorded_lookup(tmp_path)
    lookup = evolved_lookup(recorded, "cdc[shop.public.lines]", "shop.public.lines", LINES)
    grown = validate_pipeline_dict(PATTERN, schema_for=lookup)
    assert list(grown.routes["cdc"]) == ["shop.public.lines", "shop.public.orders"]
    [added] = list(migrations.init(POSTGRES, grown, tmp_path))  # exactly what init would write for the new table
    assert added.name == "0002_add_sink_mirror_shop_public_lines.sql"
    # A new column of a known table replaces that table's schema only.
    wider = SourceSchema((*ORDERS.columns, ("note", "text")), ("id",))
    lookup = evolved_lookup(recorded, "cdc[shop.public.orders]", "shop.public.orders", wider)
    evolved = validate_pipeline_dict(PATTERN, schema_for=lookup)
    assert list(evolved.columns_of("cdc[shop.public.orders]")) == ["id", "amount", "note"]
