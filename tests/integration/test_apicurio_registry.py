"""The schema registry over HTTP: confluent-kafka's client and serializer against the session's registry (the dev
stack's Apicurio Registry through its Confluent-compatible API, or ``CDCSYNC_TEST_SCHEMA_REGISTRY_URL``), and the
Avro decoder fetching writer schemas from it. What the dev stack relies on in Apicurio itself (one id space for its
v2 and ccompat APIs, ids that survive a restart) is checked against the real server; a restart uses a server of its
own on a free port."""

from __future__ import annotations

import json
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
from cdcsync.devstack import DevStackConfig, apicurio
from cdcsync.devstack.apicurio import ApicurioRegistry
from cdcsync.sources.debezium.avro_registry import SchemaRegistryAccess
from cdcsync.sources.debezium.dispatch import decode_batches
from cdcsync.sources.debezium.spec import DecodeSpec
from cdcsync.sources.kafka import DecodeTask
from tests.ports import free_port

pytestmark = pytest.mark.integration

UTC = timezone.utc
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


# ---- helpers -----------------------------------------------------------------------------------------------------


def client(url: str) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url})


def avro_schema(name: str, fields: list[dict[str, Any]]) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps({"type": "record", "name": name, "namespace": "cdcsync.test", "fields": fields}), "AVRO")


def v2(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, JSON body) of one raw request to Apicurio's v2 API, as Apicurio's serdes make it."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


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


@pytest.fixture(scope="module")
def own_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApicurioRegistry]:
    """An Apicurio Registry of this module's own (free port, own state dir), started through the dev-stack code."""
    config = DevStackConfig(state_dir=tmp_path_factory.mktemp("registry"), schema_registry_port=free_port())
    registry = ApicurioRegistry(config)
    registry.start()
    try:
        registry.wait_ready(180)
        yield registry
    finally:
        registry.stop()


# ---- what the dev stack relies on in Apicurio --------------------------------------------------------------------


def test_v2_and_ccompat_share_one_id_space(schema_registry_url: str) -> None:
    """Apicurio's converter (Debezium in Avro) registers through v2 and writes the contentId; a Confluent client
    must fetch exactly that schema by that id, and registering it again through ccompat must give the same id."""
    api = apicurio.v2_url(schema_registry_url)
    artifact = f"shop.public.k{uuid.uuid4().hex[:8]}-key"
    schema = json.dumps({"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]})
    create = {"X-Registry-ArtifactId": artifact, "X-Registry-ArtifactType": "AVRO", "Content-Type": "application/json"}
    status, meta = v2("POST", f"{api}/groups/default/artifacts?ifExists=RETURN_OR_UPDATE", schema.encode(), create)
    assert status == 200 and meta["id"] == artifact and meta["version"] == "1"
    schema_id = meta["contentId"]
    registry = client(schema_registry_url)
    assert json.loads(registry.get_schema(schema_id).schema_str) == json.loads(schema)
    assert registry.get_versions(artifact) == [1]
    assert registry.register_schema(artifact, registry.get_schema(schema_id)) == schema_id
    assert v2("GET", f"{api}/ids/contentIds/{schema_id}")[1] == json.loads(schema)
    again = v2("POST", f"{api}/groups/default/artifacts?ifExists=RETURN_OR_UPDATE", schema.encode(), create)[1]
    assert (again["contentId"], again["version"]) == (schema_id, "1")


def test_ids_and_subjects_survive_a_restart_and_stop_touches_only_our_process(
    own_registry: ApicurioRegistry, tmp_path: Path
) -> None:
    from cdcsync.core.errors import ServiceError

    url = own_registry.address
    assert url.endswith("/apis/ccompat/v7")
    subject = "orders-value"
    first = client(url).register_schema(subject, avro_schema("A", [{"name": "a", "type": "int"}]))
    second = client(url).register_schema(subject, avro_schema("B", [{"name": "b", "type": "int"}]))
    running = own_registry.status()
    assert running.running and running.pid is not None

    again = own_registry.start()  # a second start is a no-op
    assert again.pid == running.pid and not again.started
    squatter = ApicurioRegistry(
        DevStackConfig(state_dir=tmp_path / "other", schema_registry_port=own_registry.cfg.schema_registry_port)
    )
    assert squatter.status().state == "port-busy"
    with pytest.raises(ServiceError, match="already in use"):
        squatter.start()
    squatter.stop()  # not ours: must leave the running one alone
    assert own_registry.status().pid == running.pid

    stopped = own_registry.stop()
    assert stopped.state == "stopped" and own_registry.status().state == "stopped"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/subjects", timeout=2)

    restarted = own_registry.start()
    own_registry.wait_ready(180)
    assert restarted.pid != running.pid
    fresh = client(url)  # no client-side cache
    assert json.loads(fresh.get_schema(first).schema_str)["name"] == "A"
    assert fresh.get_versions(subject) == [1, 2]
    assert fresh.register_schema(subject, avro_schema("A", [{"name": "a", "type": "int"}])) == first
    third = fresh.register_schema("other-value", avro_schema("C", [{"name": "c", "type": "int"}]))
    assert third == max(first, second) + 1  # ids are never reused


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
        assert [r["_dlq_reason"] for r in rows] == [None, None, None]
        created, deleted, tombstone = rows
        assert (tombstone["id"], tombstone["_cdc_op"], tombstone["_cdc_version"]) == (5, "d", None)
        assert {k: created[k] for k in COLUMNS} == {
            "id": 5,
            "amount": Decimal("12.50"),
            "day": date(2024, 2, 29),
            "at": datetime(2024, 2, 29, 0, 0, 0, 1),
            "status": "paid",
        }
        assert (created["_cdc_op"], created["_cdc_version"]) == ("c", (77 << 64) + 77)  # no sequence: LSN as commit
        assert created["_cdc_ts"] == datetime(2024, 1, 1, tzinfo=UTC)
        assert (deleted["id"], deleted["_cdc_op"], deleted["amount"]) == (5, "d", None)


def test_the_workload_in_avro_decodes_to_the_rows_of_the_workload_in_json(schema_registry_url: str) -> None:
    """What the upsert benchmark's ``--format avro`` produces: the same changes, the same decoded rows."""
    from cdcsync.devstack import workload

    url = schema_registry_url
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
            # Tombstones (deletes without a version) last, by key.
            key=lambda row: (row["_cdc_version"] is None, row["_cdc_version"] or 0, row["id"]),
        )
    changes = [row for row in rows["avro"] if row["_cdc_version"] is not None]
    assert len(changes) == load.changes and rows["avro"] == rows["json"]


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


def test_a_url_without_the_registry_api_fails_the_task_and_dead_letters_nothing(schema_registry_url: str) -> None:
    """The registry's server without its API's path (Apicurio's root instead of ``/apis/ccompat/v7``) answers
    HTTP 404 to every id, with an error code that is not "schema not found": the configuration's fault, so the
    task fails naming the setting, and no message becomes a dead letter (else every message would)."""
    root = schema_registry_url.split("/apis/")[0] + "/"
    raw = b"\x00" + (2_000_000_001).to_bytes(4, "big") + b"\x00"
    with pytest.raises(ReportedFailure) as failure:
        decode(spec_for(root, COLUMNS), [(b"k", raw)])
    report = failure.value.report
    assert report.kind is Kind.SERVICE_UNAVAILABLE
    for fragment in ("does not answer as a schema registry", "HTTP 404", "CDCSYNC__SCHEMA_REGISTRY__URL", "ccompat"):
        assert fragment in report.describe()


def test_registry_down_is_retried_then_fails_the_task_and_dead_letters_nothing(
    schema_registry_url: str, topic: str
) -> None:
    """An unreachable registry is an infrastructure fault, whatever on_decode_error says: after its retry budget
    the task fails with a retriable report, and no message becomes a dead letter."""
    value = serialize(
        serializer(schema_registry_url, envelope(ROW_FIELDS)), topic, change("c", {"id": 1, "status": "x"})
    )
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"  # nobody listens there
    spec = spec_for(url, COLUMNS, retry_timeout_s=1.5)

    for dead_letters in (True, False):  # on_decode_error: dlq, then fail
        started = time.monotonic()
        with pytest.raises(ReportedFailure) as failure:
            if dead_letters:
                decode(spec, [(None, value)])
            else:
                list(DecodeTask(spec=spec, dead_letters=None)(iter([kafka_batch([(None, value)])])))
        assert time.monotonic() - started >= 1.5
        report = failure.value.report
        assert report.kind is Kind.SERVICE_UNAVAILABLE
        assert f"schema registry at {url} unreachable" in report.describe() and "attempts" in report.describe()
        assert report.error("decoding").retriable


class _QuietHandler(BaseHTTPRequestHandler):
    def reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_registry_that_comes_back_within_the_budget_decodes(schema_registry_url: str, topic: str) -> None:
    """The registry is away (nothing listens) and comes back after a second: a proxy in front of the real one."""
    value = serialize(
        serializer(schema_registry_url, envelope(ROW_FIELDS)), topic, change("c", {"id": 2, "status": "back"})
    )
    port = free_port()

    class Forward(_QuietHandler):
        def do_GET(self) -> None:
            with urllib.request.urlopen(schema_registry_url + self.path.removeprefix("/x"), timeout=10) as answer:
                self.reply(answer.status, answer.headers["Content-Type"], answer.read())

    servers: list[ThreadingHTTPServer] = []

    def come_back() -> None:
        time.sleep(1.0)
        servers.append(ThreadingHTTPServer(("127.0.0.1", port), Forward))
        servers[0].serve_forever()

    threading.Thread(target=come_back, daemon=True).start()
    started = time.monotonic()
    try:
        (row,) = decode(spec_for(f"http://127.0.0.1:{port}/x", COLUMNS, retry_timeout_s=30), [(None, value)])
    finally:
        if servers:
            servers[0].shutdown()
            servers[0].server_close()
    assert row["_dlq_reason"] is None and row["status"] == "back"
    assert 1.0 <= time.monotonic() - started < 30


def test_http_5xx_is_retried_then_fails_the_task() -> None:
    requests: list[str] = []

    class Busy(_QuietHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.reply(503, CONTENT_TYPE, json.dumps({"error_code": 50302, "message": "overloaded"}).encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        raw = b"\x00\x00\x00\x00\x07\x00"
        with pytest.raises(ReportedFailure) as failure:
            decode(spec_for(url, COLUMNS, retry_timeout_s=1.0), [(None, raw)])
    finally:
        server.shutdown()
        server.server_close()
    described = failure.value.report.describe()
    assert "unreachable" in described and "HTTP 503: overloaded" in described
    assert len(requests) >= 3 and set(requests) == {"/schemas/ids/7"}
