"""The synthetic orders changelog itself: the table, the events as Debezium + JsonConverter write them, the
expected final state, and the malformed and stale messages the dead-letter and replay tests need."""

from __future__ import annotations

import base64
import json
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


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


def decimal_bytes_b64(value: Decimal, scale: int) -> str:
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
                out[name] = decimal_bytes_b64(value, AMOUNT_SCALE) if self.wrapped else f"\x01D{value}\x01"
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
    """``changes`` change events over ids ``1..keys``, and the live rows they leave behind, held in memory (see
    :class:`Changelog` for the rules, and for a stream too long to hold)."""
    log = Changelog(
        changes,
        keys,
        seed=seed,
        wrapped=wrapped,
        mix=mix,
        tombstones=tombstones,
        replica_identity_full=replica_identity_full,
        server=server,
        db=db,
        table=table,
        start=start,
        start_lsn=start_lsn,
        customers=customers,
    )
    events = list(log)
    return Workload(
        events=events,
        expected=log.expected,
        counts=log.counts,
        wrapped=wrapped,
        keys=keys,
        seed=seed,
        last_lsn=log.last_lsn,
    )


@dataclass
class Changelog:
    """The events of :func:`generate` one at a time, for streams too long to hold (the memory benchmark's 5M
    changes would take gigabytes as a list); :attr:`expected`, :attr:`counts` and :attr:`last_lsn` are filled
    once the iteration is exhausted, and each iteration generates the same events again.

    Each event is an insert of a key that is not live (a never-seen or a deleted one), an update of a live key
    or a delete of a live key, drawn by ``mix``. When every key is live an insert becomes an update, and when
    none is live an update or delete becomes an insert, so with few keys the mix drifts towards updates.
    ``customer_id`` is drawn from ``1..customers``: the groups of an aggregation.
    """

    changes: int
    keys: int
    seed: int = 0
    wrapped: bool = False
    mix: OpMix | None = None
    tombstones: bool = True
    replica_identity_full: bool = False
    server: str = "shop"
    db: str = "shop"
    table: str = ORDERS_TABLE
    start: datetime = DEFAULT_START
    start_lsn: int = DEFAULT_START_LSN
    customers: int = 500
    expected: dict[int, dict[str, Any]] = field(default_factory=dict, init=False)
    """Live rows after the whole stream (see :attr:`Workload.expected`); complete once the iteration ends."""
    counts: dict[str, int] = field(default_factory=dict, init=False)
    last_lsn: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.changes < 0 or self.keys < 1:
            raise ValueError("changes must be >= 0 and keys >= 1")

    def __iter__(self) -> Iterator[ChangeEvent]:
        mix = self.mix or OpMix()
        total = mix.insert + mix.update + mix.delete
        insert_below, update_below = mix.insert / total, (mix.insert + mix.update) / total
        rng = random.Random(self.seed)
        encoder = _Encoder(self.wrapped, self.server, self.db, self.table)
        start, customers, full = self.start, self.customers, self.replica_identity_full
        live: dict[int, dict[str, Any]] = {}
        live_pool = _KeyPool()
        free_pool = _KeyPool(range(1, self.keys + 1))
        counts = {"c": 0, "u": 0, "d": 0, "tombstone": 0}
        self.expected, self.counts = {}, counts
        lsn = self.start_lsn
        tx_id = 700
        micros = 0
        for _ in range(self.changes):
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
                before, after = (old if full else None), _updated_row(rng, old, when, customers)
                live[key_id] = after
            else:
                key_id = live_pool.choice(rng)
                live_pool.remove(key_id)
                free_pool.add(key_id)
                old = live.pop(key_id)
                before = old if full else {name: (key_id if name == "id" else None) for name in old}
                after = None
            key = encoder.key(key_id)
            value = encoder.change(
                op, before, after, lsn=lsn, prev_lsn=prev_lsn, tx_id=tx_id, ts_ms=ts_ms, emitted_ms=emitted_ms
            )
            yield ChangeEvent(key=key, value=value, id=key_id, op=op, lsn=lsn)
            counts[op] += 1
            if op == "d" and self.tombstones:
                yield ChangeEvent(key=key, value=None, id=key_id, op=None, lsn=None)
                counts["tombstone"] += 1
        self.expected = {key_id: dict(row) for key_id, row in live.items()}
        self.last_lsn = lsn


def revenue_by_customer(rows: dict[int, dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    """The demo's and the fault suite's aggregation over the live rows: (sum, count, max) of amount per customer,
    by SQL's rules: NULL amounts are ignored, all-NULL sums are NULL."""
    groups: dict[int, list[Any]] = {}
    for row in rows.values():
        total, count, largest = groups.setdefault(row["customer_id"], [None, 0, None])
        amount = row["amount"]
        if amount is not None:
            total = amount if total is None else total + amount
            largest = amount if largest is None else max(largest, amount)
        groups[row["customer_id"]] = [total, count + 1, largest]
    return {customer: tuple(values) for customer, values in groups.items()}


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
