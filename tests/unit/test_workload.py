"""The synthetic Debezium changelog generator: op mix, ordering, shape and the expected final state."""

from __future__ import annotations

import base64
import json
from collections import Counter
from datetime import datetime
from decimal import Decimal
from itertools import pairwise
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka import KafkaError, KafkaException

from cdcsync.core.errors import ServiceError
from cdcsync.devstack import workload
from cdcsync.devstack.workload import ChangeEvent, OpMix, generate

pytestmark = pytest.mark.unit


def payload_of(event: ChangeEvent) -> dict[str, Any]:
    assert event.value is not None
    document = json.loads(event.value, parse_float=Decimal)
    return document["payload"] if "schema" in document else document


def independent_fold(load: workload.Workload) -> dict[int, dict[str, Any]]:
    """The final state, read back from the messages with the standard library only."""
    state: dict[int, dict[str, Any]] = {}
    for event in load.events:
        if event.value is None:
            continue
        payload = payload_of(event)
        key = json.loads(event.key or b"")
        key_id = (key["payload"] if load.wrapped else key)["id"]
        if payload["op"] == "d":
            del state[key_id]
            continue
        row = dict(payload["after"])
        amount = row["amount"]
        if amount is not None and load.wrapped:
            unscaled = int.from_bytes(base64.b64decode(amount), "big", signed=True)
            row["amount"] = Decimal(unscaled).scaleb(-2)
        elif amount is not None:
            row["amount"] = Decimal(amount)
        row["updated_at"] = datetime.fromisoformat(row["updated_at"].replace("Z", "+00:00"))
        state[key_id] = row
    return state


def test_op_mix_roughly_holds() -> None:
    load = generate(20_000, 100_000, seed=7)
    total = load.changes
    assert total == 20_000
    assert abs(load.counts["c"] / total - 0.3) < 0.02
    assert abs(load.counts["u"] / total - 0.6) < 0.02
    assert abs(load.counts["d"] / total - 0.1) < 0.02
    assert load.counts["tombstone"] == load.counts["d"]
    assert Counter(e.op for e in load.events) == {
        "c": load.counts["c"],
        "u": load.counts["u"],
        "d": load.counts["d"],
        None: load.counts["tombstone"],
    }


def test_custom_mix_and_key_exhaustion() -> None:
    inserts_only = generate(15, 10, seed=1, mix=OpMix(insert=1, update=0, delete=0), tombstones=False)
    assert [e.op for e in inserts_only.events] == ["c"] * 10 + ["u"] * 5  # every key live: inserts become updates
    assert sorted(inserts_only.expected) == list(range(1, 11))
    churn = generate(2_000, 5, seed=2, mix=OpMix(insert=1, update=0, delete=1))
    assert churn.counts["u"] < churn.counts["c"]  # only inserts that found all 5 keys live became updates
    assert sum(churn.counts[op] for op in "cud") == 2_000
    reinserted = Counter(e.id for e in churn.events if e.op == "c")
    assert max(reinserted.values()) > 1  # deleted keys come back
    with pytest.raises(ValueError):
        OpMix(insert=-1)


@pytest.mark.parametrize("wrapped", [False, True])
def test_lsn_strictly_increasing_and_times_ordered(wrapped: bool) -> None:
    load = generate(3_000, 200, seed=3, wrapped=wrapped)
    sources = [payload_of(e)["source"] for e in load.events if e.value is not None]
    lsns = [s["lsn"] for s in sources]
    assert all(a < b for a, b in pairwise(lsns))
    assert [e.lsn for e in load.events if e.value is not None] == lsns and load.last_lsn == lsns[-1]
    assert all(a["ts_ms"] <= b["ts_ms"] for a, b in pairwise(sources))
    assert {(s["db"], s["schema"], s["table"], s["connector"]) for s in sources} == {
        ("shop", "public", "orders", "postgresql")
    }


def test_deterministic_per_seed() -> None:
    assert generate(500, 50, seed=9).events == generate(500, 50, seed=9).events
    assert generate(500, 50, seed=9).events != generate(500, 50, seed=10).events


def test_changelog_streams_what_generate_holds() -> None:
    held = generate(2_000, 40, seed=4, wrapped=True)
    log = workload.Changelog(2_000, 40, seed=4, wrapped=True)
    assert log.expected == {}  # filled only once the stream has been read to its end
    assert list(log) == held.events
    assert (log.expected, log.counts, log.last_lsn) == (held.expected, held.counts, held.last_lsn)
    assert list(log) == held.events  # a second pass generates the same stream again


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("full", [False, True])
def test_expected_state_matches_an_independent_fold(wrapped: bool, full: bool) -> None:
    load = generate(4_000, 300, seed=5, wrapped=wrapped, replica_identity_full=full)
    assert independent_fold(load) == load.expected
    assert set(load.expected) <= set(range(1, 301))
    for key_id, row in load.expected.items():
        assert list(row) == list(workload.ORDERS_COLUMNS) and row["id"] == key_id
        assert isinstance(row["customer_id"], int) and isinstance(row["status"], str)
        assert row["amount"] is None or row["amount"] == row["amount"].quantize(Decimal("0.01"))
        assert row["updated_at"].utcoffset().total_seconds() == 0


@pytest.mark.parametrize("full", [False, True])
def test_events_have_the_debezium_shape(full: bool) -> None:
    load = generate(1_000, 50, seed=4, replica_identity_full=full)
    for i, event in enumerate(load.events):
        if event.value is None:
            previous = load.events[i - 1]
            assert previous.op == "d" and previous.key == event.key
            continue
        payload = payload_of(event)
        assert json.loads(event.key or b"") == {"id": event.id}
        assert payload["op"] == event.op and payload["ts_ms"] >= payload["source"]["ts_ms"]
        if event.op == "c":
            assert payload["before"] is None and payload["after"]["id"] == event.id
        elif event.op == "u":
            assert payload["after"]["id"] == event.id
            assert (payload["before"] is not None) == full
        else:
            assert payload["after"] is None and payload["before"]["id"] == event.id
            if not full:
                assert {k for k, v in payload["before"].items() if v is not None} == {"id"}


def test_wrapped_messages_carry_connect_schemas() -> None:
    load = generate(20, 10, seed=1, wrapped=True)
    event = next(e for e in load.events if e.op == "c")
    document = json.loads(event.value or b"")
    assert set(document) == {"schema", "payload"}
    after = next(f for f in document["schema"]["fields"] if f["field"] == "after")
    columns = {f["field"]: f for f in after["fields"]}
    assert list(columns) == list(workload.ORDERS_COLUMNS)
    assert columns["amount"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert columns["amount"]["parameters"]["scale"] == "2"
    assert columns["updated_at"]["name"] == "io.debezium.time.ZonedTimestamp"
    key = json.loads(event.key or b"")
    assert key["payload"] == {"id": event.id} and key["schema"]["fields"][0]["field"] == "id"
    amount = document["payload"]["after"]["amount"]
    assert amount is None or isinstance(amount, str)


def test_plain_messages_write_exact_decimal_numbers() -> None:
    load = generate(200, 50, seed=1)
    raw = next(e.value for e in load.events if e.op == "c" and payload_of(e)["after"]["amount"] is not None)
    amount = payload_of(ChangeEvent(None, raw, 0, "c"))["after"]["amount"]
    assert isinstance(amount, Decimal) and amount.as_tuple().exponent == -2
    assert f'"amount":{amount}'.encode() in (raw or b"")


@pytest.mark.parametrize(
    ("value", "raw"),
    [
        ("0.00", b"\x00"),
        ("1.27", b"\x7f"),
        ("1.28", b"\x00\x80"),
        ("-1.28", b"\x80"),
        ("-1.29", b"\xff\x7f"),
        ("-0.01", b"\xff"),
        ("2.55", b"\x00\xff"),
    ],
)
def test_decimal_bytes_are_minimal_twos_complement(value: str, raw: bytes) -> None:
    assert base64.b64decode(workload.decimal_bytes_b64(Decimal(value), 2)) == raw


def test_zoned_timestamps_look_like_java() -> None:
    assert (
        workload.zoned_timestamp(datetime.fromisoformat("2024-01-02T03:04:05.120000+00:00"))
        == "2024-01-02T03:04:05.12Z"
    )
    assert workload.zoned_timestamp(datetime.fromisoformat("2024-01-02T05:04:05+02:00")) == "2024-01-02T03:04:05Z"


@pytest.mark.parametrize("wrapped", [False, True])
def test_malformed_events(wrapped: bool) -> None:
    events = workload.malformed_events(wrapped=wrapped)
    assert len(events) == 5 and {e.op for e in events} == {"malformed"}
    assert len({e.id for e in events}) == 5 and min(e.id for e in events) >= 1_000_000_000
    values = [e.value or b"" for e in events]
    with pytest.raises(UnicodeDecodeError):
        values[0].decode()
    with pytest.raises(json.JSONDecodeError):
        json.loads(values[1])
    assert json.loads(values[2]) == [1, 2, 3]
    assert "op" not in json.loads(values[3])
    wrong = json.loads(values[4])
    assert (wrong["payload"] if wrapped else wrong)["after"]["customer_id"] == "not-a-number"


def test_stale_replays_are_older_than_the_newest_change_of_their_key() -> None:
    load = generate(1_000, 40, seed=8)
    newest: dict[int, int] = {}
    for event in load.events:
        if event.lsn is not None:
            newest[event.id] = event.lsn
    replays = workload.stale_replays(load, 50, seed=1)
    assert len(replays) == 50 and replays == workload.stale_replays(load, 50, seed=1)
    assert all(e.lsn is not None and e.lsn < newest[e.id] for e in replays)
    assert all(e in load.events for e in replays)
    assert len(workload.stale_replays(generate(3, 3, seed=1), 10)) <= 3


def test_to_kafka_batch_partitions_by_key_with_consecutive_offsets() -> None:
    load = generate(500, 30, seed=6)
    batch = workload.to_kafka_batch(load.events, partitions=3)
    assert batch.schema.names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    rows = batch.to_pylist()
    partition_of: dict[bytes, int] = {}
    offsets: dict[int, list[int]] = {}
    for row in rows:
        assert partition_of.setdefault(row["key"], row["partition"]) == row["partition"]
        offsets.setdefault(row["partition"], []).append(row["offset"])
    assert all(o == list(range(len(o))) for o in offsets.values())


# ---- producing, against fakes of the confluent_kafka clients ----------------------------------------------------


class FakeAdmin:
    topics: dict[str, Any] = {}
    created: list[Any] = []
    unreachable = False

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def list_topics(self, timeout: float) -> Any:
        if FakeAdmin.unreachable:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return type("Metadata", (), {"topics": dict(FakeAdmin.topics)})()

    def create_topics(self, new_topics: list[Any], operation_timeout: float) -> dict[str, Any]:
        FakeAdmin.created.extend(new_topics)
        done = type("Future", (), {"result": lambda self, timeout=None: None})()
        return {t.topic: done for t in new_topics}


class FakeProducer:
    instances: list[FakeProducer] = []
    fail_every: int = 0
    full_once = False

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.pending: list[Any] = []
        FakeProducer.instances.append(self)

    def produce(
        self, topic: str, key: bytes | None = None, value: bytes | None = None, on_delivery: Any = None
    ) -> None:
        if FakeProducer.full_once:
            FakeProducer.full_once = False
            raise BufferError("queue full")
        self.sent.append((topic, key, value))
        failed = FakeProducer.fail_every and len(self.sent) % FakeProducer.fail_every == 0
        self.pending.append((on_delivery, KafkaError(KafkaError._MSG_TIMED_OUT) if failed else None))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        for callback, error in self.pending:
            callback(error, None)
        self.pending.clear()
        return 0


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeAdmin.topics, FakeAdmin.created, FakeAdmin.unreachable = {}, [], False
    FakeProducer.instances, FakeProducer.fail_every, FakeProducer.full_once = [], 0, False
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", FakeAdmin)
    monkeypatch.setattr(confluent_kafka, "Producer", FakeProducer)


def test_produce_creates_the_topic_and_sends_keyed_messages_in_order(fake_kafka: None) -> None:
    load = generate(100, 10, seed=1)
    FakeProducer.full_once = True
    assert workload.produce("broker:9092", "shop.public.orders", load.events, partitions=6) == len(load.events)
    (created,) = FakeAdmin.created
    assert (created.topic, created.num_partitions) == ("shop.public.orders", 6)
    (producer,) = FakeProducer.instances
    assert producer.sent == [("shop.public.orders", e.key, e.value) for e in load.events]
    assert producer.config["bootstrap.servers"] == "broker:9092" and producer.config["linger.ms"] > 0
    assert producer.config["partitioner"] == "murmur2_random"


def test_produce_leaves_an_existing_topic_alone(fake_kafka: None) -> None:
    FakeAdmin.topics = {"t": type("TopicMetadata", (), {"error": None})()}
    workload.produce("broker:9092", "t", generate(5, 5, seed=1).events)
    assert FakeAdmin.created == []


def test_produce_raises_on_delivery_failure(fake_kafka: None) -> None:
    FakeProducer.fail_every = 10
    with pytest.raises(ServiceError, match=r"producing to topic 't' on broker:9092: 5 of 50 messages failed"):
        workload.produce("broker:9092", "t", generate(50, 100, seed=1, tombstones=False).events)


def test_produce_reports_an_unreachable_broker(fake_kafka: None) -> None:
    FakeAdmin.unreachable = True
    with pytest.raises(ServiceError, match="cannot reach Kafka at broker:9092") as caught:
        workload.produce("broker:9092", "t", [])
    assert caught.value.retriable


def test_cli_produces_and_prints_counts(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, str, int, int]] = []

    def fake_produce(bootstrap: str, topic: str, events: list[ChangeEvent], partitions: int = 4) -> int:
        calls.append((bootstrap, topic, len(events), partitions))
        return len(events)

    monkeypatch.setattr(workload.cli, "produce", fake_produce)  # where main looks it up
    args = [
        "--bootstrap",
        "b:1",
        "--topic",
        "t",
        "--changes",
        "300",
        "--keys",
        "40",
        "--seed",
        "2",
        "--malformed",
        "--replays",
        "7",
        "--partitions",
        "2",
    ]
    assert workload.main(args) == 0
    load = generate(300, 40, seed=2)
    assert calls == [("b:1", "t", len(load.events) + 5 + 7, 2)]
    out = capsys.readouterr().out
    assert f"{load.counts['c']} inserts, {load.counts['u']} updates, {load.counts['d']} deletes" in out
    assert f"{len(load.expected)} live keys expected" in out

    monkeypatch.setenv("CDCSYNC__KAFKA__BOOTSTRAP_SERVERS", "from-settings:9092")
    assert workload.main(["--topic", "t", "--changes", "5"]) == 0
    assert calls[-1][0] == "from-settings:9092"

    def failing_produce(*args: Any, **kwargs: Any) -> int:
        raise ServiceError("cannot reach Kafka at b:1", hint="start it")

    monkeypatch.setattr(workload.cli, "produce", failing_produce)
    assert workload.main(["--topic", "t", "--changes", "5"]) == 1
    assert "error: cannot reach Kafka at b:1" in capsys.readouterr().err
