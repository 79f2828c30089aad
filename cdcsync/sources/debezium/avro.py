"""Debezium change events in Avro: the Confluent wire format, read with each message's writer schema.

A message is ``0x00`` (magic byte), a 4-byte big-endian schema id, and the Avro binary body written with that
schema (fetched through :mod:`cdcsync.sources.debezium.avro_registry`). The output is exactly the JSON
decoder's (same columns, ``_cdc_*`` metadata and dead-letter rows), because the values end in the same per-type
converters: :mod:`cdcsync.sources.debezium.avro_values` turns each Avro value into what JsonConverter would have
written for it, then :class:`~cdcsync.sources.debezium.plan.RowPlan`'s generated row decoder does the rest.

* Each writer schema is read as written: a stream whose schema evolved (a column added with a default) decodes
  message by message with its own writer schema, and a declared column that a message's writer schema lacks is
  null, like a field missing from a JSON message. No reader schema is applied.
* Per-message failures are dead letters with a ``_dlq_reason``: a bad magic byte, a schema id the registry does
  not know, a body that does not decode with its writer schema (or leaves bytes over), a writer schema that is not
  Avro or uses references, and values that do not fit the declared type (the JSON decoder's own checks). Under
  ``on_decode_error: fail`` an unreachable registry stops the run through the usual decode-failure path; within
  one task the registry is not waited for twice: later unknown ids fail at once.
"""

from __future__ import annotations

import re
from io import BytesIO
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import DecodeError
from cdcsync.core.reports import Report, ReportedFailure, service_unavailable
from cdcsync.sources.debezium.avro_columnar import ColumnarAvro, KeyColumns, Unsupported
from cdcsync.sources.debezium.avro_registry import (
    MAX_REASON,
    NotFound,
    SchemaRegistryAccess,
    Unavailable,
    Writer,
    registry_client,
    writer_schema,
)
from cdcsync.sources.debezium.avro_schema import envelope_row_fields, record_fields
from cdcsync.sources.debezium.avro_values import Translate, translator
from cdcsync.sources.debezium.connect import schema_change_of
from cdcsync.sources.debezium.plan import RowPlan
from cdcsync.sources.debezium.values import Ctx, Reject, Reparse

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.sources.debezium.spec import DecodeSpec

WIRE_MAGIC = 0
_OBJECT_ADDRESS = re.compile(r"<[\w.]+ object at 0x[0-9a-f]+>")
HEADER_BYTES = 5


class _Reader:
    """Reads messages written with one writer schema and translates the declared columns of a record."""

    def __init__(self, writer: Writer, translators: list[tuple[str, Translate]]) -> None:
        from fastavro import schemaless_reader

        self.writer = writer
        self.translators = translators
        self._read = schemaless_reader

    def read(self, raw: bytes) -> Any:
        stream = BytesIO(raw)  # shares the bytes, no copy
        stream.seek(HEADER_BYTES)
        value = self._read(stream, self.writer.parsed, None)
        left = len(raw) - stream.tell()
        if left:
            raise ValueError(f"{left} bytes are left over after the record")
        return value

    def translate(self, row: dict[str, Any]) -> str | None:
        """Translate ``row``'s declared columns in place; a reason when one does not fit."""
        for name, translate in self.translators:
            value = row.get(name)
            if value is not None:
                try:
                    row[name] = translate(value)
                except Reject as error:
                    return f"column '{name}': {error}"
        return None


def _translators(spec: DecodeSpec, fields: dict[str, Any], writer: Writer, namespace: str) -> list[tuple[str, Any]]:
    found = []
    for name, pg in spec.columns:
        if name in fields:
            translate = translator(fields[name], pg, writer.names, namespace)
            if translate is not None:
                found.append((name, translate))
    return found


def _value_reader(spec: DecodeSpec, writer: Writer) -> _Reader:
    """The Debezium envelope: translators for the row record of ``after`` (``before`` has the same type)."""
    translators: list[tuple[str, Translate]] = []
    top = record_fields(writer.original, writer.names, "")
    if top is not None:
        envelope, namespace = top
        for struct_name in ("after", "before"):
            row = record_fields(envelope[struct_name], writer.names, namespace) if struct_name in envelope else None
            if row is not None:
                translators = _translators(spec, row[0], writer, row[1])
                break
    return _Reader(writer, translators)


def _key_reader(spec: DecodeSpec, writer: Writer) -> _Reader:
    top = record_fields(writer.original, writer.names, "")
    translators = _translators(spec, top[0], writer, top[1]) if top is not None else []
    return _Reader(writer, translators)


_AVRO_KINDS = {str: "string", int: "long", float: "double", bool: "boolean", bytes: "bytes", list: "array"}


def _wire_problem(raw: bytes, what: str) -> str | None:
    """Why ``raw`` is not a Confluent wire-format message, or None."""
    if len(raw) >= HEADER_BYTES and raw[0] == WIRE_MAGIC:
        return None
    if len(raw) < HEADER_BYTES:
        return (
            f"{what} is {len(raw)} bytes, too short for the Confluent Avro wire format "
            "(magic byte 0, 4-byte schema id, Avro body)"
        )
    if raw[0] == 1:
        return (
            f"{what} uses the Confluent wire format with a schema GUID (magic byte 1), which cdcsync does not read; "
            "configure the producer's serializer to write the schema id prefix (magic byte 0)"
        )
    if raw[:1] in (b"{", b"["):
        return f"{what} starts with {raw[:1].decode()!r}, not the Avro magic byte 0: it looks like JSON (format: json?)"
    return f"{what} starts with byte 0x{raw[0]:02x}, not the Confluent Avro magic byte 0x00"


class AvroPlan(RowPlan):
    """The plan of a ``format: avro`` source: Avro messages and keys, translated, into the generated row decoder.

    Cached per spec and executor process like the JSON plan; the per-task state (``begin_task``) makes one task
    wait for an unreachable registry at most once and ask again about unknown ids in the next task only."""

    def __init__(self, spec: DecodeSpec, *, batch_path: bool = True) -> None:
        """``batch_path=False`` decodes every message on its own (the tests compare the two paths)."""
        if spec.schema_registry is None:
            raise DecodeError(
                f"source '{spec.source_id}': format avro needs a schema registry",
                hint="set CDCSYNC__SCHEMA_REGISTRY__URL (the dev stack runs one: `cdcsync dev up`)",
            )
        super().__init__(spec)
        self.access: SchemaRegistryAccess = spec.schema_registry
        try:
            registry_client(self.access)  # checks the client configuration on the driver, before Spark starts
        except (ValueError, TypeError) as error:
            raise DecodeError(
                self.access.scrub(f"source '{spec.source_id}': schema registry settings: {error}"),
                hint="check CDCSYNC__SCHEMA_REGISTRY__URL and CDCSYNC__SCHEMA_REGISTRY__OPTIONS__*",
            ) from None
        self._values: dict[int, _Reader | str] = {}
        self._keys: dict[int, _Reader | str] = {}
        self._changes: dict[int, Report | None] = {}
        self._batch_path = batch_path
        self._columnar: dict[int, ColumnarAvro | None] = {}
        self._key_columnar: dict[int, tuple[list[int], KeyColumns] | None] = {}
        self.begin_task()

    def begin_task(self) -> None:
        """Unknown schema ids are asked again in each task."""
        self._task_failures: dict[int, str] = {}

    def _reader(self, raw: bytes, what: str) -> _Reader | str:
        schema_id = int.from_bytes(raw[1:HEADER_BYTES], "big")
        cache = self._values if what == "value" else self._keys
        found = cache.get(schema_id)
        if found is not None:
            return found
        if schema_id in self._task_failures:
            return self._task_failures[schema_id]
        try:
            writer = writer_schema(self.access, schema_id)
        except NotFound as error:
            self._task_failures[schema_id] = f"{what}: {error}"[:MAX_REASON]
            return self._task_failures[schema_id]
        except Unavailable as error:  # the registry's fault, not the message's: fail the task, dead-letter nothing
            raise ReportedFailure(service_unavailable(f"{what}: {error}"[:MAX_REASON])) from None
        if isinstance(writer, str):
            found = f"{what}: {writer}"[:MAX_REASON]
        else:
            found = _value_reader(self.spec, writer) if what == "value" else _key_reader(self.spec, writer)
        cache[schema_id] = found
        return found

    def _read(self, raw: bytes, what: str) -> tuple[Any, _Reader | None, str | None]:
        """(decoded Avro value, its reader, None) or (None, None, reason)."""
        problem = _wire_problem(raw, what)
        if problem is not None:
            return None, None, problem
        reader = self._reader(raw, what)
        if isinstance(reader, str):
            return None, None, reader
        try:
            return reader.read(raw), reader, None
        except Exception as error:
            # fastavro names the stream object (a memory address): the same message must give the same reason
            detail = _OBJECT_ADDRESS.sub(
                "the message", f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            )
            return (
                None,
                None,
                (
                    f"{what}: the Avro body does not decode with its writer schema id {reader.writer.schema_id} "
                    f"({reader.writer.name}): {detail}"
                )[:MAX_REASON],
            )

    # ---- a whole batch ---------------------------------------------------------------------------------------

    def _decode_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch path (:mod:`~cdcsync.sources.debezium.avro_columnar`) where it applies, else message by
        message."""
        decoded = self._decode_columnar(batch)
        return decoded if decoded is not None else super()._decode_batch(batch)

    def _decode_columnar(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """The messages written with the first message's writer schema decoded together, and the tombstones whose
        keys have the first tombstone's key schema; the rest (other schemas, what the batch path leaves to the
        row decoder) message by message, in input order. None to decode it all message by message. Without a
        declared primary key, every message's key columns come from its message key, read the same way."""
        import pyarrow.compute as pc

        pa = self.pa
        if not self._batch_path:
            return None
        names = batch.schema.names
        value = batch.column(names.index("value"))
        key = batch.column(names.index("key")) if "key" in names else pa.nulls(batch.num_rows, pa.binary())
        present = pc.is_valid(value)
        changes = pc.indices_nonzero(present)
        values = value.filter(present)
        found = self._first_schema(values, "value")
        if found is None:
            return None
        reader, other = found
        if self.spec.detect_schema_changes and self._writer_schema_change(reader.writer) is not None:
            return None
        columnar = self._columnar_for(reader)
        if columnar is None:
            return None

        def kafka_micros() -> Any:
            return self.kafka_micros(batch).filter(present)

        columns = columnar.decode(values, HEADER_BYTES, other, kafka_micros)
        if columns is None:
            return None
        arrays, redo = columns.arrays, columns.redo
        if self.pk_index is None:  # the message key's fields are the key columns, over the row's
            keys = self._key_columns(key.filter(present))
            if keys is None:
                return None
            for i, array in zip(*keys[:2], strict=True):
                arrays[i] = array
            redo = pc.or_(redo, keys[2])
        tombstones = self._tombstones(batch, key, present)
        if tombstones is None:
            return self.with_row_decoder(batch, changes, arrays, redo)
        rows, more, more_redo = tombstones
        return self.with_row_decoder(
            batch,
            pa.concat_arrays([changes, rows]),
            [pa.concat_arrays([a, b]) for a, b in zip(arrays, more, strict=True)],
            pa.concat_arrays([redo, more_redo]),
            ordered=False,
        )

    def _first_schema(self, messages: pa.Array, what: str) -> tuple[_Reader, Any] | None:
        """The reader of the first message's writer schema, and which messages have another, none, or are not in
        the wire format (the row decoder says why); None when the first has no usable one."""
        import numpy as np
        import pyarrow.compute as pc

        pa = self.pa
        if not messages.null_count < len(messages) or messages.type != pa.binary():
            return None
        first = messages.drop_null()[0].as_py()
        if _wire_problem(first, what) is not None:
            return None
        reader = self._reader(first, what)  # an unreachable registry fails the task here, as it would later
        if isinstance(reader, str):
            return None
        heads = pc.binary_slice(messages, 0, HEADER_BYTES)
        same = pc.fill_null(pc.equal(heads, pa.scalar(first[:HEADER_BYTES], pa.binary())), False)
        return reader, np.invert(same.to_numpy(zero_copy_only=False))

    def _key_columns(self, keys: pa.Array) -> tuple[list[int], list[pa.Array], pa.Array] | None:
        """(output column of each key column, the key columns, the rows to redo) of Avro message keys of the first
        key's writer schema: the declared primary key, or without one every field of the key; None to leave them
        to the row decoder."""
        found = self._first_schema(keys, "message key")
        if found is None:
            return None
        reader, other = found
        schema_id = reader.writer.schema_id
        if schema_id not in self._key_columnar:
            writer = reader.writer
            if self.pk_index is not None:
                chosen: list[int] | None = self.pk_index
            else:
                top = record_fields(writer.original, writer.names, "")
                fields = list(top[0]) if top is not None else []
                chosen = [self.index[f] for f in fields] if fields and all(f in self.index for f in fields) else None
            try:
                if chosen is None:
                    raise Unsupported("the message key's fields are not declared columns")
                columns = tuple(self.spec.columns[i] for i in chosen)
                self._key_columnar[schema_id] = (chosen, KeyColumns(columns, writer.original, writer.names))
            except Unsupported:
                self._key_columnar[schema_id] = None
        cached = self._key_columnar[schema_id]
        if cached is None:
            return None
        chosen, columnar = cached
        decoded = columnar.decode(keys, HEADER_BYTES, other, [self.row_types[i] for i in chosen])
        return None if decoded is None else (chosen, *decoded)

    def _tombstones(
        self, batch: pa.RecordBatch, key: pa.Array, present: pa.Array
    ) -> tuple[pa.Array, list[pa.Array], pa.Array] | None:
        """(input rows, output columns, rows to redo) of the batch's keyed tombstones, as
        :meth:`~cdcsync.sources.debezium.plan.RowPlan.decode_tombstone` makes them: a delete of the key, no
        version, the Kafka timestamp; None to leave them to it."""
        import pyarrow.compute as pc

        pa = self.pa
        keyed = pc.and_(pc.invert(present), pc.is_valid(key))
        rows = pc.indices_nonzero(keyed)
        if not len(rows):
            return None
        decoded = self._key_columns(key.filter(keyed))
        if decoded is None:
            return None
        chosen, keys, redo = decoded
        count = len(rows)
        arrays = [pa.nulls(count, t) for t in self.row_types]
        for i, array in zip(chosen, keys, strict=True):
            arrays[i] = array
        arrays[-3] = pa.array(["d"] * count, self.row_types[-3])
        arrays[-1] = self.kafka_micros(batch).take(rows).cast(self.row_types[-1])
        return rows, arrays, redo

    def _columnar_for(self, reader: _Reader) -> ColumnarAvro | None:
        """The batch path of a writer schema, once per schema id; None when it has none."""
        schema_id = reader.writer.schema_id
        if schema_id not in self._columnar:
            try:
                found: ColumnarAvro | None = ColumnarAvro(
                    self.spec.columns, self.pk_index or [], reader.writer.original, reader.writer.names, self.row_types
                )
            except Unsupported:
                found = None
            self._columnar[schema_id] = found
        return self._columnar[schema_id]

    # ---- one message -----------------------------------------------------------------------------------------

    def decode_message(self, raw: bytes, key_raw: bytes | None) -> list[Any] | str | Report:
        payload, reader, reason = self._read(raw, "value")
        if reason is not None:
            return reason
        assert reader is not None
        if type(payload) is not dict:
            return f"value is an Avro {_AVRO_KINDS.get(type(payload), 'value')}, not a Debezium envelope record"
        if self.spec.detect_schema_changes:
            change = self._writer_schema_change(reader.writer)
            if change is not None:
                return change
        row = payload.get("before" if payload.get("op") == "d" else "after")
        if type(row) is dict:
            reason = reader.translate(row)
            if reason is not None:
                return reason
        try:
            return self.decode_payload(payload, None, raw, key_raw)
        except Reparse:  # pragma: no cover - translation leaves no doubles where exact digits are needed
            return "value: a number could not be read exactly"

    def _writer_schema_change(self, writer: Writer) -> Report | None:
        """:func:`~cdcsync.sources.debezium.connect.schema_change_of` for a writer schema, once per schema id."""
        if writer.schema_id not in self._changes:
            fields = envelope_row_fields(writer.original, writer.names)
            self._changes[writer.schema_id] = schema_change_of(self.spec, fields) if fields is not None else None
        return self._changes[writer.schema_id]

    # ---- the primary key -------------------------------------------------------------------------------------

    def read_key(self, key_raw: bytes | None, exact: bool) -> tuple[dict[str, Any], Ctx, str | None]:
        """An Avro key record, its declared columns translated (the values need no second, exact reading)."""
        ctx: Ctx = (None, "", key_raw or b"")
        if key_raw is None:
            return {}, ctx, "message has no key"
        key, reader, reason = self._read(key_raw, "message key")
        if reason is not None:
            return {}, ctx, reason
        assert reader is not None
        if type(key) is not dict:
            return {}, ctx, f"message key is an Avro {_AVRO_KINDS.get(type(key), 'value')}, not a record of key columns"
        reason = reader.translate(key)
        if reason is not None:
            return {}, ctx, f"message key {reason}"
        return key, ctx, None
