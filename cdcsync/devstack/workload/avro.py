"""The same changes in Avro, as Debezium's AvroConverter writes them (Confluent wire format)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from cdcsync.devstack.workload.events import ChangeEvent

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
