"""The differential test of issue 3, in JSON and Avro: a source table with a column of every type Debezium's Postgres
connector maps to a logical type (NULLs included) gets a seeded random workload (a snapshot, inserts, updates,
primary-key changes, updates that leave a large TOASTed column untouched, deletes and one truncate); the real
connector publishes it (JsonConverter, or Apicurio's AvroConverter writing the Confluent wire format against the
dev stack's registry), ``cdcsync run --available-now`` mirrors it, and the mirror must equal the source.

The comparison is ``EXCEPT`` both ways in the source database: the mirror's rows, rendered as text by the mirror's
Postgres, are copied into a temporary table next to the source, whose rows are rendered by the same expressions.
The casts, and why each is needed (each is a loss on Debezium's side, documented in docs/types.md):

* ``time with time zone``: compared at UTC (``AT TIME ZONE 'UTC'``): Debezium's ZonedTime sends the time converted
  to UTC, so the original offset is gone (the instant is kept).
* ``numeric`` without precision: compared without trailing fractional zeros (``trim_scale``): Debezium sends
  ``1.10`` as the VariableScaleDecimal ``1.1`` (the value is exact, its display scale is not).
* ``bit varying``: compared without leading zeros (``ltrim(…, '0')``): Debezium's Bits bytes drop them.
* With ``time.precision.mode=connect``, times and timestamps are compared truncated to milliseconds: Connect's own
  Time and Timestamp types carry milliseconds only.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from tests.conftest import DebeziumSource
from tests.e2e.conftest import Project, assert_each_batch_once, sigkill_mid_stream

TABLE = "everything"

# Source column -> (source DDL type, declared pipeline type). Enums are declared as text.
COLUMNS: dict[str, tuple[str, str]] = {
    "id": ("bigint", "bigint"),
    "amount": ("numeric(12,2)", "numeric(12,2)"),  # Decimal bytes + scale
    "free": ("numeric", "numeric"),  # VariableScaleDecimal
    "day": ("date", "date"),
    "t0": ("time(0)", "time(0)"),  # adaptive: Time (milliseconds)
    "t6": ("time", "time"),  # MicroTime
    "ts3": ("timestamp(3)", "timestamp(3)"),  # adaptive: Timestamp (milliseconds)
    "ts6": ("timestamp", "timestamp"),  # MicroTimestamp
    "tstz": ("timestamptz", "timestamptz"),  # ZonedTimestamp
    "ttz": ("timetz", "timetz"),  # ZonedTime
    "doc": ("jsonb", "jsonb"),  # Json
    "js": ("json", "json"),  # Json, text kept as written
    "uid": ("uuid", "uuid"),  # Uuid
    "mood": ("mood", "text"),  # Enum
    "flags": ("bit(12)", "bit(12)"),  # Bits
    "vflags": ("varbit(20)", "bit varying(20)"),  # Bits
    "ints": ("integer[]", "integer[]"),
    "tags": ("text[]", "text[]"),
    "prices": ("numeric(10,2)[]", "numeric(10,2)[]"),
    "blob": ("bytea", "bytea"),
    "body": ("text", "text"),  # large: TOASTed
    "big_tags": ("text[]", "text[]"),  # large arrays: TOASTed too, placeholders of their own type
    "big_ints": ("bigint[]", "bigint[]"),
}
TEXTS = ["plain", "", "zoë ✓", 'quote "x"', "back\\slash", "comma, brace {}", "NULL", "line\nbreak"]


def render_columns(connect_mode: bool) -> list[sql.Composable]:
    """The text rendering of each column that both sides are compared by (see the module docstring)."""
    out: list[sql.Composable] = []
    for name in COLUMNS:
        column = sql.Identifier(name)
        if name == "ttz":
            expression = sql.SQL("({} AT TIME ZONE 'UTC')::text").format(column)
        elif name == "free":
            expression = sql.SQL("trim_scale({})::text").format(column)
        elif name == "vflags":
            expression = sql.SQL("ltrim({}::text, '0')").format(column)
        elif connect_mode and name in ("t0", "t6"):
            expression = sql.SQL("date_trunc('milliseconds', '2000-01-01'::date + {})::time::text").format(column)
        elif connect_mode and name in ("ts3", "ts6"):
            expression = sql.SQL("date_trunc('milliseconds', {})::text").format(column)
        else:
            expression = sql.SQL("{}::text").format(column)
        out.append(expression)
    return out


class Workload:
    """Seeded random changes in transactions of 1-4 statements; every column is NULL now and then."""

    def __init__(self, dsn: str, seed: int) -> None:
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.keys: set[int] = set()
        self.next_id = 1

    def value(self, name: str) -> Any:
        rng = self.rng
        if rng.random() < 0.12:
            return None
        if name == "amount":
            return Decimal(rng.randint(-9_999_999_999, 9_999_999_999)) / 100
        if name == "free":
            return Decimal(rng.randint(-(10**30), 10**30)).scaleb(-rng.randint(0, 12))
        if name == "day":
            return datetime(1970, 1, 1).date() + timedelta(days=rng.randint(0, 60_000))
        if name in ("t0", "t6"):
            micros = rng.randint(0, 86_400_000_000 - 1)
            value = (datetime(2000, 1, 1) + timedelta(microseconds=micros)).time()
            return value.replace(microsecond=0) if name == "t0" else value
        if name in ("ts3", "ts6", "tstz"):
            stamp = datetime(1971, 1, 1) + timedelta(microseconds=rng.randint(0, 2_000_000_000_000_000))
            if name == "ts3":
                return stamp.replace(microsecond=stamp.microsecond // 1000 * 1000)
            if name == "tstz":
                return stamp.replace(tzinfo=timezone(timedelta(minutes=rng.choice([-480, 0, 330, 765]))))
            return stamp
        if name == "ttz":
            micros = rng.randint(0, 86_400_000_000 - 1)
            clock = (datetime(2000, 1, 1) + timedelta(microseconds=micros)).time()
            return clock.isoformat() + rng.choice(["+00", "+02", "-05:30"])
        if name == "doc":
            return psycopg.types.json.Jsonb({"n": rng.randint(0, 99), "x": [1.50, "two"], "s": rng.choice(TEXTS)})
        if name == "js":
            return '{ "kept":  "as written", "n": 1.50 }'
        if name == "uid":
            return str(uuid.UUID(int=rng.getrandbits(128)))
        if name == "mood":
            return rng.choice(["sad", "ok", "happy"])
        if name == "flags":
            return "".join(rng.choice("01") for _ in range(12))
        if name == "vflags":
            return "".join(rng.choice("01") for _ in range(rng.randint(1, 20)))
        if name == "ints":
            return [None if rng.random() < 0.1 else rng.randint(-(2**31), 2**31 - 1) for _ in range(rng.randint(0, 5))]
        if name == "tags":
            return [None if rng.random() < 0.1 else rng.choice(TEXTS) for _ in range(rng.randint(0, 4))]
        if name == "prices":
            return [None if rng.random() < 0.1 else Decimal(rng.randint(-(10**9), 10**9)) / 100 for _ in range(3)]
        if name == "blob":
            return rng.randbytes(rng.randint(0, 40))
        if name == "body":  # mostly large and incompressible, so stored out of line
            return rng.randbytes(5000).hex() if rng.random() < 0.8 else rng.choice(TEXTS)
        if name == "big_tags":
            return [rng.randbytes(2500).hex(), rng.choice(TEXTS), None]
        if name == "big_ints":
            return [rng.randint(-(2**63), 2**63 - 1) for _ in range(rng.choice([3, 1500]))]
        raise AssertionError(name)

    def row(self) -> list[Any]:
        return [self.value(name) for name in list(COLUMNS)[1:]]

    def insert(self, conn: psycopg.Connection[Any]) -> None:
        key, self.next_id = self.next_id, self.next_id + 1
        placeholders = sql.SQL(", ").join(sql.Placeholder() * len(COLUMNS))
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES ({})").format(sql.Identifier(TABLE), placeholders), [key, *self.row()]
        )
        self.keys.add(key)

    def update(self, conn: psycopg.Connection[Any]) -> None:
        """Sets a few columns, never ``body`` unless chosen: the others arrive with ``body``'s placeholder."""
        key = self.rng.choice(sorted(self.keys))
        names = self.rng.sample(list(COLUMNS)[1:], self.rng.randint(1, 4))
        assignments = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(n)) for n in names)
        conn.execute(
            sql.SQL("UPDATE {} SET {} WHERE id = %s").format(sql.Identifier(TABLE), assignments),
            [*(self.value(n) for n in names), key],
        )

    def change_key(self, conn: psycopg.Connection[Any]) -> None:
        """Debezium publishes this as a delete of the old key, its tombstone and a create of the new one."""
        old, new = self.rng.choice(sorted(self.keys)), self.next_id
        self.next_id += 1
        # The new key's create event would carry placeholders for the large values if they stayed untouched, and
        # the mirror has no row under the new key to keep a value from (a known gap, see docs/types.md): rewrite them.
        conn.execute(
            sql.SQL(
                "UPDATE {} SET id = %s, body = body || '', big_tags = big_tags || '{{}}'::text[],"
                " big_ints = big_ints || '{{}}'::bigint[] WHERE id = %s"
            ).format(sql.Identifier(TABLE)),
            (new, old),
        )
        self.keys.discard(old)
        self.keys.add(new)

    def delete(self, conn: psycopg.Connection[Any]) -> None:
        key = self.rng.choice(sorted(self.keys))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(sql.Identifier(TABLE)), (key,))
        self.keys.discard(key)

    def run(self, transactions: int) -> None:
        with psycopg.connect(self.dsn) as conn:
            for _ in range(transactions):
                with conn.transaction():
                    for _ in range(self.rng.randint(1, 4)):
                        roll = self.rng.random()
                        if len(self.keys) < 3 or roll < 0.35:
                            self.insert(conn)
                        elif roll < 0.75:
                            self.update(conn)
                        elif roll < 0.85:
                            self.change_key(conn)
                        else:
                            self.delete(conn)

    def truncate(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
        self.keys.clear()


def rendered_rows(dsn: str, schema: str, connect_mode: bool) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(render_columns(connect_mode)), sql.Identifier(schema, TABLE)
    )
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        return conn.execute(query).fetchall()


def differences(
    source_dsn: str, mirror_dsn: str, connect_mode: bool, schema: str = "app"
) -> tuple[list[Any], list[Any]]:
    """(source rows missing from the mirror ``schema.everything``, mirror rows not in the source), by EXCEPT in the
    source database."""
    mirror = rendered_rows(mirror_dsn, schema, connect_mode)
    names = [sql.Identifier(f"c_{name}") for name in COLUMNS]
    rendered_source = sql.SQL("SELECT {} FROM public.{}").format(
        sql.SQL(", ").join(render_columns(connect_mode)), sql.Identifier(TABLE)
    )
    with psycopg.connect(source_dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute(
            sql.SQL("CREATE TEMP TABLE mirror_rows ({})").format(
                sql.SQL(", ").join(sql.SQL("{} text").format(n) for n in names)
            )
        )
        with conn.cursor().copy(sql.SQL("COPY mirror_rows FROM STDIN")) as copy:
            for row in mirror:
                copy.write_row(row)
        missing = conn.execute(sql.SQL("{} EXCEPT SELECT * FROM mirror_rows").format(rendered_source)).fetchall()
        extra = conn.execute(sql.SQL("SELECT * FROM mirror_rows EXCEPT {}").format(rendered_source)).fetchall()
    return missing, extra


def changed_rows(bootstrap: str, topic: str, registry_url: str | None) -> Iterator[dict[str, Any]]:
    """The ``after`` row of every change in the topic, read back from JSON or (``registry_url``) Avro."""
    import io

    import fastavro
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient

    registry = SchemaRegistryClient({"url": registry_url}) if registry_url else None
    writers: dict[int, Any] = {}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"types-{uuid.uuid4().hex[:8]}"})
    try:
        end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        position = 0
        while position < end:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, "the topic could not be read back"
            position = message.offset() + 1
            raw = message.value()
            if not raw:
                continue
            if registry is None:
                value = json.loads(raw)
                value = value.get("payload", value) if "schema" in value else value
            else:
                schema_id = int.from_bytes(raw[1:5], "big")
                if schema_id not in writers:
                    writers[schema_id] = fastavro.parse_schema(json.loads(registry.get_schema(schema_id).schema_str))
                value = fastavro.schemaless_reader(io.BytesIO(raw[5:]), writers[schema_id], None)
            if value.get("after"):
                yield value["after"]
    finally:
        consumer.close()


def placeholders_seen(bootstrap: str, topic: str, registry_url: str | None = None) -> set[str]:
    """Which columns carried Debezium's unavailable-value placeholder in the topic: proof the test exercised them."""
    marker = "__debezium_unavailable_value"
    forms: dict[str, Callable[[Any], bool]] = {
        "body": lambda value: value == marker,
        "big_tags": lambda value: value == [marker],
        "big_ints": lambda value: value == list(marker.encode()),
    }
    seen: set[str] = set()
    for row in changed_rows(bootstrap, topic, registry_url):
        seen |= {name for name, matches in forms.items() if matches(row.get(name))}
    return seen


def describe(missing: list[Any], extra: list[Any]) -> str:
    """The differing columns of rows that differ (values cut short: some are large), then keys only on one side."""
    names = list(COLUMNS)
    source_rows, mirror_rows = {row[0]: row for row in missing}, {row[0]: row for row in extra}
    lines = [f"{len(missing)} source rows not in the mirror, {len(extra)} mirror rows not in the source"]
    for key in sorted(source_rows.keys() & mirror_rows.keys(), key=int)[:5]:
        for name, ours, theirs in zip(names, source_rows[key], mirror_rows[key], strict=True):
            if ours != theirs:
                lines.append(f"id {key}, {name}: source {str(ours)[:80]!r} != mirror {str(theirs)[:80]!r}")
    lines.append(f"only in the source: {sorted(source_rows.keys() - mirror_rows.keys(), key=int)[:10]}")
    lines.append(f"only in the mirror: {sorted(mirror_rows.keys() - source_rows.keys(), key=int)[:10]}")
    return "\n".join(lines)


MODES: dict[str, tuple[str, dict[str, str]]] = {
    "json_precise_adaptive": ("json", {}),
    "json_string_connect": ("json", {"decimal.handling.mode": "string", "time.precision.mode": "connect"}),
    # bare payloads: the declared precision and time_precision_mode say the units
    "json_bare_string_adaptive": (
        "json",
        {
            "decimal.handling.mode": "string",
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
        },
    ),
    # Avro: Debezium's own logical types (adaptive) and Avro's date, time-millis, timestamp-millis and decimal
    # (connect); decimals precise in both, the one mode whose Avro form (bytes + scale) differs from JSON's.
    "avro_precise_adaptive": ("avro", {}),
    "avro_precise_connect": ("avro", {"time.precision.mode": "connect"}),
}
"""Connector modes (value format, connector settings), each captured by a connector of its own from the same
source table and workload, and mirrored by one ``cdcsync run`` into a schema of its own."""


KILLED_MODE = "json_precise_adaptive"
"""The mode read in micro-batches of 40 (about 450 messages, the others in one batch each), so that the run can be
SIGKILLed mid-stream."""


def test_every_debezium_type_mirrors_the_source_through_a_sigkill(
    make_project: Callable[[dict[str, Any]], Project],
    postgres_dsn: str,
    kafka_bootstrap: str,
    schema_registry_url: str,
    debezium_source: DebeziumSource,
) -> None:
    """Every mode's mirror equals the source after the real CLI, reading one mode in micro-batches of 40, was
    SIGKILLed at a random moment after that mode's first batch and run again; the ledger holds each batch once. One
    workload and two runs for both claims, to keep ``make test`` lean."""
    publish_workload(debezium_source, MODES, kafka_bootstrap, schema_registry_url)
    project = types_project(make_project, debezium_source, MODES, schema_registry_url, batched={KILLED_MODE: 40})
    killed = f"mirror_{KILLED_MODE}"
    killed_at = sigkill_mid_stream(project, postgres_dsn, "types", after_batches=1, sink=killed)
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    for mode, (_, modes) in MODES.items():
        connect_mode = modes.get("time.precision.mode") == "connect"
        missing, extra = differences(debezium_source.dsn, postgres_dsn, connect_mode, schema=mode)
        assert not missing and not extra, f"{mode}: {describe(missing, extra)}"
    assert_source_not_trivial(debezium_source.dsn)
    batches = assert_each_batch_once(postgres_dsn, "types", [f"mirror_{mode}" for mode in MODES])
    assert len(batches[killed]) > len(killed_at.get(killed, [])), "the kill came after the stream was drained"


def publish_workload(
    source: DebeziumSource,
    modes: dict[str, tuple[str, dict[str, str]]],
    bootstrap: str,
    registry_url: str,
) -> None:
    """The table of every type, its seeded workload around the connectors' start (one per entry of ``modes``,
    named by its key), and the edge cases for certain; returns once all of it is in Kafka, checking that every
    connector published the TOAST placeholders."""
    ddl = sql.SQL(", ").join(
        sql.SQL("{} " + ddl_type).format(sql.Identifier(n)) for n, (ddl_type, _) in COLUMNS.items()
    )
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        conn.execute(sql.SQL("CREATE TABLE public.{} ({}, PRIMARY KEY (id))").format(sql.Identifier(TABLE), ddl))
    workload = Workload(source.dsn, seed=31)
    workload.run(8)  # published as snapshot reads
    for mode, (value_format, overrides) in modes.items():
        source.capture(
            f"public.{TABLE}",
            overrides={"skipped.operations": "none", **overrides},
            value_format=value_format,
            connector=mode,
        )
    workload.run(60)
    workload.truncate()
    workload.run(60)
    with psycopg.connect(source.dsn, autocommit=True) as conn:  # the edge cases, for certain
        key = min(workload.keys)
        nulls = sql.SQL(", ").join(sql.SQL("{} = NULL").format(sql.Identifier(n)) for n in list(COLUMNS)[1:])
        conn.execute(sql.SQL("UPDATE {} SET {} WHERE id = %s").format(sql.Identifier(TABLE), nulls), (key,))
        # every large column stored out of line, then an update that leaves them untouched: each mode's topic then
        # has a placeholder of each kind whatever the seeded workload did around the connectors' start
        rng = random.Random(3)
        big, big_tags = rng.randbytes(6000).hex(), [rng.randbytes(2500).hex(), "x", None]
        big_ints = [rng.randint(-(2**63), 2**63 - 1) for _ in range(1500)]
        conn.execute(
            sql.SQL("UPDATE {} SET body = %s, big_tags = %s, big_ints = %s WHERE id = %s").format(
                sql.Identifier(TABLE)
            ),
            (big, big_tags, big_ints, key),
        )
        conn.execute(sql.SQL("UPDATE {} SET mood = 'ok' WHERE id = %s").format(sql.Identifier(TABLE)), (key,))
    source.wait_caught_up()
    expected = {"body", "big_tags", "big_ints"}
    for mode, (value_format, _) in modes.items():
        registry = registry_url if value_format == "avro" else None
        topic = source.topic(f"public.{TABLE}", mode)
        # Once in CI a topic read back just after the connectors had committed past the watermark lacked the
        # big_ints placeholder (the cause was not found): read again for a bounded while before deciding.
        deadline = time.monotonic() + 30
        while (seen := placeholders_seen(bootstrap, topic, registry)) != expected and time.monotonic() < deadline:
            time.sleep(1)
        assert seen == expected, f"{mode}: the topic has placeholders only for {sorted(seen)}"


def types_project(
    make_project: Callable[[dict[str, Any]], Project],
    source: DebeziumSource,
    modes: dict[str, tuple[str, dict[str, str]]],
    registry_url: str,
    *,
    batched: dict[str, int] | None = None,
) -> Project:
    """The pipeline mirroring the table as each mode's connector publishes it (:func:`publish_workload`) into
    the schema named by the mode, its migrations applied; the modes in ``batched`` are read that many messages
    per micro-batch."""
    sources, sinks = {}, {}
    for mode, (value_format, overrides) in modes.items():
        source_id = f"{TABLE}_{mode}"
        sources[source_id] = {
            "type": "kafka",
            "topic": source.topic(f"public.{TABLE}", mode),
            "format": value_format,
            "primary_key": "id",
            "columns": {name: declared for name, (_, declared) in COLUMNS.items()},
            "on_decode_error": "fail",
            "time_precision_mode": overrides.get("time.precision.mode", "adaptive"),
            "untoasted_columns": ["prices"],  # small: an array Debezium has no TOAST placeholder for
        }
        if mode in (batched or {}):
            sources[source_id]["max_offsets_per_trigger"] = (batched or {})[mode]
        sinks[f"mirror_{mode}"] = {"type": "postgres", "from": source_id, "schema": mode, "table": TABLE}
    project = make_project({"name": "types", "sources": sources, "sinks": sinks})
    project.env["CDCSYNC__SCHEMA_REGISTRY__URL"] = registry_url
    project.prepare()
    return project


def assert_source_not_trivial(source_dsn: str) -> None:
    with psycopg.connect(source_dsn) as conn:
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(TABLE))).fetchone()
    assert count is not None and count[0] > 10
