"""Introspection (Connect / Avro schema -> column types), the recorded source schemas in the migrations' state,
and schema-change detection on the decode path.

The field schemas below are what the Debezium Postgres connector 3.5 wrote for a table with one column of each
type (JsonConverter, ``decimal.handling.mode=precise``, ``time.precision.mode=adaptive``); the values are real
payload values of that table. The inverse property: decoding each value with the introspected type gives the
source's value, so the DDL ``init`` renders holds every value the decoder produces.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdcsync import migrations
from cdcsync.config.load import validate_pipeline_dict
from cdcsync.config.pipeline import KafkaSource, SourceSchema
from cdcsync.config.types import parse_pg_type
from cdcsync.core.errors import ConfigError, SchemaChangeError
from cdcsync.core.reports import Kind, Report, ReportedFailure, find_report
from cdcsync.engine.batch import StageTask
from cdcsync.migrations import POSTGRES
from cdcsync.sources import introspect
from cdcsync.sources.debezium.avro_schema import collect_names, connect_schema, envelope_row_fields
from cdcsync.sources.debezium.connect import connect_pg_type
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.kafka import DecodeTask
from tests.unit import test_avro_decode as avro_helpers
from tests.unit.test_debezium_decode import change, decode, kafka_batch, key, only, wrapped

pytestmark = pytest.mark.unit

UTC = timezone.utc


def dbz(kind: str, name: str | None = None, **parameters: str) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": kind, "optional": True}
    if name:
        schema.update(name=name, version=1)
    if parameters:
        schema["parameters"] = parameters
    return schema


DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE = {
    "type": "struct",
    "fields": [{"type": "int32", "optional": False, "field": "scale"}, {"type": "bytes", "field": "value"}],
    "optional": True,
    "name": "io.debezium.data.VariableScaleDecimal",
    "version": 1,
}

# (Connect field schema, introspected type, a payload value, what the decoder makes of it)
CATALOGUE: list[tuple[dict[str, Any], str, Any, Any]] = [
    (dbz("int64"), "bigint", 5, 5),
    (dbz("int16"), "smallint", -7, -7),
    (dbz("int32"), "integer", 2**31 - 1, 2**31 - 1),
    (dbz("float"), "real", 1.5, 1.5),
    (dbz("double"), "double precision", 2.25, 2.25),
    (dbz("boolean"), "boolean", True, True),
    (dbz("string"), "text", "zoë", "zoë"),
    (dbz("bytes"), "bytea", "AQI=", b"\x01\x02"),
    (dbz("bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "12"}), "numeric(12,2)", "AJY=", Decimal("1.50")),
    (dbz("bytes", DECIMAL, scale="0", **{"connect.decimal.precision": "5"}), "numeric(5,0)", "MDk=", Decimal(12345)),
    (VARIABLE, "numeric", {"scale": 2, "value": "AOE="}, "2.25"),
    (dbz("int32", "io.debezium.time.Date"), "date", 18262, date(2020, 1, 1)),
    (dbz("int32", "io.debezium.time.Time"), "time(3) without time zone", 3723000, "01:02:03"),
    (dbz("int64", "io.debezium.time.MicroTime"), "time without time zone", 3723000001, "01:02:03.000001"),
    (
        dbz("int64", "io.debezium.time.Timestamp"),
        "timestamp(3) without time zone",
        1795660020373,
        datetime(2026, 11, 26, 2, 27, 0, 373000),
    ),
    (
        dbz("int64", "io.debezium.time.MicroTimestamp"),
        "timestamp without time zone",
        1795660020372504,
        datetime(2026, 11, 26, 2, 27, 0, 372504),
    ),
    (
        dbz("int64", "io.debezium.time.NanoTimestamp"),
        "timestamp without time zone",
        1795660020372504999,
        datetime(2026, 11, 26, 2, 27, 0, 372504),
    ),
    (
        dbz("string", "io.debezium.time.ZonedTimestamp"),
        "timestamp with time zone",
        "2026-11-26T02:27:00.372504Z",
        datetime(2026, 11, 26, 2, 27, 0, 372504, tzinfo=UTC),
    ),
    (dbz("string", "io.debezium.time.ZonedTime"), "time with time zone", "02:27:00.372504Z", "02:27:00.372504+00"),
    (dbz("int64", "io.debezium.time.MicroDuration"), "interval", 86400000000, "86400000000 microseconds"),
    (dbz("string", "io.debezium.data.Json"), "json", '{"a": 1}', '{"a": 1}'),
    (
        dbz("string", "io.debezium.data.Uuid"),
        "uuid",
        "EA792404-cd75-4873-b011-3479717475f9",
        "ea792404-cd75-4873-b011-3479717475f9",
    ),
    (dbz("string", "io.debezium.data.Enum", allowed="sad,ok"), "text", "ok", "ok"),
    (dbz("string", "io.debezium.data.Xml"), "text", "<a/>", "<a/>"),
    (dbz("bytes", "io.debezium.data.Bits", length="12"), "bit(12)", "BQ==", "000000000101"),
    (dbz("bytes", "io.debezium.data.Bits", length="2147483647"), "bit varying", "Aw==", "11"),
    ({"type": "array", "items": dbz("int32"), "optional": True}, "integer[]", [1, None, 2], [1, None, 2]),
    ({"type": "array", "items": dbz("string"), "optional": True}, "text[]", ["a", "b"], ["a", "b"]),
    (
        {"type": "array", "items": dbz("bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "10"})},
        "numeric(10,2)[]",
        ["AJY="],
        [Decimal("1.50")],
    ),
    ({"type": "array", "items": dbz("int32", "io.debezium.time.Date")}, "date[]", [18262], [date(2020, 1, 1)]),
]


@pytest.mark.parametrize(("schema", "expected", "value", "decoded"), CATALOGUE, ids=[c[1] for c in CATALOGUE])
def test_connect_types_map_to_the_column_type_that_reads_them_exactly(
    schema: dict[str, Any], expected: str, value: Any, decoded: Any
) -> None:
    pg = connect_pg_type(schema)
    assert not isinstance(pg, str), pg
    assert pg.sql == expected
    assert parse_pg_type(pg.sql) == pg  # what the migrations record parses back to the same type
    column = dict(schema, field="c")
    spec = DecodeSpec("things", (("id", parse_pg_type("bigint")), ("c", pg)), ("id",))
    message = wrapped(change("c", after={"id": 1, "c": value}), [dict(dbz("int64"), field="id"), column])
    row = only(decode(spec, [(key(1), message)]))
    assert row["_dlq_reason"] is None, row["_dlq_reason"]
    assert row["c"] == decoded


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ({"type": "struct", "fields": [], "name": "io.debezium.data.geometry.Point"}, "struct named"),
        (dbz("int32", "io.debezium.time.Year"), "int32 named 'io.debezium.time.Year'"),
        ({"type": "array", "items": {"type": "array", "items": dbz("int32")}}, "arrays of arrays"),
        (dbz("bytes", DECIMAL), "Decimal parameters"),
    ],
)
def test_schemas_without_a_faithful_type_say_why(schema: dict[str, Any], fragment: str) -> None:
    reason = connect_pg_type(schema)
    assert isinstance(reason, str) and fragment in reason


def test_unknown_string_logical_types_are_text() -> None:
    pg = connect_pg_type(dbz("string", "io.debezium.data.Ltree"))
    assert not isinstance(pg, str) and pg.sql == "text"


# ---- Avro (AvroConverter annotations, and Avro's own logical types) ----------------------------------------------


@pytest.mark.parametrize(
    ("avro_type", "expected"),
    [
        ({"type": "int", "connect.type": "int16"}, "smallint"),
        ("int", "integer"),
        ("long", "bigint"),
        ("float", "real"),
        ("double", "double precision"),
        ("bytes", "bytea"),
        (avro_helpers.opt("string"), "text"),
        (avro_helpers.connect_decimal(2), "numeric(12,2)"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3}, "numeric(10,3)"),
        (avro_helpers.connect("long", "io.debezium.time.MicroTimestamp"), "timestamp without time zone"),
        (avro_helpers.connect("int", "io.debezium.time.Time"), "time(3) without time zone"),
        ({"type": "long", "logicalType": "timestamp-millis"}, "timestamp(3) without time zone"),
        ({"type": "int", "logicalType": "date"}, "date"),
        ({"type": "string", "logicalType": "uuid"}, "uuid"),
        (avro_helpers.connect("string", "io.debezium.data.Json"), "json"),
        (avro_helpers.connect("string", "io.debezium.time.ZonedTimestamp"), "timestamp with time zone"),
        (
            avro_helpers.connect("bytes", "io.debezium.data.Bits", **{"connect.parameters": {"length": "7"}}),
            "bit(7)",
        ),
        ({"type": "array", "items": avro_helpers.opt(avro_helpers.connect_decimal(2))}, "numeric(12,2)[]"),
        (
            {
                "type": "record",
                "name": "VariableScaleDecimal",
                "namespace": "io.debezium.data",
                "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                "connect.name": "io.debezium.data.VariableScaleDecimal",
            },
            "numeric",
        ),
    ],
)
def test_avro_field_schemas_map_like_their_connect_schemas(avro_type: Any, expected: str) -> None:
    pg = connect_pg_type(connect_schema(avro_type, {}))
    assert not isinstance(pg, str), pg
    assert pg.sql == expected


def test_a_union_of_several_types_has_no_mapping() -> None:
    assert isinstance(connect_pg_type(connect_schema(["null", "int", "string"], {})), str)


def test_avro_envelope_rows_resolve_named_references() -> None:
    """Debezium's ``after`` names the record ``before`` defines."""
    envelope = avro_helpers.envelope([("id", "long"), ("qty", avro_helpers.opt("int"))])
    names: dict[str, Any] = {}
    collect_names(envelope, "", names)
    fields = envelope_row_fields(envelope, names)
    assert fields is not None
    assert [(f["field"], connect_pg_type(f).sql) for f in fields] == [("id", "bigint"), ("qty", "integer")]  # type: ignore[union-attr]


# ---- the newest JSON messages of a topic -------------------------------------------------------------------------


class FakeMessage:
    def __init__(self, value: bytes | None, key: bytes | None, timestamp: int, offset: int) -> None:
        self._value, self._key, self._ts, self._offset = value, key, timestamp, offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def offset(self) -> int:
        return self._offset


ID, NAME = dict(dbz("int64"), field="id"), dict(dbz("string"), field="name")
NOTE = dict(dbz("string", "io.debezium.data.Json"), field="note")
WRAPPED_KEY = json.dumps({"schema": {"type": "struct", "fields": [ID]}, "payload": {"id": 1}}).encode()


def test_the_union_of_the_newest_schemas_in_time_order() -> None:
    old = wrapped(change("c", after={"id": 1, "name": "a"}), [ID, NAME])
    new = wrapped(change("c", after={"id": 2, "name": "b", "note": "{}"}), [ID, NAME, NOTE])
    messages = [
        FakeMessage(new, WRAPPED_KEY, 20, 5),
        FakeMessage(None, WRAPPED_KEY, 30, 6),
        FakeMessage(old, None, 10, 9),
    ]
    schema = introspect._schema_of_messages("t", messages)
    assert isinstance(schema, SourceSchema)
    assert schema.columns == (("id", "bigint"), ("name", "text"), ("note", "json"))
    assert schema.primary_key == ("id",)


def test_bare_json_messages_say_to_declare_columns() -> None:
    bare = json.dumps(change("c", after={"id": 1})).encode()
    reason = introspect._schema_of_messages("shop.public.t", [FakeMessage(bare, None, 1, 1)])
    assert isinstance(reason, str) and "no schema wrapper" in reason and "shop.public.t" in reason


def test_merge_keeps_recorded_columns_and_appends_new_ones() -> None:
    recorded = SourceSchema((("id", "bigint"), ("gone", "text"), ("qty", "integer")), ("id",))
    fresh = SourceSchema((("qty", "bigint"), ("id", "bigint"), ("note", "json")), None, (("geo", "no type"),))
    merged = introspect.merge(recorded, fresh)
    assert merged.columns == (("id", "bigint"), ("gone", "text"), ("qty", "bigint"), ("note", "json"))
    assert merged.primary_key == ("id",) and merged.unmapped == (("geo", "no type"),)


# ---- sources completed from a schema -----------------------------------------------------------------------------


def raw_pipeline(**source: Any) -> dict[str, Any]:
    return {
        "name": "shop",
        "sources": {"orders": {"type": "kafka", "topic": "shop.public.orders", **source}},
        "sinks": {"mirror": {"type": "postgres", "from": "orders", "schema": "app", "table": "orders"}},
    }


SCHEMA = SourceSchema((("id", "bigint"), ("amount", "numeric(12,2)"), ("mood", "text")), ("id",), origin="test")


def test_declared_columns_override_the_schema_and_add_to_it() -> None:
    source = KafkaSource.model_validate({"type": "kafka", "topic": "t", "columns": {"mood": "varchar(5)", "x": "int"}})
    merged = source.with_schema(SCHEMA)
    assert merged.columns == {"id": "bigint", "amount": "numeric(12,2)", "mood": "varchar(5)", "x": "int"}
    assert merged.primary_key == ["id"]


def test_a_source_without_columns_takes_them_and_its_key_from_the_schema() -> None:
    pipeline = validate_pipeline_dict(raw_pipeline(), schema_for=lambda *_: SCHEMA)
    assert pipeline.sources["orders"].columns == dict(SCHEMA.columns)
    assert pipeline.sink_primary_key(pipeline.sinks["mirror"]) == ["id"]
    assert pipeline.source_schemas == {"orders": SCHEMA}


def test_no_columns_anywhere_says_run_init() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_dict(raw_pipeline())
    assert "sources.orders.columns: not declared, and no migration records them: run `cdcsync init`" in str(
        caught.value
    )


def test_a_column_without_a_type_must_be_declared() -> None:
    schema = SourceSchema((("id", "bigint"),), ("id",), (("geom", "the schema types it as a struct"),))
    with pytest.raises(ConfigError, match=r"sources\.orders\.columns\.geom: the schema types it as a struct; declare"):
        validate_pipeline_dict(raw_pipeline(), schema_for=lambda *_: schema)
    pipeline = validate_pipeline_dict(raw_pipeline(columns={"geom": "text"}), schema_for=lambda *_: schema)
    assert pipeline.sources["orders"].columns == {"id": "bigint", "geom": "text"}


# ---- recorded in the migrations' state ---------------------------------------------------------------------------


def test_init_records_the_schema_and_validate_reads_it_back(tmp_path: Path) -> None:
    pipeline = validate_pipeline_dict(raw_pipeline(columns={"mood": "varchar(5)"}), schema_for=lambda *_: SCHEMA)
    [first] = migrations.init(POSTGRES, pipeline, tmp_path).written
    assert first.state["sources"] == {
        "orders": {
            "topic": "shop.public.orders",
            "columns": [{"name": n, "type": t} for n, t in SCHEMA.columns],  # types as read, before overrides
            "primary_key": ["id"],
        }
    }
    assert '"mood" character varying(5)' in first.text
    again = validate_pipeline_dict(
        raw_pipeline(columns={"mood": "varchar(5)"}), schema_for=migrations.recorded_lookup(tmp_path)
    )
    assert again.sources == pipeline.sources
    assert migrations.plan(POSTGRES, again, tmp_path) == []
    moved = raw_pipeline()
    moved["sources"]["orders"]["topic"] = "other.topic"
    with pytest.raises(ConfigError, match=r"no migration in .*shop/postgres records them"):
        validate_pipeline_dict(moved, schema_for=migrations.recorded_lookup(tmp_path))


def test_a_new_column_in_the_schema_writes_the_next_migration(tmp_path: Path) -> None:
    migrations.init(POSTGRES, validate_pipeline_dict(raw_pipeline(), schema_for=lambda *_: SCHEMA), tmp_path)
    grown = SourceSchema((*SCHEMA.columns, ("note", "json")), ("id",))
    [second] = migrations.init(
        POSTGRES, validate_pipeline_dict(raw_pipeline(), schema_for=lambda *_: grown), tmp_path
    ).written
    assert second.filename == "0002_add_columns_mirror.sql"
    assert 'ADD COLUMN IF NOT EXISTS "note" json' in second.text
    assert second.state["sources"]["orders"]["columns"][-1] == {"name": "note", "type": "json"}
    reloaded = validate_pipeline_dict(raw_pipeline(), schema_for=migrations.recorded_lookup(tmp_path))
    assert list(reloaded.sources["orders"].columns) == ["id", "amount", "mood", "note"]


def test_a_schema_change_without_a_postgres_table_is_still_recorded(tmp_path: Path) -> None:
    raw = raw_pipeline()
    raw["sinks"] = {"ch": {"type": "clickhouse", "from": "orders", "table": "orders"}}
    migrations.init(POSTGRES, validate_pipeline_dict(raw, schema_for=lambda *_: SCHEMA), tmp_path)
    grown = SourceSchema((*SCHEMA.columns, ("note", "json")), ("id",))
    [second] = migrations.init(POSTGRES, validate_pipeline_dict(raw, schema_for=lambda *_: grown), tmp_path).written
    assert second.filename == "0002_record_source_schemas.sql"
    assert migrations.parse_migration(second.text).body.strip().startswith("-- nothing to change in Postgres")


def test_a_schema_that_adds_nothing_to_the_declaration_is_not_recorded(tmp_path: Path) -> None:
    declared = {"id": "bigint", "amount": "numeric(14,2)", "mood": "text"}
    raw = raw_pipeline(columns=declared, primary_key="id")
    [first] = migrations.init(POSTGRES, validate_pipeline_dict(raw, schema_for=lambda *_: SCHEMA), tmp_path).written
    assert "sources" not in first.state
    assert [c["type"] for c in first.state["sinks"]["mirror"]["columns"]] == ["bigint", "numeric(14,2)", "text"]
    grown = SourceSchema((*SCHEMA.columns, ("note", "json")), ("id",))
    [second] = migrations.init(POSTGRES, validate_pipeline_dict(raw, schema_for=lambda *_: grown), tmp_path).written
    assert second.state["sources"]["orders"]["columns"][-1] == {"name": "note", "type": "json"}


def test_declared_only_sources_keep_the_state_they_always_had(tmp_path: Path) -> None:
    [first] = migrations.init(
        POSTGRES, validate_pipeline_dict(raw_pipeline(columns={"id": "bigint"}, primary_key="id")), tmp_path
    ).written
    assert "sources" not in first.state


# ---- schema changes on the decode path ---------------------------------------------------------------------------


def spec(**extra: Any) -> DecodeSpec:
    columns = (("id", parse_pg_type("bigint")), ("name", parse_pg_type("text")))
    return DecodeSpec("orders", columns, ("id",), detect_schema_changes=True, **extra)


def test_a_new_field_is_a_schema_change_not_a_dead_letter() -> None:
    rows = decode(
        spec(),
        [
            (key(1), wrapped(change("c", after={"id": 1, "name": "a"}), [ID, NAME])),
            (key(2), wrapped(change("c", after={"id": 2, "name": "b", "note": "{}"}), [ID, NAME, NOTE])),
        ],
    )
    assert rows[0]["_dlq_reason"] is None and rows[0]["name"] == "a"
    report = Report.decode(rows[1]["_dlq_report"])
    assert report.kind is Kind.SCHEMA_CHANGE and rows[1]["_dlq_reason"] == report.describe()
    assert report.fields["added"] == ["note"] and ["note", "json", None] in report.fields["fields"]
    assert "new field 'note'" in rows[1]["_dlq_reason"]


def test_a_dropped_field_is_no_change_and_lands_as_null() -> None:
    row = only(decode(spec(), [(key(1), wrapped(change("c", after={"id": 1}), [ID]))]))
    assert row["_dlq_reason"] is None and row["name"] is None


def test_a_recorded_type_that_changed_is_a_schema_change() -> None:
    retyped = dict(dbz("string", "io.debezium.data.Json"), field="name")
    message = wrapped(change("c", after={"id": 1, "name": "{}"}), [ID, retyped])
    row = only(decode(spec(schema_types=(("id", "bigint"), ("name", "text"))), [(key(1), message)]))
    assert Report.decode(row["_dlq_report"]).fields["changed"] == [["name", "text", "json"]]
    # Without a recorded type (a declared column) the declared type decides, as before.
    assert only(decode(spec(), [(key(1), message)]))["_dlq_reason"] is None


def test_detection_is_off_unless_the_spec_asks() -> None:
    message = wrapped(change("c", after={"id": 1, "name": "a", "note": "{}"}), [ID, NAME, NOTE])
    plain = DecodeSpec("orders", spec().columns, ("id",))
    assert only(decode(plain, [(key(1), message)]))["_dlq_reason"] is None


def test_the_task_stops_the_batch_with_the_message_and_the_columns() -> None:
    messages = [
        (key(1), wrapped(change("c", after={"id": 1, "name": "a"}), [ID, NAME])),
        (key(2), wrapped(change("c", after={"id": 2, "name": "b", "note": "{}"}), [ID, NAME, NOTE])),
    ]
    task = DecodeTask(spec=spec(), dead_letters=None)
    with pytest.raises(ReportedFailure) as caught:
        list(task(iter([kafka_batch(messages, partition=2, first_offset=40)])))
    assert find_report(str(caught.value)) == caught.value.report  # what the driver reads from Spark's text
    error = caught.value.report.error("staging batch 1", "shop.yaml")
    assert isinstance(error, SchemaChangeError) and error.user_error and error.additive
    assert (error.source_id, error.partition, error.offset, error.added) == ("orders", 2, 41, ["note"])
    assert 'new column(s) "note" json' in str(error) and "partition 2, offset 41" in str(error)
    assert "cdcsync init shop.yaml" in (error.hint or "") and "cdcsync migrate shop.yaml" in (error.hint or "")
    # The single pass reports it as data, not as a failed Spark task.
    stage = StageTask(decode=task, writers=())
    [counts] = list(stage(iter([kafka_batch(messages)])))
    assert Report.decode(counts.column("report")[0].as_py()).kind is Kind.SCHEMA_CHANGE


def test_a_column_without_a_type_cannot_evolve_by_itself() -> None:
    geometry = {"type": "struct", "fields": [], "name": "io.debezium.data.geometry.Point", "field": "where"}
    task = DecodeTask(spec=spec(), dead_letters=None)
    with pytest.raises(ReportedFailure) as caught:
        list(task(iter([kafka_batch([(key(1), wrapped(change("c", after={"id": 1}), [ID, NAME, geometry]))])])))
    error = caught.value.report.error()
    assert isinstance(error, SchemaChangeError)
    assert not error.additive and error.unmapped == ["where"]
    assert "declare the type of 'where' under sources.orders.columns" in (error.hint or "")


def test_avro_writer_schemas_with_a_new_field_are_a_schema_change(registry: Any) -> None:
    fake, access = registry
    v1 = avro_helpers.envelope([("id", "long"), ("name", avro_helpers.opt("string"))])
    v2 = avro_helpers.envelope(
        [
            ("id", "long"),
            ("name", avro_helpers.opt("string")),
            ("qty", avro_helpers.opt({"type": "int", "connect.type": "int16"})),
        ]
    )
    id1, id2 = fake.add(v1), fake.add(v2)
    avro_spec = DecodeSpec(
        "orders", spec().columns, ("id",), format="avro", schema_registry=access, detect_schema_changes=True
    )
    rows = avro_helpers.decode(
        avro_spec,
        [
            (None, avro_helpers.encode(id1, v1, avro_helpers.change("c", after={"id": 1, "name": "a"}))),
            (None, avro_helpers.encode(id2, v2, avro_helpers.change("c", after={"id": 2, "name": "b", "qty": 3}))),
        ],
    )
    assert rows[0]["_dlq_reason"] is None
    detail = Report.decode(rows[1]["_dlq_report"]).fields
    assert detail["added"] == ["qty"] and ["qty", "smallint", None] in detail["fields"]


registry = avro_helpers.registry
