"""Changes as Debezium change events: the key and value a Debezium Postgres connector would have written, so that
any Debezium consumer, and a downstream cdcsync source, reads a ``type: kafka`` sink's topic as a changelog.

Each column's Connect type comes from its Arrow type, with Debezium's defaults for Postgres
(``decimal.handling.mode=precise``, ``time.precision.mode=adaptive_time_microseconds``):

=================  ==========================================  ==============================================
Arrow              Connect (JSON schema / Avro)                 value
=================  ==========================================  ==============================================
int16/32/64        int16 / int32 / int64                        the number
float32/64         float / double                               the number
bool               boolean                                      the value
string             string                                       the text (uuid, json, time, interval ... too)
binary             bytes                                        base64 in JSON, bytes in Avro
decimal(p,s)       bytes ``org.apache.kafka.connect.data.Decimal``  unscaled two's complement (base64 in JSON); a
                                                                decimal string in JSON without schemas
date32             int32 ``io.debezium.time.Date``               days since 1970-01-01
timestamp (UTC)    string ``io.debezium.time.ZonedTimestamp``    ISO 8601 in UTC, ``...Z``
timestamp (naive)  int64 ``io.debezium.time.MicroTimestamp``     microseconds since 1970
list<T>            array of T                                   each element as above
=================  ==========================================  ==============================================

The value envelope is ``{before, after, source, op, ts_ms}``: a create, update or read has ``after``; a delete has
``before`` (the row as cdcsync holds it: the key columns, and whatever else the delete carried); a truncate has
neither and no key, like Debezium's. ``source.sequence`` is the change's ``_cdc_version`` unpacked into
Debezium's ``["<last commit LSN>","<LSN>"]`` (:func:`sequence_of`), so a downstream cdcsync source computes the
same ``_cdc_version`` again (:func:`cdcsync.sources.debezium.envelope.change_position`); ``ts_ms`` (both) is the
source commit time, ``_cdc_ts``, so that a replayed change is byte for byte the same message.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import SinkError
from cdcsync.sources.debezium.envelope import MAX_COMMIT, POSITION_BITS

if TYPE_CHECKING:
    import pyarrow as pa

CONNECTOR = "cdcsync"
"""``source.connector`` of every event (Debezium writes ``postgresql`` etc.)."""
OP_HEADER = "dbz.op"
"""The Kafka header holding the event's op (``c``, ``u``, ``d``, ``r``, ``t``), for consumers that route by it
without parsing the value."""
DECIMAL = "org.apache.kafka.connect.data.Decimal"
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_LSN_MASK = (1 << POSITION_BITS) - 1


@dataclass(frozen=True)
class Column:
    """One column's Connect schema (JSON-schema form and Avro form) and its value converters."""

    name: str
    connect: dict[str, Any]
    """Connect's JSON schema of the field, without ``field`` and ``optional``."""
    avro: Any
    """The Avro type, without the null branch."""
    to_json: Callable[[Any], Any]
    to_avro: Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _unscaled(value: decimal.Decimal, scale: int) -> bytes:
    unscaled = int(value.scaleb(scale).to_integral_value())
    return unscaled.to_bytes(max(1, (unscaled.bit_length() + 8) // 8), "big", signed=True)


def _zoned(micros_value: datetime.datetime) -> str:
    return micros_value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _micros(value: datetime.datetime) -> int:
    delta = value.replace(tzinfo=datetime.UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _days(value: datetime.date) -> int:
    return (value - datetime.date(1970, 1, 1)).days


def column_of(name: str, kind: pa.DataType, *, schemas: bool = True) -> Column:
    """The Connect form of an Arrow column; ``schemas`` false: JSON without schemas (decimals as text)."""
    import pyarrow as pa

    connect: dict[str, Any]
    avro: Any
    simple = (
        (pa.types.is_int16, "int16", {"type": "int", "connect.type": "int16"}),
        (pa.types.is_int32, "int32", "int"),
        (pa.types.is_int64, "int64", "long"),
        (pa.types.is_float32, "float", "float"),
        (pa.types.is_float64, "double", "double"),
        (pa.types.is_boolean, "boolean", "boolean"),
        (pa.types.is_string, "string", "string"),
        (pa.types.is_large_string, "string", "string"),
    )
    for test, connect_type, avro_type in simple:
        if test(kind):
            return Column(name, {"type": connect_type}, avro_type, _same, _same)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return Column(name, {"type": "bytes"}, "bytes", lambda v: base64.b64encode(v).decode("ascii"), _same)
    if pa.types.is_decimal(kind):
        scale, precision = kind.scale, kind.precision
        parameters = {"scale": str(scale), "connect.decimal.precision": str(precision)}
        avro = {
            "type": "bytes",
            "connect.version": 1,
            "connect.parameters": parameters,
            "connect.name": DECIMAL,
        }

        def in_json(value: decimal.Decimal) -> str:
            return base64.b64encode(_unscaled(value, scale)).decode("ascii") if schemas else str(value)

        connect = {"type": "bytes", "name": DECIMAL, "version": 1, "parameters": parameters}
        return Column(name, connect, avro, in_json, lambda value: _unscaled(value, scale))
    if pa.types.is_date32(kind):
        connect = {"type": "int32", "name": "io.debezium.time.Date", "version": 1}
        avro = {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}
        return Column(name, connect, avro, _days, _days)
    if pa.types.is_timestamp(kind) and kind.tz is not None:
        connect = {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1}
        avro = {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"}
        return Column(name, connect, avro, _zoned, _zoned)
    if pa.types.is_timestamp(kind):
        connect = {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}
        avro = {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}
        return Column(name, connect, avro, _micros, _micros)
    if pa.types.is_list(kind):
        item = column_of(name, kind.value_type, schemas=schemas)
        connect = {"type": "array", "items": {**item.connect, "optional": True}}
        avro = {"type": "array", "items": ["null", item.avro]}

        def each(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
            return lambda values: [None if v is None else convert(v) for v in values]

        return Column(name, connect, avro, each(item.to_json), each(item.to_avro))
    raise SinkError(f"column '{name}': Arrow type {kind} has no Debezium counterpart in the kafka sink")


def sequence_of(version: int | None, op: str) -> str | None:
    """``source.sequence`` that makes a downstream source compute ``version`` again, or None where Debezium's form
    cannot say it (a version from a Kafka offset of 0; then the downstream falls back to its own offsets)."""
    if version is None:
        return None
    commit, lsn = version >> POSITION_BITS, version & _LSN_MASK
    if commit > MAX_COMMIT:
        return None
    if op == "r":  # a snapshot read: (commit, 0) or (0, S); else it ranks like a streamed change (see snapshot_of)
        if lsn == 0:
            return f'["{commit}","1"]' if commit > 0 else None
        if commit == 0:
            return f'[null,"{lsn}"]'
    if commit == 0 or lsn == 0:
        return None
    return f'["{commit}","{lsn}"]'


def snapshot_of(version: int | None, op: str) -> str:
    """``source.snapshot``: ``true`` for a read ranked as a snapshot read, ``incremental`` for one that ranks
    like a streamed change (its version has both parts), ``false`` for changes."""
    if op != "r":
        return "false"
    if version is not None and version >> POSITION_BITS and version & _LSN_MASK:
        return "incremental"
    return "true"


SOURCE_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("version", "string", False),
    ("connector", "string", False),
    ("name", "string", False),
    ("ts_ms", "int64", False),
    ("snapshot", "string", True),
    ("db", "string", False),
    ("table", "string", True),
    ("sequence", "string", True),
)
"""``source`` block fields: name, Connect type, optional. ``name`` is the pipeline, ``db`` the sink id and
``table`` the sink's input (a source or transform id)."""

_AVRO_OF = {"string": "string", "int64": "long"}


def avro_name(topic: str) -> str:
    """The Avro namespace for a topic's records: the topic, each dot-separated part made a valid Avro name."""
    parts = [re.sub(r"[^A-Za-z0-9_]", "_", part) or "_" for part in topic.split(".")]
    return ".".join(f"_{part}" if part[0].isdigit() else part for part in parts)


@dataclass(frozen=True)
class EventShape:
    """The key and value schemas of one sink's events for one Arrow schema of its input, and the events."""

    topic: str
    key: tuple[Column, ...]
    columns: tuple[Column, ...]
    schemas: bool
    """JSON only: wrap as ``{"schema", "payload"}``."""
    source_base: tuple[tuple[str, str], ...]
    """``version``, ``connector``, ``name``, ``db``, ``table`` of the source block."""

    @classmethod
    def of(
        cls,
        arrow_schema: pa.Schema,
        key: tuple[str, ...],
        *,
        topic: str,
        pipeline: str,
        sink_id: str,
        input_id: str,
        schemas: bool = True,
    ) -> EventShape:
        from cdcsync import __version__

        business = [field for field in arrow_schema if not field.name.startswith("_cdc_")]
        columns = tuple(column_of(field.name, field.type, schemas=schemas) for field in business)
        by_name = {column.name: column for column in columns}
        missing = [name for name in key if name not in by_name]
        if missing:
            raise SinkError(f"sink '{sink_id}': key column(s) {', '.join(missing)} are not in its input")
        base = (
            ("version", __version__),
            ("connector", CONNECTOR),
            ("name", pipeline),
            ("db", sink_id),
            ("table", input_id),
        )
        return cls(topic, tuple(by_name[name] for name in key), columns, schemas, base)

    # ---- schemas ----------------------------------------------------------------------------------------------

    def connect_key_schema(self) -> dict[str, Any]:
        fields = [{**column.connect, "optional": False, "field": column.name} for column in self.key]
        return {"type": "struct", "name": f"{self.topic}.Key", "optional": False, "fields": fields}

    def connect_value_schema(self) -> dict[str, Any]:
        row = {
            "type": "struct",
            "name": f"{self.topic}.Value",
            "optional": True,
            "fields": [{**column.connect, "optional": True, "field": column.name} for column in self.columns],
        }
        source = {
            "type": "struct",
            "name": "io.cdcsync.Source",
            "optional": False,
            "fields": [{"type": kind, "optional": optional, "field": name} for name, kind, optional in SOURCE_FIELDS],
        }
        return {
            "type": "struct",
            "name": f"{self.topic}.Envelope",
            "optional": False,
            "fields": [
                {**row, "field": "before"},
                {**row, "field": "after"},
                {**source, "field": "source"},
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
            ],
        }

    def avro_key_schema(self) -> dict[str, Any]:
        return {
            "type": "record",
            "name": "Key",
            "namespace": avro_name(self.topic),
            "fields": [{"name": column.name, "type": column.avro} for column in self.key],
            "connect.name": f"{self.topic}.Key",
        }

    def avro_value_schema(self) -> dict[str, Any]:
        namespace = avro_name(self.topic)
        row = {
            "type": "record",
            "name": "Value",
            "fields": [{"name": c.name, "type": ["null", c.avro], "default": None} for c in self.columns],
            "connect.name": f"{self.topic}.Value",
        }
        source_fields = [
            {"name": name, "type": ["null", _AVRO_OF[kind]], "default": None}
            if optional
            else {"name": name, "type": _AVRO_OF[kind]}
            for name, kind, optional in SOURCE_FIELDS
        ]
        return {
            "type": "record",
            "name": "Envelope",
            "namespace": namespace,
            "fields": [
                {"name": "before", "type": ["null", row], "default": None},
                {"name": "after", "type": ["null", "Value"], "default": None},
                {
                    "name": "source",
                    "type": {
                        "type": "record",
                        "name": "Source",
                        "namespace": "io.cdcsync",
                        "fields": source_fields,
                        "connect.name": "io.cdcsync.Source",
                    },
                },
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None},
            ],
            "connect.name": f"{self.topic}.Envelope",
        }

    # ---- events -----------------------------------------------------------------------------------------------

    def events(
        self, table: pa.Table, tombstones: bool, *, avro: bool = False
    ) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None, str]]:
        """(key, value, op) of each message for ``table``, in row order, values converted for JSON (or Avro).

        With ``tombstones``, a delete is followed by a tombstone (value None), as Debezium's
        ``tombstones.on.delete``; a tombstone the source read (a delete without a version,
        :mod:`cdcsync.sinks.tombstones`) stays a tombstone, not a delete event without a position."""
        import pyarrow as pa

        convert = {c.name: (c.to_avro if avro else c.to_json) for c in self.columns}
        values = {name: table.column(name).to_pylist() for name in convert}
        ops = table.column("_cdc_op").to_pylist()
        versions = table.column("_cdc_version").to_pylist()
        stamps = table.column("_cdc_ts").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
        key_names = [c.name for c in self.key]
        events: list[tuple[dict[str, Any] | None, dict[str, Any] | None, str]] = []
        for index, op in enumerate(ops):
            version = None if versions[index] is None else int(versions[index])
            ts_ms = None if stamps[index] is None else stamps[index] // 1000
            row = {}
            for name, to in convert.items():
                value = values[name][index]
                row[name] = None if value is None else to(value)
            key = None if op == "t" else {name: row[name] for name in key_names}
            if op == "d" and version is None:  # a tombstone the source read
                if tombstones and not (events and events[-1][1] is None and events[-1][0] == key):
                    events.append((key, None, op))
                continue
            source = {
                **dict(self.source_base),
                "ts_ms": ts_ms or 0,
                "snapshot": snapshot_of(version, op),
                "sequence": sequence_of(version, op),
            }
            before, after = (row, None) if op == "d" else (None, None) if op == "t" else (None, row)
            events.append((key, {"before": before, "after": after, "source": source, "op": op, "ts_ms": ts_ms}, op))
            if op == "d" and tombstones:
                events.append((key, None, op))
        return events

    def json_messages(self, table: pa.Table, tombstones: bool) -> list[tuple[bytes | None, bytes | None, str]]:
        """(key, value, op) of each Kafka message for ``table`` (see :meth:`events`): JsonConverter's bytes."""
        import orjson

        key_schema = self.connect_key_schema() if self.schemas else None
        value_schema = self.connect_value_schema() if self.schemas else None

        def dump(schema: dict[str, Any] | None, payload: Any) -> bytes:
            return orjson.dumps({"schema": schema, "payload": payload} if schema is not None else payload)

        return [
            (None if key is None else dump(key_schema, key), None if value is None else dump(value_schema, value), op)
            for key, value, op in self.events(table, tombstones)
        ]

    def avro_messages(
        self, table: pa.Table, tombstones: bool, key_id: int, value_id: int
    ) -> list[tuple[bytes | None, bytes | None, str]]:
        """As :meth:`json_messages`, in the Confluent wire format (magic byte, schema id, Avro binary)."""
        import fastavro

        key_writer = _avro_writer(fastavro.parse_schema(self.avro_key_schema()), key_id)
        value_writer = _avro_writer(fastavro.parse_schema(self.avro_value_schema()), value_id)
        return [
            (None if key is None else key_writer(key), None if value is None else value_writer(value), op)
            for key, value, op in self.events(table, tombstones, avro=True)
        ]


def _avro_writer(parsed: Any, schema_id: int) -> Callable[[dict[str, Any]], bytes]:
    import io

    import fastavro

    header = b"\x00" + schema_id.to_bytes(4, "big")

    def write(record: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        out.write(header)
        fastavro.schemaless_writer(out, parsed, record)
        return out.getvalue()

    return write
