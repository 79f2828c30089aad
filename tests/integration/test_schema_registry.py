"""The schema registry over HTTP: confluent-kafka's client and serializer against the session's registry (the dev
stack's stand-in, a cp-schema-registry container, or ``CDCSYNC_TEST_SCHEMA_REGISTRY_URL``), and the Avro decoder
fetching writer schemas from it. Restarts and outages use a stand-in of their own on a free port."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import date, datetime, timezone
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdcsync.config.types import parse_pg_type
from cdcsync.core.reports import Kind, ReportedFailure
from cdcsync.devstack import DevStackConfig, schema_registry
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess
from cdcsync.sources.debezium.dispatch import decode_batches
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.kafka import DecodeTask

pytestmark = pytest.mark.integration

UTC = timezone.utc
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


# ---- helpers -----------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def client(url: str) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url})


def avro_schema(name: str, fields: list[dict[str, Any]]) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps({"type": "record", "name": name, "namespace": "cdcsync.test", "fields": fields}), "AVRO")


def http(method: str, url: str, body: Any = None) -> tuple[int, str, Any]:
    """(status, content type, JSON body) of one raw request."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": CONTENT_TYPE})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], json.loads(error.read() or b"null")


def kafka_batch(messages: list[tuple[bytes | None, bytes | None]], topic: str = "shop.public.things") -> pa.RecordBatch:
    n = len(messages)
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array([k for k, _ in messages], pa.binary()),
            "value": pa.array([v for _, v in messages], pa.binary()),
            "topic": pa.array([topic] * n, pa.string()),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
        }
    )


def decode(spec: DecodeSpec, messages: list[tuple[bytes | None, bytes | None]]) -> list[dict[str, Any]]:
    return [row for batch in decode_batches(iter([kafka_batch(messages)]), spec) for row in batch.to_pylist()]


def spec_for(
    url: str, columns: dict[str, str], primary_key: tuple[str, ...] | None = ("id",), **access: Any
) -> DecodeSpec:
    return DecodeSpec(
        "things",
        tuple((name, parse_pg_type(t)) for name, t in columns.items()),
        primary_key,
        format="avro",
        schema_registry=SchemaRegistryAccess(url, **access),
    )


def envelope(row_fields: list[dict[str, Any]], name: str = "things") -> dict[str, Any]:
    """Debezium's Avro envelope as AvroConverter registers it (annotations included)."""
    row = {"type": "record", "name": "Value", "namespace": f"shop.public.{name}", "fields": row_fields}
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": f"shop.public.{name}",
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {
                "name": "source",
                "type": {
                    "type": "record",
                    "name": "Source",
                    "namespace": "io.debezium.connector.postgresql",
                    "fields": [
                        {"name": "ts_ms", "type": "long"},
                        {"name": "lsn", "type": ["null", "long"], "default": None},
                    ],
                },
            },
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
            {"name": "transaction", "type": ["null", "string"], "default": None},
        ],
        "connect.name": f"shop.public.{name}.Envelope",
    }


ROW_FIELDS: list[dict[str, Any]] = [
    {"name": "id", "type": "long"},
    {
        "name": "amount",
        "type": [
            "null",
            {
                "type": "bytes",
                "scale": 2,
                "precision": 12,
                "connect.version": 1,
                "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"},
                "connect.name": "org.apache.kafka.connect.data.Decimal",
                "logicalType": "decimal",
            },
        ],
        "default": None,
    },
    {
        "name": "day",
        "type": [
            "null",
            {
                "type": "int",
                "connect.version": 1,
                "connect.name": "org.apache.kafka.connect.data.Date",
                "logicalType": "date",
            },
        ],
        "default": None,
    },
    {
        "name": "at",
        "type": ["null", {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}],
        "default": None,
    },
    {"name": "status", "type": ["null", "string"], "default": None},
]
COLUMNS = {"id": "bigint", "amount": "numeric(12,2)", "day": "date", "at": "timestamp", "status": "text"}
KEY_SCHEMA = {
    "type": "record",
    "name": "Key",
    "namespace": "shop.public.things",
    "fields": [{"name": "id", "type": "long"}],
}


def serializer(url: str, schema: dict[str, Any]) -> Any:
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(client(url), json.dumps(schema))


def serialize(serialize_with: Any, topic: str, record: dict[str, Any], *, key: bool = False) -> bytes:
    from confluent_kafka.serialization import MessageField, SerializationContext

    field = MessageField.KEY if key else MessageField.VALUE
    data: bytes = serialize_with(record, SerializationContext(topic, field))
    return data


def change(
    op: str, after: dict[str, Any] | None, before: dict[str, Any] | None = None, lsn: int = 77
) -> dict[str, Any]:
    return {
        "before": before,
        "after": after,
        "source": {"ts_ms": 1_704_067_200_000, "lsn": lsn},
        "op": op,
        "ts_ms": 1_704_067_200_500,
        "transaction": None,
    }


@pytest.fixture()
def topic() -> str:
    return f"shop.public.things_{uuid.uuid4().hex[:10]}"


@pytest.fixture()
def standin(tmp_path: Path) -> Iterator[DevStackConfig]:
    """A stand-in registry of this test's own (free port, own state dir), started through the dev-stack code."""
    config = DevStackConfig(state_dir=tmp_path, schema_registry_port=_free_port())
    schema_registry.start(config)
    try:
        schema_registry.wait_ready(config, 30)
        yield config
    finally:
        schema_registry.stop(config)


# ---- the registry API --------------------------------------------------------------------------------------------


def test_register_get_lookup_round_trip_and_global_ids(schema_registry_url: str) -> None:
    registry = client(schema_registry_url)
    subject, other = f"t-{uuid.uuid4().hex[:8]}-value", f"t-{uuid.uuid4().hex[:8]}-value"
    v1 = avro_schema(f"R{uuid.uuid4().hex[:8]}", [{"name": "id", "type": "long"}])
    first = registry.register_schema(subject, v1)
    fetched = registry.get_schema(first)
    assert json.loads(fetched.schema_str) == json.loads(v1.schema_str)
    found = registry.lookup_schema(subject, v1)
    assert (found.schema_id, found.version, found.subject) == (first, 1, subject)

    # the same schema under another subject, and the same schema reformatted: the same id, no new version
    assert client(schema_registry_url).register_schema(other, v1) == first
    from confluent_kafka.schema_registry import Schema

    spaced = Schema(json.dumps(json.loads(v1.schema_str), indent=4), "AVRO")
    assert client(schema_registry_url).register_schema(subject, spaced) == first
    assert registry.get_versions(subject) == [1]

    fields = [{"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": None}]
    v2 = Schema(json.dumps({**json.loads(v1.schema_str), "fields": fields}), "AVRO")
    second = registry.register_schema(subject, v2)
    assert second != first
    assert registry.get_versions(subject) == [1, 2]
    assert registry.get_latest_version(subject).schema_id == second
    assert registry.get_version(subject, 1).schema_id == first
    assert {subject, other} <= set(registry.get_subjects())


def test_errors_are_confluent_json(schema_registry_url: str) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    status, content_type, body = http("GET", f"{schema_registry_url}/subjects/{missing}/versions")
    assert (status, body["error_code"]) == (404, 40401) and missing in body["message"]
    assert content_type.startswith(CONTENT_TYPE)
    status, _, body = http("GET", f"{schema_registry_url}/schemas/ids/1987654321")
    assert (status, body["error_code"]) == (404, 40403)
    status, _, body = http("POST", f"{schema_registry_url}/subjects/{missing}/versions", {"schema": '{"type": "nope"}'})
    assert (status, body["error_code"]) == (422, 42201)
    subject = f"t-{uuid.uuid4().hex[:8]}-value"
    client(schema_registry_url).register_schema(subject, avro_schema("E", [{"name": "a", "type": "int"}]))
    status, _, body = http("GET", f"{schema_registry_url}/subjects/{subject}/versions/99")
    assert (status, body["error_code"]) == (404, 40402)
    status, _, body = http("POST", f"{schema_registry_url}/subjects/{subject}", {"schema": '"string"'})
    assert (status, body["error_code"]) == (404, 40403)


def test_compatibility_config_and_subject_deletion(schema_registry_url: str) -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    registry = client(schema_registry_url)
    subject = f"t-{uuid.uuid4().hex[:8]}-value"
    registry.register_schema(subject, avro_schema("D", [{"name": "a", "type": "int"}]))
    registry.set_compatibility(subject, "NONE")
    assert registry.get_compatibility(subject) == "NONE"
    assert registry.get_compatibility() in ("BACKWARD", "NONE", "FULL", "FORWARD")
    assert registry.delete_subject(subject) == [1]
    with pytest.raises(SchemaRegistryError) as error:
        registry.get_versions(subject)
    assert error.value.error_code == 40401
    assert registry.delete_subject(subject, permanent=True) == [1]
    assert subject not in registry.get_subjects(deleted=True)


def test_ids_and_subjects_survive_a_restart_and_stop_touches_only_our_process(standin: DevStackConfig) -> None:
    url = schema_registry.url(standin)
    subject = "orders-value"
    first = client(url).register_schema(subject, avro_schema("A", [{"name": "a", "type": "int"}]))
    second = client(url).register_schema(subject, avro_schema("B", [{"name": "b", "type": "int"}]))
    running = schema_registry.status(standin)
    assert running.running and running.pid is not None
    assert schema_registry.state_file(standin).is_file()

    stopped = schema_registry.stop(standin)
    assert stopped.state == "stopped" and schema_registry.status(standin).state == "stopped"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/subjects", timeout=2)

    restarted = schema_registry.start(standin)
    schema_registry.wait_ready(standin, 30)
    assert restarted.pid != running.pid
    fresh = client(url)  # no client-side cache
    assert json.loads(fresh.get_schema(first).schema_str)["name"] == "A"
    assert fresh.get_versions(subject) == [1, 2]
    assert fresh.register_schema(subject, avro_schema("A", [{"name": "a", "type": "int"}])) == first
    third = fresh.register_schema("other-value", avro_schema("C", [{"name": "c", "type": "int"}]))
    assert third == max(first, second) + 1  # ids are never reused


def test_a_second_start_is_a_no_op_and_a_busy_port_is_reported(standin: DevStackConfig, tmp_path: Path) -> None:
    from cdcsync.core.errors import ServiceError

    before = schema_registry.status(standin)
    again = schema_registry.start(standin)
    assert again.pid == before.pid and not again.started
    squatter = DevStackConfig(state_dir=tmp_path / "other", schema_registry_port=standin.schema_registry_port)
    assert schema_registry.status(squatter).state == "port-busy"
    with pytest.raises(ServiceError, match="already in use"):
        schema_registry.start(squatter)
    schema_registry.stop(squatter)  # not ours: must leave the running one alone
    assert schema_registry.status(standin).pid == before.pid


def apicurio(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str, Any]:
    """(status, content type, JSON or text body) of one raw request to the stand-in's Apicurio v2 API."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, content_type, raw = response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        status, content_type, raw = error.code, error.headers["Content-Type"], error.read()
    return status, content_type, json.loads(raw)


def test_apicurio_v2_subset_shares_the_confluent_id_space(standin: DevStackConfig) -> None:
    """What Apicurio's serdes (Debezium's Avro converter in the dev stack) call: registered there, found by the
    Confluent client under the same id, and the other way round."""
    url = schema_registry.url(standin)
    api = f"{url}/apis/registry/v2"
    schema = json.dumps({"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]})
    create = {"X-Registry-ArtifactId": "shop.public.k-key", "X-Registry-ArtifactType": "AVRO"}
    create["Content-Type"] = "application/json"
    status, content_type, meta = apicurio(
        "POST", f"{api}/groups/default/artifacts?ifExists=RETURN_OR_UPDATE", schema.encode(), create
    )
    assert status == 200 and content_type == "application/json"
    assert meta["id"] == "shop.public.k-key" and meta["version"] == "1" and meta["type"] == "AVRO"
    schema_id = meta["contentId"]
    assert meta["globalId"] == schema_id
    assert json.loads(client(url).get_schema(schema_id).schema_str) == json.loads(schema)
    assert client(url).get_versions("shop.public.k-key") == [1]

    # the same content again (reformatted): the same version; the same schema through Confluent: the same id
    spaced = json.dumps(json.loads(schema), indent=2).encode()
    again = apicurio("POST", f"{api}/groups/default/artifacts?ifExists=RETURN_OR_UPDATE", spaced, create)[2]
    assert (again["contentId"], again["version"]) == (schema_id, "1")
    assert client(url).register_schema("other-value", avro_schema("K", [{"name": "id", "type": "long"}])) != 0
    confluent_id = client(url).register_schema("shop.public.k-key", client(url).get_schema(schema_id))
    assert confluent_id == schema_id
    assert apicurio("GET", f"{api}/ids/contentIds/{schema_id}")[2] == json.loads(schema)
    assert apicurio("GET", f"{api}/ids/globalIds/{schema_id}/references")[2] == []

    # find-latest and lookup by content
    latest = apicurio("GET", f"{api}/groups/default/artifacts/shop.public.k-key/meta")[2]
    assert (latest["contentId"], latest["version"]) == (schema_id, "1")
    found = apicurio("POST", f"{api}/groups/default/artifacts/shop.public.k-key/meta", spaced)[2]
    assert found["globalId"] == schema_id

    # a new schema is a new version; FAIL refuses an existing artifact; RETURN gives the latest without writing
    fields = [{"name": "id", "type": "long"}, {"name": "n", "type": ["null", "int"], "default": None}]
    evolved = json.dumps({"type": "record", "name": "K", "fields": fields}).encode()
    second = apicurio("POST", f"{api}/groups/default/artifacts?ifExists=RETURN_OR_UPDATE", evolved, create)[2]
    assert second["version"] == "2" and second["contentId"] not in (schema_id, 0)
    status, _, error = apicurio("POST", f"{api}/groups/default/artifacts?ifExists=FAIL", evolved, create)
    assert (status, error["error_code"], error["name"]) == (409, 409, "ArtifactAlreadyExistsException")
    assert apicurio("POST", f"{api}/groups/default/artifacts?ifExists=RETURN", schema.encode(), create)[2] == second

    # errors in Apicurio's shape, naming what is wrong
    status, content_type, error = apicurio("GET", f"{api}/groups/default/artifacts/missing/meta")
    assert (status, error["name"]) == (404, "ArtifactNotFoundException") and content_type == "application/json"
    status, _, error = apicurio("GET", f"{api}/ids/contentIds/987654")
    assert (status, error["error_code"]) == (404, 404)
    status, _, error = apicurio("POST", f"{api}/groups/mine/artifacts", schema.encode(), create)
    assert status == 400 and "group 'mine'" in error["message"]
    fresh = {**create, "X-Registry-ArtifactId": "fresh-value"}
    status, _, error = apicurio("POST", f"{api}/groups/default/artifacts", b'{"type": "nope"}', fresh)
    assert (status, error["name"]) == (400, "InvalidArtifactException")


# ---- decoding against the registry -------------------------------------------------------------------------------


def test_avro_serializer_output_is_decoded(schema_registry_url: str, topic: str) -> None:
    values = serializer(schema_registry_url, envelope(ROW_FIELDS))
    keys = serializer(schema_registry_url, KEY_SCHEMA)
    after = {
        "id": 5,
        "amount": Decimal("12.50"),
        "day": date(2024, 2, 29),
        "at": 1_709_164_800_000_001,
        "status": "paid",
    }
    messages = [
        (serialize(keys, topic, {"id": 5}, key=True), serialize(values, topic, change("c", after))),
        (serialize(keys, topic, {"id": 5}, key=True), serialize(values, topic, change("d", None, None))),
        (serialize(keys, topic, {"id": 5}, key=True), None),
    ]
    assert messages[0][1][0] == 0  # Confluent wire format
    for primary_key in (("id",), None):
        rows = decode(spec_for(schema_registry_url, COLUMNS, primary_key), messages)
        assert [r["_dlq_reason"] for r in rows] == [None, None]
        created, deleted = rows
        assert {k: created[k] for k in COLUMNS} == {
            "id": 5,
            "amount": Decimal("12.50"),
            "day": date(2024, 2, 29),
            "at": datetime(2024, 2, 29, 0, 0, 0, 1),
            "status": "paid",
        }
        assert (created["_cdc_op"], created["_cdc_version"]) == ("c", 77)
        assert created["_cdc_ts"] == datetime(2024, 1, 1, tzinfo=UTC)
        assert (deleted["id"], deleted["_cdc_op"], deleted["amount"]) == (5, "d", None)


def test_the_workload_in_avro_decodes_to_the_rows_of_the_workload_in_json(standin: DevStackConfig) -> None:
    """What the upsert benchmark's ``--format avro`` produces: the same changes, the same decoded rows."""
    from cdcsync.devstack import workload

    url = schema_registry.url(standin)
    load = workload.generate(300, 60, seed=4, wrapped=False)
    avro_events = workload.to_avro(load.events, *workload.register_avro_schemas(url, "bench.public.orders"))
    assert all(e.value is None or e.value[0] == 0 for e in avro_events)
    columns = tuple((name, parse_pg_type(text)) for name, text in workload.ORDERS_COLUMNS.items())
    rows = {}
    for fmt, events in (("json", load.events), ("avro", avro_events)):
        registry = SchemaRegistryAccess(url) if fmt == "avro" else None
        spec = DecodeSpec("orders", columns, ("id",), format=fmt, schema_registry=registry)
        decoded = [
            row for out in decode_batches(iter([workload.to_kafka_batch(events)]), spec) for row in out.to_pylist()
        ]
        assert all(row["_dlq_reason"] is None for row in decoded)
        # Partitions and offsets follow the key bytes, which differ between the formats: compare the rest.
        rows[fmt] = sorted(
            ({k: v for k, v in row.items() if k not in ("_cdc_partition", "_cdc_offset")} for row in decoded),
            key=lambda row: row["_cdc_version"],
        )
    assert len(rows["avro"]) == load.changes and rows["avro"] == rows["json"]


def test_two_writer_schemas_in_one_batch(schema_registry_url: str, topic: str) -> None:
    old = serializer(schema_registry_url, envelope(ROW_FIELDS))
    note = {"name": "note", "type": ["null", "string"], "default": None}
    new = serializer(schema_registry_url, envelope([*ROW_FIELDS, note]))
    row = {"id": 1, "amount": None, "day": None, "at": None, "status": "new"}
    messages = [
        (None, serialize(old, topic, change("c", row))),
        (None, serialize(new, topic, change("u", {**row, "status": "paid", "note": "evolved"}))),
        (None, serialize(old, topic, change("u", {**row, "status": "shipped"}))),
    ]
    ids = {int.from_bytes(value[1:5], "big") for _, value in messages if value}
    assert len(ids) == 2
    rows = decode(spec_for(schema_registry_url, {**COLUMNS, "note": "text"}), messages)
    assert [(r["status"], r["note"], r["_dlq_reason"]) for r in rows] == [
        ("new", None, None),
        ("paid", "evolved", None),
        ("shipped", None, None),
    ]


def test_an_unknown_schema_id_is_a_dead_letter(schema_registry_url: str) -> None:
    raw = b"\x00" + (2_000_000_000).to_bytes(4, "big") + b"\x00"
    (row,) = decode(spec_for(schema_registry_url, COLUMNS), [(b"k", raw)])
    assert "writer schema id 2000000000 is not in the schema registry" in row["_dlq_reason"]
    assert "HTTP 404" in row["_dlq_reason"] and row["_dlq_value"] == raw and row["id"] is None


def test_registry_down_is_retried_then_dead_lettered_or_fails_the_task(standin: DevStackConfig, topic: str) -> None:
    url = schema_registry.url(standin)
    value = serialize(serializer(url, envelope(ROW_FIELDS)), topic, change("c", {"id": 1, "status": "x"}))
    schema_registry.stop(standin)
    spec = spec_for(url, COLUMNS, retry_timeout_s=1.5)

    started = time.monotonic()
    (row,) = decode(spec, [(None, value)])
    assert time.monotonic() - started >= 1.5
    reason = row["_dlq_reason"]
    assert f"schema registry at {url} unreachable" in reason and "attempts" in reason, reason
    assert row["_dlq_value"] == value

    task = DecodeTask(spec=spec, dead_letters=None)  # on_decode_error: fail
    with pytest.raises(ReportedFailure) as failure:
        list(task(iter([kafka_batch([(None, value)])])))
    assert failure.value.report.kind is Kind.UNDECODABLE and "unreachable" in failure.value.report.describe()


def test_a_registry_that_comes_back_within_the_budget_decodes(standin: DevStackConfig, topic: str) -> None:
    url = schema_registry.url(standin)
    value = serialize(serializer(url, envelope(ROW_FIELDS)), topic, change("c", {"id": 2, "status": "back"}))
    schema_registry.stop(standin)

    def restart() -> None:
        time.sleep(1.0)
        schema_registry.start(standin)

    thread = threading.Thread(target=restart)
    thread.start()
    started = time.monotonic()
    (row,) = decode(spec_for(url, COLUMNS, retry_timeout_s=30), [(None, value)])
    thread.join()
    assert row["_dlq_reason"] is None and row["status"] == "back"
    assert 1.0 <= time.monotonic() - started < 30


def test_http_5xx_is_retried_then_dead_lettered() -> None:
    requests: list[str] = []

    class Busy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            body = json.dumps({"error_code": 50302, "message": "overloaded"}).encode()
            self.send_response(503)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        raw = b"\x00\x00\x00\x00\x07\x00"
        (row,) = decode(spec_for(url, COLUMNS, retry_timeout_s=1.0), [(None, raw)])
    finally:
        server.shutdown()
        server.server_close()
    assert "unreachable" in row["_dlq_reason"] and "HTTP 503: overloaded" in row["_dlq_reason"]
    assert len(requests) >= 3 and set(requests) == {"/schemas/ids/7"}
