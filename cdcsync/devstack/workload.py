"""Synthetic Debezium changelogs for ``make demo``, the end-to-end tests and the benchmarks.

:func:`generate` builds a deterministic (seeded) stream of change events for an ``orders`` table, as the Debezium
Postgres connector writes them through Kafka Connect's JsonConverter, together with the table's expected final
state. :func:`produce` sends events to Kafka; :func:`malformed_events` and :func:`stale_replays` make the messages
that the dead-letter and replay tests need; :func:`to_kafka_batch` shapes events like Spark's Kafka source does,
for tests and benchmarks that decode without Spark; :func:`to_avro` re-encodes the plain-payload events in Avro
(Confluent wire format) with the schemas :func:`register_avro_schemas` puts in a registry.

The table::

    orders(id bigint primary key, customer_id bigint, amount numeric(12,2), status text, "Note" text,
           updated_at timestamptz)

Every event carries ``before``, ``after``, ``source`` (with ``lsn`` strictly increasing over the whole stream,
``ts_ms``, ``db``, ``schema``, ``table``), ``op`` and ``ts_ms``. With ``wrapped=True`` each message has the
``{"schema": ..., "payload": ...}`` wrapper (``schemas.enable=true``) and ``amount`` travels as Connect
``Decimal`` bytes (base64, ``scale`` 2) as in Debezium's default ``decimal.handling.mode=precise``; without it the
payload is bare and ``amount`` is a JSON number with its exact digits (JsonConverter ``decimal.format=NUMERIC``).
``updated_at`` is an ``io.debezium.time.ZonedTimestamp`` ISO string either way. Updates carry ``before: null``
and deletes a ``before`` holding only the key, as with ``REPLICA IDENTITY DEFAULT``; ``replica_identity_full``
puts the whole old row there. A delete is followed by a tombstone unless ``tombstones=False``.

Run ``python -m cdcsync.devstack.workload --bootstrap HOST:PORT --topic shop.public.orders --changes N
--keys K --seed S`` to produce a stream and print its counts.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import re
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import CdcsyncError, ServiceError

if TYPE_CHECKING:
    import pyarrow as pa

ORDERS_TABLE = "orders"
ORDERS_COLUMNS: dict[str, str] = {
    "id": "bigint",
    "customer_id": "bigint",
    "amount": "numeric(12,2)",
    "status": "text",
    "Note": "text",
    "updated_at": "timestamptz",
}
"""Column name -> Postgres type, to declare the same columns in a pipeline (``sources.<id>.columns``)."""
ORDERS_PRIMARY_KEY: tuple[str, ...] = ("id",)
AMOUNT_SCALE = 2

STATUSES = ("new", "paid", "shipped", "delivered", "cancelled", "refunded")
NOTES = (
    "leave at the door",
    'customer said "call first"',
    "café crème, s'il vous plaît",
    "gift wrap 🎁",
    "back\\slash and\ttab",
    "",
)
DEFAULT_START = datetime(2024, 1, 1, tzinfo=timezone.utc)
DEFAULT_START_LSN = 0x1_6B37_4D48


@dataclass(frozen=True)
class OpMix:
    """Relative weights of inserts, updates and deletes (normalised, so they need not sum to 1)."""

    insert: float = 0.3
    update: float = 0.6
    delete: float = 0.1

    def __post_init__(self) -> None:
        weights = (self.insert, self.update, self.delete)
        if min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"op mix weights must be >= 0 and not all 0, got {weights}")


@dataclass(frozen=True)
class ChangeEvent:
    """One Kafka message: ``value`` None is a tombstone."""

    key: bytes | None
    value: bytes | None
    id: int
    op: str | None
    """'c', 'u', 'd'; None for a tombstone; 'malformed' for :func:`malformed_events`."""
    lsn: int | None = None


@dataclass
class Workload:
    events: list[ChangeEvent]
    expected: dict[int, dict[str, Any]]
    """Live rows after the whole stream: id -> {column: value} (int, Decimal, str, aware UTC datetime, None)."""
    counts: dict[str, int]
    """Events per kind: ``c``, ``u``, ``d``, ``tombstone``."""
    wrapped: bool
    keys: int
    seed: int
    last_lsn: int = 0
    columns: dict[str, str] = field(default_factory=lambda: dict(ORDERS_COLUMNS))

    @property
    def changes(self) -> int:
        return self.counts["c"] + self.counts["u"] + self.counts["d"]


# --------------------------------------------------------------------------------------------------------------
# Encoding like Debezium + JsonConverter
# --------------------------------------------------------------------------------------------------------------

_DECIMAL_MARK = re.compile(r'"\\u0001D([-0-9.]+)\\u0001"')


def _dumps(obj: Any) -> bytes:
    """Compact JSON; ``"\\x01D<digits>\\x01"`` placeholders become bare number tokens (exact decimals)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return _DECIMAL_MARK.sub(r"\1", text).encode()


def _decimal_bytes_b64(value: Decimal, scale: int) -> str:
    """Connect ``Decimal``: the unscaled value as big-endian two's complement (Java BigInteger.toByteArray)."""
    unscaled = int(value.scaleb(scale))
    length = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def zoned_timestamp(value: datetime) -> str:
    """``io.debezium.time.ZonedTimestamp`` text: ISO-8601 in UTC with Java's trimmed fraction and ``Z``."""
    value = value.astimezone(timezone.utc)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += "." + f"{value.microsecond:06d}".rstrip("0")
    return text + "Z"


def _column_schema(server: str, table: str) -> list[dict[str, Any]]:
    return [
        {"type": "int64", "optional": False, "default": 0, "field": "id"},
        {"type": "int64", "optional": True, "field": "customer_id"},
        {
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": str(AMOUNT_SCALE), "connect.decimal.precision": "12"},
            "field": "amount",
        },
        {"type": "string", "optional": True, "field": "status"},
        {"type": "string", "optional": True, "field": "Note"},
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.time.ZonedTimestamp",
            "version": 1,
            "field": "updated_at",
        },
    ]


def _envelope_schema(server: str, table: str) -> dict[str, Any]:
    row_name = f"{server}.public.{table}.Value"
    columns = _column_schema(server, table)
    source_fields = [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "name"},
        {"type": "int64", "optional": False, "field": "ts_ms"},
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {"allowed": "true,last,false,incremental"},
            "default": "false",
            "field": "snapshot",
        },
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": True, "field": "sequence"},
        {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"},
        {"type": "int64", "optional": True, "field": "txId"},
        {"type": "int64", "optional": True, "field": "lsn"},
        {"type": "int64", "optional": True, "field": "xmin"},
    ]
    return {
        "type": "struct",
        "fields": [
            {"type": "struct", "fields": columns, "optional": True, "name": row_name, "field": "before"},
            {"type": "struct", "fields": columns, "optional": True, "name": row_name, "field": "after"},
            {
                "type": "struct",
                "fields": source_fields,
                "optional": False,
                "name": "io.debezium.connector.postgresql.Source",
                "field": "source",
            },
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {
                "type": "struct",
                "optional": True,
                "name": "event.block",
                "version": 1,
                "field": "transaction",
                "fields": [
                    {"type": "string", "optional": False, "field": "id"},
                    {"type": "int64", "optional": False, "field": "total_order"},
                    {"type": "int64", "optional": False, "field": "data_collection_order"},
                ],
            },
        ],
        "optional": False,
        "name": f"{server}.public.{table}.Envelope",
        "version": 1,
    }


def _key_schema(server: str, table: str) -> dict[str, Any]:
    return {
        "type": "struct",
        "fields": [{"type": "int64", "optional": False, "default": 0, "field": "id"}],
        "optional": False,
        "name": f"{server}.public.{table}.Key",
    }


class _Encoder:
    def __init__(self, wrapped: bool, server: str, db: str, table: str) -> None:
        self.wrapped = wrapped
        self.server, self.db, self.table = server, db, table
        self.value_schema = _envelope_schema(server, table) if wrapped else None
        self.key_schema = _key_schema(server, table) if wrapped else None

    def row(self, row: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        out: dict[str, Any] = {}
        for name, value in row.items():
            if value is None:
                out[name] = None
            elif isinstance(value, Decimal):
                out[name] = _decimal_bytes_b64(value, AMOUNT_SCALE) if self.wrapped else f"\x01D{value}\x01"
            elif isinstance(value, datetime):
                out[name] = zoned_timestamp(value)
            else:
                out[name] = value
        return out

    def key(self, key_id: int) -> bytes:
        payload = {"id": key_id}
        return _dumps({"schema": self.key_schema, "payload": payload} if self.wrapped else payload)

    def value(self, payload: dict[str, Any]) -> bytes:
        return _dumps({"schema": self.value_schema, "payload": payload} if self.wrapped else payload)

    def change(
        self,
        op: str,
        before: Mapping[str, Any] | None,
        after: Mapping[str, Any] | None,
        *,
        lsn: int,
        prev_lsn: int,
        tx_id: int,
        ts_ms: int,
        emitted_ms: int,
    ) -> bytes:
        payload = {
            "before": self.row(before),
            "after": self.row(after),
            "source": {
                "version": "2.7.3.Final",
                "connector": "postgresql",
                "name": self.server,
                "ts_ms": ts_ms,
                "snapshot": "false",
                "db": self.db,
                "sequence": json.dumps([str(prev_lsn), str(lsn)], separators=(",", ":")),
                "schema": "public",
                "table": self.table,
                "txId": tx_id,
                "lsn": lsn,
                "xmin": None,
            },
            "op": op,
            "ts_ms": emitted_ms,
            "transaction": None,
        }
        return self.value(payload)


class _KeyPool:
    """A set of ids with O(1) add, remove and uniform random choice (deterministic given the rng)."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self.items: list[int] = list(ids)
        self.where = {item: i for i, item in enumerate(self.items)}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: int) -> None:
        self.where[item] = len(self.items)
        self.items.append(item)

    def remove(self, item: int) -> None:
        i = self.where.pop(item)
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.where[last] = i

    def choice(self, rng: random.Random) -> int:
        return self.items[rng.randrange(len(self.items))]


def _random_row(rng: random.Random, key_id: int, when: datetime, customers: int = 500) -> dict[str, Any]:
    return {
        "id": key_id,
        "customer_id": rng.randint(1, customers),
        "amount": _random_amount(rng),
        "status": rng.choice(STATUSES[:2]),
        "Note": rng.choice(NOTES) if rng.random() < 0.5 else None,
        "updated_at": when,
    }


def _random_amount(rng: random.Random) -> Decimal | None:
    roll = rng.random()
    if roll < 0.03:
        return None
    cents = rng.randint(0, 99_999_999) if roll < 0.95 else -rng.randint(1, 9_999_999)
    if rng.random() < 0.01:
        cents = rng.choice((0, 1, -1, 127, 128, -128, -129, 255, 256, 99_999_999_999, -99_999_999_999))
    return Decimal(cents).scaleb(-AMOUNT_SCALE)


def _updated_row(rng: random.Random, old: Mapping[str, Any], when: datetime, customers: int = 500) -> dict[str, Any]:
    row = dict(old)
    row["status"] = rng.choice(STATUSES)
    if rng.random() < 0.5:
        row["amount"] = _random_amount(rng)
    if rng.random() < 0.1:
        row["customer_id"] = rng.randint(1, customers)
    if rng.random() < 0.3:
        row["Note"] = rng.choice(NOTES) if rng.random() < 0.7 else None
    row["updated_at"] = when
    return row


def generate(
    changes: int,
    keys: int,
    *,
    seed: int = 0,
    wrapped: bool = False,
    mix: OpMix | None = None,
    tombstones: bool = True,
    replica_identity_full: bool = False,
    server: str = "shop",
    db: str = "shop",
    table: str = ORDERS_TABLE,
    start: datetime = DEFAULT_START,
    start_lsn: int = DEFAULT_START_LSN,
    customers: int = 500,
) -> Workload:
    """``changes`` change events over ids ``1..keys``, and the live rows they leave behind.

    Each event is an insert of a key that is not live (a never-seen or a deleted one), an update of a live key
    or a delete of a live key, drawn by ``mix``. When every key is live an insert becomes an update, and when
    none is live an update or delete becomes an insert, so with few keys the mix drifts towards updates.
    ``customer_id`` is drawn from ``1..customers``: the groups of an aggregation.
    """
    if changes < 0 or keys < 1:
        raise ValueError("changes must be >= 0 and keys >= 1")
    mix = mix or OpMix()
    total = mix.insert + mix.update + mix.delete
    insert_below, update_below = mix.insert / total, (mix.insert + mix.update) / total
    rng = random.Random(seed)
    encoder = _Encoder(wrapped, server, db, table)
    live: dict[int, dict[str, Any]] = {}
    live_pool = _KeyPool()
    free_pool = _KeyPool(range(1, keys + 1))
    events: list[ChangeEvent] = []
    counts = {"c": 0, "u": 0, "d": 0, "tombstone": 0}
    lsn = start_lsn
    tx_id = 700
    micros = 0
    for _ in range(changes):
        roll = rng.random()
        if roll < insert_below:
            op = "c" if free_pool else "u"
        elif roll < update_below:
            op = "u" if live_pool else "c"
        else:
            op = "d" if live_pool else "c"
        prev_lsn = lsn
        lsn += rng.randint(8, 400)
        tx_id += rng.randint(1, 3)
        micros += rng.randint(1, 5_000_000)
        when = start + timedelta(microseconds=micros)
        ts_ms = (micros // 1000) + int(start.timestamp() * 1000)
        emitted_ms = ts_ms + rng.randint(1, 50)
        if op == "c":
            key_id = free_pool.choice(rng)
            free_pool.remove(key_id)
            live_pool.add(key_id)
            before, after = None, _random_row(rng, key_id, when, customers)
            live[key_id] = after
        elif op == "u":
            key_id = live_pool.choice(rng)
            old = live[key_id]
            before, after = (old if replica_identity_full else None), _updated_row(rng, old, when, customers)
            live[key_id] = after
        else:
            key_id = live_pool.choice(rng)
            live_pool.remove(key_id)
            free_pool.add(key_id)
            old = live.pop(key_id)
            before = old if replica_identity_full else {name: (key_id if name == "id" else None) for name in old}
            after = None
        key = encoder.key(key_id)
        value = encoder.change(
            op, before, after, lsn=lsn, prev_lsn=prev_lsn, tx_id=tx_id, ts_ms=ts_ms, emitted_ms=emitted_ms
        )
        events.append(ChangeEvent(key=key, value=value, id=key_id, op=op, lsn=lsn))
        counts[op] += 1
        if op == "d" and tombstones:
            events.append(ChangeEvent(key=key, value=None, id=key_id, op=None, lsn=None))
            counts["tombstone"] += 1
    expected = {key_id: dict(row) for key_id, row in live.items()}
    return Workload(
        events=events, expected=expected, counts=counts, wrapped=wrapped, keys=keys, seed=seed, last_lsn=lsn
    )


def malformed_events(*, wrapped: bool = False, first_id: int = 1_000_000_000, lsn: int = 1) -> list[ChangeEvent]:
    """Messages the decoder must dead-letter, keyed with ids from ``first_id`` (outside any :func:`generate`
    key range): bytes that are not UTF-8, text that is not JSON, a JSON array, a change without ``op`` and an
    insert whose ``customer_id`` is a string. None of them changes the expected state."""
    encoder = _Encoder(wrapped, "shop", "shop", ORDERS_TABLE)
    when = DEFAULT_START
    bad_row = {
        "id": first_id + 4,
        "customer_id": "not-a-number",
        "amount": Decimal("1.00"),
        "status": "new",
        "Note": None,
        "updated_at": when,
    }
    no_op = {
        "before": None,
        "after": encoder.row(_random_row(random.Random(0), first_id + 3, when)),
        "source": {"lsn": lsn, "ts_ms": 0},
        "ts_ms": 0,
    }
    return [
        ChangeEvent(encoder.key(first_id), b"\xff\xfe\x00 not utf-8", first_id, "malformed"),
        ChangeEvent(encoder.key(first_id + 1), b"this is not json {", first_id + 1, "malformed"),
        ChangeEvent(encoder.key(first_id + 2), b"[1, 2, 3]", first_id + 2, "malformed"),
        ChangeEvent(encoder.key(first_id + 3), encoder.value(no_op), first_id + 3, "malformed"),
        ChangeEvent(
            encoder.key(first_id + 4),
            encoder.change("c", None, bad_row, lsn=lsn, prev_lsn=lsn, tx_id=1, ts_ms=0, emitted_ms=0),
            first_id + 4,
            "malformed",
        ),
    ]


def stale_replays(workload: Workload, count: int, *, seed: int = 0) -> list[ChangeEvent]:
    """``count`` earlier changes of keys that changed again later, re-sent verbatim (same ``lsn``).

    Produced after the stream, they are older versions arriving after newer ones: a correct sink ignores them,
    so the expected state does not change."""
    last_index: dict[int, int] = {}
    for i, event in enumerate(workload.events):
        if event.value is not None:
            last_index[event.id] = i
    stale = [i for i, e in enumerate(workload.events) if e.value is not None and last_index[e.id] != i]
    rng = random.Random(seed)
    picked = rng.sample(stale, min(count, len(stale)))
    return [workload.events[i] for i in sorted(picked)]


# --------------------------------------------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------------------------------------------


def ensure_topic(
    bootstrap_servers: str, topic: str, partitions: int = 4, *, replication_factor: int = 1, timeout: float = 30.0
) -> bool:
    """Create ``topic`` with ``partitions`` partitions unless it exists; True when it was created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        metadata = admin.list_topics(timeout=timeout)  # no topic argument: must not trigger auto-creation
    except KafkaException as error:
        raise ServiceError(
            f"cannot reach Kafka at {bootstrap_servers}: {error.args[0]}",
            retriable=True,
            hint="start the dev stack with `cdcsync dev up`",
        ) from None
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None:
        return False
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)],
        operation_timeout=timeout,
    )
    try:
        futures[topic].result(timeout=timeout)
    except KafkaException as error:
        kafka_error = error.args[0]
        if kafka_error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise ServiceError(
            f"creating topic '{topic}' on {bootstrap_servers}: {kafka_error.str()}", retriable=kafka_error.retriable()
        ) from None
    return True


def produce(
    bootstrap_servers: str,
    topic: str,
    events: Iterable[ChangeEvent],
    partitions: int = 4,
    *,
    config: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
) -> int:
    """Send ``events`` in order, keyed (one partition per key, Java's murmur2 partitioner), creating ``topic``
    with ``partitions`` partitions first if it is absent. Returns the number of messages delivered; raises
    :class:`~cdcsync.core.errors.ServiceError` if any delivery fails or is still pending after ``timeout`` seconds."""
    from confluent_kafka import KafkaException, Producer

    ensure_topic(bootstrap_servers, topic, partitions, timeout=timeout)
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "linger.ms": 20,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 200_000,
        "partitioner": "murmur2_random",
        "enable.idempotence": True,  # retries keep per-key order
        "message.timeout.ms": int(timeout * 1000),
        "log_level": 3,  # transient warnings of a freshly started broker are retried; failures are raised below
    }
    settings.update(config or {})
    failures: list[str] = []
    delivered = 0

    def on_delivery(error: Any, message: Any) -> None:
        nonlocal delivered
        if error is not None:
            failures.append(error.str())
        else:
            delivered += 1

    producer = Producer(settings)
    sent = 0
    try:
        for event in events:
            while True:
                try:
                    producer.produce(topic, key=event.key, value=event.value, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.1)  # local queue full: let deliveries drain
            sent += 1
            if sent % 10_000 == 0:
                producer.poll(0)
        pending = producer.flush(timeout)
    except KafkaException as error:
        raise ServiceError(
            f"producing to topic '{topic}' on {bootstrap_servers}: {error.args[0]}", retriable=True
        ) from None
    if failures:
        raise ServiceError(
            f"producing to topic '{topic}' on {bootstrap_servers}: {len(failures)} of {sent} messages failed; "
            f"first error: {failures[0]}",
            retriable=True,
        )
    if pending:
        raise ServiceError(
            f"producing to topic '{topic}' on {bootstrap_servers}: {pending} of {sent} messages still undelivered "
            f"after {timeout:g}s",
            retriable=True,
        )
    return delivered


# --------------------------------------------------------------------------------------------------------------
# The same changes in Avro, as Debezium's AvroConverter writes them
# --------------------------------------------------------------------------------------------------------------

_OPTIONAL_LONG = ["null", "long"]
_OPTIONAL_STRING = ["null", "string"]
ORDERS_AVRO_KEY_SCHEMA = {
    "type": "record",
    "name": "Key",
    "namespace": "shop.public.orders",
    "fields": [{"name": "id", "type": "long"}],
    "connect.name": "shop.public.orders.Key",
}
_ORDERS_AVRO_ROW_SCHEMA = {
    "type": "record",
    "name": "Value",
    "namespace": "shop.public.orders",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer_id", "type": _OPTIONAL_LONG, "default": None},
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
        {"name": "status", "type": _OPTIONAL_STRING, "default": None},
        {"name": "Note", "type": _OPTIONAL_STRING, "default": None},
        {
            "name": "updated_at",
            "type": [
                "null",
                {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"},
            ],
            "default": None,
        },
    ],
    "connect.name": "shop.public.orders.Value",
}
ORDERS_AVRO_VALUE_SCHEMA = {
    "type": "record",
    "name": "Envelope",
    "namespace": "shop.public.orders",
    "fields": [
        {"name": "before", "type": ["null", _ORDERS_AVRO_ROW_SCHEMA], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.postgresql",
                "fields": [
                    {"name": "version", "type": "string"},
                    {"name": "connector", "type": "string"},
                    {"name": "name", "type": "string"},
                    {"name": "ts_ms", "type": "long"},
                    {"name": "snapshot", "type": _OPTIONAL_STRING, "default": None},
                    {"name": "db", "type": "string"},
                    {"name": "sequence", "type": _OPTIONAL_STRING, "default": None},
                    {"name": "schema", "type": "string"},
                    {"name": "table", "type": "string"},
                    {"name": "txId", "type": _OPTIONAL_LONG, "default": None},
                    {"name": "lsn", "type": _OPTIONAL_LONG, "default": None},
                    {"name": "xmin", "type": _OPTIONAL_LONG, "default": None},
                ],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": _OPTIONAL_LONG, "default": None},
        {"name": "transaction", "type": ["null", "string"], "default": None},
    ],
    "connect.name": "shop.public.orders.Envelope",
}


def to_avro(events: Sequence[ChangeEvent], key_id: int, value_id: int) -> list[ChangeEvent]:
    """Plain-payload (``wrapped=False``) events re-encoded as Debezium's AvroConverter writes them: the Confluent
    wire format (magic byte 0, the 4-byte schema id, the Avro body) with ``amount`` as Connect ``Decimal`` bytes
    (exact decimals kept). ``key_id`` / ``value_id`` are the ids of :data:`ORDERS_AVRO_KEY_SCHEMA` and
    :data:`ORDERS_AVRO_VALUE_SCHEMA` in the registry the consumer reads (:func:`register_avro_schemas`)."""
    import io

    import fastavro

    key_schema = fastavro.parse_schema(ORDERS_AVRO_KEY_SCHEMA)
    value_schema = fastavro.parse_schema(ORDERS_AVRO_VALUE_SCHEMA)

    def encode(schema_id: int, schema: Any, record: Any) -> bytes:
        out = io.BytesIO()
        out.write(b"\0" + schema_id.to_bytes(4, "big"))
        fastavro.schemaless_writer(out, schema, record)
        return out.getvalue()

    converted = []
    for event in events:
        key = encode(key_id, key_schema, json.loads(event.key)) if event.key is not None else None
        value = None
        if event.value is not None:
            payload = json.loads(event.value, parse_float=Decimal)
            payload["transaction"] = None
            value = encode(value_id, value_schema, payload)
        converted.append(ChangeEvent(key=key, value=value, id=event.id, op=event.op, lsn=event.lsn))
    return converted


def register_avro_schemas(registry_url: str, topic: str) -> tuple[int, int]:
    """Register the orders key and value schemas under ``<topic>-key`` / ``<topic>-value`` (Confluent's
    TopicNameStrategy, as the converter would); returns their ids for :func:`to_avro`."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    key_id = client.register_schema(f"{topic}-key", Schema(json.dumps(ORDERS_AVRO_KEY_SCHEMA), "AVRO"))
    value_id = client.register_schema(f"{topic}-value", Schema(json.dumps(ORDERS_AVRO_VALUE_SCHEMA), "AVRO"))
    return key_id, value_id


# --------------------------------------------------------------------------------------------------------------
# Without Kafka: what Spark's Kafka source would hand to the decoder
# --------------------------------------------------------------------------------------------------------------


def to_kafka_batch(
    events: Sequence[ChangeEvent],
    *,
    topic: str = "shop.public.orders",
    partitions: int = 4,
    start: datetime = DEFAULT_START,
) -> pa.RecordBatch:
    """An Arrow batch shaped like Spark's Kafka source rows (``key``, ``value``, ``topic``, ``partition``,
    ``offset``, ``timestamp``, ``timestampType``): keyed events go to ``crc32(key) % partitions`` and get
    consecutive offsets per partition, in stream order."""
    import pyarrow as pa

    next_offset = [0] * partitions
    part: list[int] = []
    offsets: list[int] = []
    base = int(start.timestamp() * 1_000_000)
    for event in events:
        p = zlib.crc32(event.key or b"") % partitions
        part.append(p)
        offsets.append(next_offset[p])
        next_offset[p] += 1
    return pa.RecordBatch.from_arrays(
        [
            pa.array([e.key for e in events], type=pa.binary()),
            pa.array([e.value for e in events], type=pa.binary()),
            pa.array([topic] * len(events), type=pa.string()),
            pa.array(part, type=pa.int32()),
            pa.array(offsets, type=pa.int64()),
            pa.array([base + 1000 * i for i in range(len(events))], type=pa.timestamp("us", tz="UTC")),
            pa.array([0] * len(events), type=pa.int32()),
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"],
    )


# --------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cdcsync.devstack.workload",
        description="Produce a synthetic Debezium changelog of an orders table to Kafka.",
    )
    parser.add_argument(
        "--bootstrap",
        default=None,
        help="Kafka bootstrap servers (default: from cdcsync settings: $CDCSYNC__KAFKA__BOOTSTRAP_SERVERS, "
        "cdcsync.yaml, else the dev stack's broker)",
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument("--changes", type=int, default=10_000, help="change events to produce")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct primary keys")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=4, help="partitions when the topic is created")
    parser.add_argument("--wrapped", action="store_true", help="JsonConverter schemas.enable=true envelopes")
    parser.add_argument("--no-tombstones", action="store_true", help="no tombstone after deletes")
    parser.add_argument("--malformed", action="store_true", help="also produce messages that must be dead-lettered")
    parser.add_argument("--replays", type=int, default=0, help="re-send N stale changes after the stream")
    args = parser.parse_args(argv)

    workload = generate(
        args.changes, args.keys, seed=args.seed, wrapped=args.wrapped, tombstones=not args.no_tombstones
    )
    events = list(workload.events)
    malformed = malformed_events(wrapped=args.wrapped) if args.malformed else []
    replays = stale_replays(workload, args.replays, seed=args.seed) if args.replays else []
    events += malformed + replays
    try:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from cdcsync.config.settings import load_settings

            bootstrap = load_settings().bootstrap_servers
        delivered = produce(bootstrap, args.topic, events, partitions=args.partitions)
    except CdcsyncError as error:
        print(f"error: {error}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return 1
    counts = workload.counts
    print(
        f"produced {delivered} messages to {args.topic}: {counts['c']} inserts, {counts['u']} updates, "
        f"{counts['d']} deletes, {counts['tombstone']} tombstones, {len(malformed)} malformed, "
        f"{len(replays)} stale replays; {len(workload.expected)} live keys expected"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
