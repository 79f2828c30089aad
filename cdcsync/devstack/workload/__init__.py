"""Synthetic Debezium changelogs for ``make demo``, the end-to-end tests and the benchmarks.

:func:`generate` builds a deterministic (seeded) stream of change events for an ``orders`` table, as the Debezium
Postgres connector writes them through Kafka Connect's JsonConverter, together with the table's expected final
state; :class:`Changelog` yields the same events one at a time, for streams too long to hold. :func:`produce`
sends events to Kafka; :func:`malformed_events` and :func:`stale_replays` make the messages that the dead-letter
and replay tests need; :func:`to_kafka_batch` shapes events like Spark's Kafka source does, for tests and
benchmarks that decode without Spark; :func:`to_avro` re-encodes the plain-payload events in Avro (Confluent wire
format) with the schemas :func:`register_avro_schemas` puts in a registry.

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

Modules: :mod:`.events` (the table, the generator, the expected state), :mod:`.kafka` (producing, and Arrow
batches shaped like Spark's Kafka source), :mod:`.avro` (the same changes in Avro), :mod:`.cli`.

Run ``python -m cdcsync.devstack.workload --bootstrap HOST:PORT --topic shop.public.orders --changes N
--keys K --seed S`` to produce a stream and print its counts.
"""

from __future__ import annotations

from cdcsync.devstack.workload.avro import (
    ORDERS_AVRO_KEY_SCHEMA,
    ORDERS_AVRO_VALUE_SCHEMA,
    register_avro_schemas,
    to_avro,
)
from cdcsync.devstack.workload.cli import main
from cdcsync.devstack.workload.events import (
    AMOUNT_SCALE,
    DEFAULT_START,
    DEFAULT_START_LSN,
    NOTES,
    ORDERS_COLUMNS,
    ORDERS_PRIMARY_KEY,
    ORDERS_TABLE,
    STATUSES,
    ChangeEvent,
    Changelog,
    OpMix,
    Workload,
    decimal_bytes_b64,
    generate,
    malformed_events,
    revenue_by_customer,
    stale_replays,
    zoned_timestamp,
)
from cdcsync.devstack.workload.kafka import ensure_topic, produce, to_kafka_batch

__all__ = [
    "AMOUNT_SCALE",
    "DEFAULT_START",
    "DEFAULT_START_LSN",
    "NOTES",
    "ORDERS_AVRO_KEY_SCHEMA",
    "ORDERS_AVRO_VALUE_SCHEMA",
    "ORDERS_COLUMNS",
    "ORDERS_PRIMARY_KEY",
    "ORDERS_TABLE",
    "STATUSES",
    "ChangeEvent",
    "Changelog",
    "OpMix",
    "Workload",
    "decimal_bytes_b64",
    "ensure_topic",
    "generate",
    "main",
    "malformed_events",
    "produce",
    "register_avro_schemas",
    "revenue_by_customer",
    "stale_replays",
    "to_avro",
    "to_kafka_batch",
    "zoned_timestamp",
]
