"""Debezium JsonConverter messages, with and without schemas.

Both shapes are understood: ``{"schema": ..., "payload": ...}`` (``schemas.enable=true``; the schema's logical
type names and parameters decide how a value is read, e.g. the scale of a Connect ``Decimal``) and the bare payload
(``schemas.enable=false``; values are read by the declared Postgres type alone). Without the schema wrapper a
string in a ``numeric`` column is read as a decimal literal; Connect ``Decimal`` bytes (base64) need the wrapper
to know their scale, so run Debezium with ``decimal.handling.mode=string`` (or keep schemas enabled) when
schemas are off.

Speed: messages are parsed with orjson when it is installed (else the standard library), and the Connect schema
of a wrapped message is parsed once per distinct schema, not per message.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cdcsync.core.reports import Report
from cdcsync.sources.debezium.columnar import ColumnarJson
from cdcsync.sources.debezium.connect import row_fields, schema_change_of
from cdcsync.sources.debezium.plan import RowPlan
from cdcsync.sources.debezium.values import Ctx, Reparse, describe_json, fast_loads
from cdcsync.sources.debezium.wrappers import PAYLOAD_MARK, WRAPPED_PREFIX, WRAPPER_COLUMN, one_wrapper, restored

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.sources.debezium.spec import DecodeSpec

_SCHEMA_CACHE: dict[bytes, dict[str, Any]] = {}
_SCHEMA_CACHE_SIZE = 256
_RECENT_SCHEMAS: list[tuple[bytes, dict[str, Any]]] = []  # (b'{"schema":' + schema bytes, parsed), newest first
_RECENT_SCHEMAS_SIZE = 8


def _loads_exact(raw: bytes, what: str) -> tuple[Any, str | None]:
    """Parse with the standard library (exact Decimals for non-integers, NaN/Infinity literals accepted);
    returns (object, None) or (None, reason)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, f"{what} is not valid UTF-8 (byte 0x{raw[error.start]:02x} at position {error.start})"
    try:
        return json.loads(text, parse_float=Decimal), None
    except json.JSONDecodeError as error:
        return None, f"{what} is not JSON: {error.msg} at line {error.lineno} column {error.colno}"
    except ValueError as error:  # e.g. an integer with more digits than Python converts
        return None, f"{what} is not usable JSON: {error}"
    except RecursionError:
        return None, f"{what} is not usable JSON: nested too deeply"


def _loads(raw: bytes, what: str) -> tuple[Any, str | None]:
    try:
        return fast_loads(raw), None
    except Exception:  # invalid JSON, or a number the fast parser refuses: let the exact parser decide
        return _loads_exact(raw, what)


def _fast_wrapped(raw: bytes) -> tuple[dict[str, Any], Any] | None:
    """(schema, payload) of a compact ``{"schema":...,"payload":...}`` message (``raw`` starts with
    ``WRAPPED_PREFIX``), parsing each distinct schema once. None means: take the general path."""
    found = _wrapped_schema(raw)
    if found is None:
        return None
    schema, split = found
    try:
        payload = fast_loads(raw[split + 11 : -1])
    except Exception:
        return None
    return schema, payload


def _wrapped_schema(raw: bytes) -> tuple[dict[str, Any], int] | None:
    """(schema, where ``,"payload":`` starts) of a compact ``{"schema":...,"payload":...}`` message, or None.

    JsonConverter writes the schema first, byte-identical for every message of a table. A message that starts
    with the exact bytes of a schema seen before, followed by ``,"payload":``, has that schema (it is a complete
    JSON value, so it fixes the structure); that check is a memcmp. Otherwise the schema ends at the first
    ``,"payload":``: a false one inside the schema leaves an unbalanced prefix that does not parse."""
    if not raw.endswith(b"}"):
        return None
    schema: dict[str, Any] | None = None
    for prefix, known in _RECENT_SCHEMAS:
        if raw.startswith(prefix) and raw.startswith(PAYLOAD_MARK, len(prefix)):
            schema, split = known, len(prefix)
            break
    if schema is None:
        split = raw.find(PAYLOAD_MARK, 10)
        if split < 0:
            return None
        schema = _parsed_schema(raw[10:split])
        if schema is None:
            return None
        _RECENT_SCHEMAS.insert(0, (raw[:split], schema))
        del _RECENT_SCHEMAS[_RECENT_SCHEMAS_SIZE:]
    return schema, split


def _parsed_schema(schema_bytes: bytes) -> dict[str, Any] | None:
    """The Connect schema these bytes hold (parsed once per distinct bytes), or None if they hold no object."""
    cached = _SCHEMA_CACHE.get(schema_bytes)
    if cached is None:
        try:
            cached = fast_loads(schema_bytes)
        except Exception:
            return None
        if type(cached) is not dict:
            return None
        if len(_SCHEMA_CACHE) >= _SCHEMA_CACHE_SIZE:
            _SCHEMA_CACHE.clear()
        _SCHEMA_CACHE[schema_bytes] = cached
    return cached


def wrapper_prefix(message: bytes) -> bytes | None:
    """The wrapper (``{"schema":<schema>,"payload":``, :mod:`~cdcsync.sources.debezium.wrappers`) of a compact
    schema-wrapped message whose schema is a JSON object, else None: what the JVM may cut off later messages."""
    found = _wrapped_schema(message) if message.startswith(WRAPPED_PREFIX) else None
    return None if found is None else message[: found[1] + len(PAYLOAD_MARK)]


def _unwrap(document: Any, what: str) -> tuple[dict[str, Any] | None, dict[str, Any]] | str:
    """(schema or None, payload object) of a parsed message, or the reason it is not one."""
    if type(document) is not dict:
        return f"{what} is {describe_json(document)}, not a JSON object"
    if "schema" in document or "payload" in document:
        if "payload" not in document:
            return f"{what} has a 'schema' but no 'payload'"
        payload = document["payload"]
        schema = document.get("schema")
        if type(payload) is not dict:
            return f"{what} 'payload' is {describe_json(payload)}, not a JSON object"
        return (schema if type(schema) is dict else None), payload
    return None, document


def _payloads(
    values: pa.Array, wrapper: pa.Array | None = None
) -> tuple[dict[str, Any] | None, pa.Buffer, pa.Array | None] | None:
    """(the envelope schema or None, the messages' payloads one per line, the messages the row decoder must read
    alone or None) when every message is a ``{...}`` payload with the same schema wrapper (byte for byte) or none,
    else None. The checks and the slicing run in Arrow: no Python per message. ``wrapper``: the wrappers the JVM
    cut off (:mod:`.wrappers`); messages all cut with one are that one's payloads already."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not len(values):
        return None
    if values.type != pa.binary():
        try:
            values = values.cast(pa.binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    cut = one_wrapper(wrapper) if wrapper is not None else None
    if wrapper is not None and cut is None:
        values = restored(values, wrapper)
    first = values[0].as_py()
    schema = None
    if cut is not None:
        schema = _parsed_schema(cut[len(WRAPPED_PREFIX) : -len(PAYLOAD_MARK)])
        if schema is None:
            return None
    elif first.startswith(WRAPPED_PREFIX):
        found = _wrapped_schema(first)
        if found is None:
            return None
        schema, split = found
        try:
            prefix = first[: split + 11].decode()
        except UnicodeDecodeError:
            return None
        if not pc.all(pc.and_(pc.starts_with(values, prefix), pc.ends_with(values, "}"))).as_py():
            return None
        values = pc.binary_slice(values, split + 11, -1)
    elif pc.any(pc.starts_with(values, WRAPPED_PREFIX.decode())).as_py():
        return None
    # Each payload one object, one per line: a line of Arrow's reader can then not hold parts of two messages
    # (JSON strings hold no raw newline), and one holding two objects shows in the row count.
    if not pc.all(pc.and_(pc.starts_with(values, "{"), pc.ends_with(values, "}"))).as_py():
        return None
    lines = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values), b"\n")
    text = lines[0].as_py()
    # Arrow's JSON reader does not check UTF-8 (not even in the fields it skips); the row decoder dead-letters a
    # message that is not UTF-8. ASCII text is (one fast pass); other text, the cast to string checks.
    if not text.isascii():
        try:
            values.cast(pa.string())
        except pa.ArrowInvalid:
            return None
    alone: pa.Array | None = None
    if schema is None:
        # A top-level "schema" or "payload" key makes the row decoder read a wrapper. The batch path checks that
        # every plain payload's source block has a "schema" key, so one "schema" per payload must be that one.
        # Only an escape can spell their letters otherwise ("sch\u0065ma"), and only \u0061 to \u007a spell those:
        # a payload with one is the row decoder's (not one with Debezium's \u0001 for a control character), and
        # the count must then hold payload by payload.
        if b'"payload"' in text:
            return None
        if _has_unicode_escape(text):
            letters = pc.match_substring_regex(values, r"\\u00[67]")
            alone = pc.or_(letters, pc.not_equal(pc.count_substring(values, '"schema"'), 1))
        elif text.count(b'"schema"') != len(values):
            return None
    deep = _maybe_too_deep(values, text)
    if deep is not None:
        alone = deep if alone is None else pc.or_(alone, deep)
    return schema, pa.py_buffer(text), alone


def _has_unicode_escape(text: bytes) -> bool:
    """Whether ``text`` holds ``\\u``: the two bytes as one little-endian 16-bit word, at even and at odd offsets,
    compared by numpy: a ninth of the time ``in`` takes over Debezium's payloads (their positions are full of
    backslashes, which slow a substring search down)."""
    import numpy as np

    data = np.frombuffer(text, np.uint8)
    size = len(data)
    even = data[: size // 2 * 2].view("<u2")
    odd = data[1 : 1 + (size - 1) // 2 * 2].view("<u2")
    return bool((even == 0x755C).any() or (odd == 0x755C).any())


_MAX_NESTING = 512
"""Brackets a payload may hold and stay with the batch path. Arrow's JSON reader reads any depth; orjson stops at
1,024 levels and the standard library's parser (the row decoder's fallback) at the recursion limit, and the row
decoder dead-letters what they refuse. Depth needs as many ``{``/``[``, and closing ones: a short payload is safe."""


def _maybe_too_deep(values: pa.Array, text: bytes) -> pa.Array | None:
    """The payloads (one per line of ``text``) that hold :data:`_MAX_NESTING` brackets or more, or None if none.
    Only payloads twice that long are counted, so a batch of ordinary changes pays one pass over their lengths."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = pc.binary_length(values)
    if pc.max(lengths).as_py() < 2 * _MAX_NESTING:
        return None
    sizes = lengths.to_numpy(zero_copy_only=False).astype(np.int64)
    ends = np.cumsum(sizes + 1) - 1
    deep = np.zeros(len(sizes), dtype=bool)
    for i in np.flatnonzero(sizes >= 2 * _MAX_NESTING).tolist():
        start, end = int(ends[i] - sizes[i]), int(ends[i])
        deep[i] = text.count(b"{", start, end) + text.count(b"[", start, end) >= _MAX_NESTING
    return pa.array(deep) if deep.any() else None


class JsonPlan(RowPlan):
    """The plan of a ``format: json`` source: JsonConverter messages and keys into the generated row decoder."""

    def __init__(self, spec: DecodeSpec, *, batch_path: bool = True) -> None:
        """``batch_path=False`` decodes every message on its own (the tests compare the two paths)."""
        super().__init__(spec)
        self._schema_checks: dict[int, tuple[dict[str, Any], Report | None]] = {}
        # The batch path needs the key in the row: without a declared key every message's key is read.
        self._columnar = ColumnarJson(spec.columns, self.pk_index) if batch_path and self.pk_index is not None else None

    # ---- a whole batch ---------------------------------------------------------------------------------------

    def _decode_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch path (:mod:`~cdcsync.sources.debezium.columnar`) where it applies, else message by message."""
        if self._columnar is not None:
            decoded = self._decode_columnar(batch)
            if decoded is not None:
                return decoded
        return super()._decode_batch(batch)

    def _decode_columnar(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """The batch's messages with a value decoded together, the rest (tombstones, the messages the batch path
        leaves to the row decoder) message by message, in input order; None to decode it all message by message."""
        assert self._columnar is not None
        import pyarrow.compute as pc

        names = batch.schema.names
        value = batch.column(names.index("value"))
        present = pc.is_valid(value)
        changes = pc.indices_nonzero(present)
        wrapper = batch.column(names.index(WRAPPER_COLUMN)).filter(present) if WRAPPER_COLUMN in names else None
        split = _payloads(value.filter(present), wrapper)
        if split is None:
            return None
        schema, payloads, alone = split
        if schema is not None and self.spec.detect_schema_changes and self._schema_change(schema) is not None:
            return None

        def kafka_micros() -> pa.Array:
            return self.kafka_micros(batch).filter(present)

        columns = self._columnar.decode(payloads, len(changes), schema, kafka_micros)
        if columns is None:
            return None
        redo = columns.redo if alone is None else pc.or_(columns.redo, alone)
        return self.with_row_decoder(batch, changes, columns.arrays, redo)

    # ---- one message -----------------------------------------------------------------------------------------

    def decode_message(self, raw: bytes, key_raw: bytes | None) -> list[Any] | str | Report:
        schema: dict[str, Any] | None = None
        parts = _fast_wrapped(raw) if raw.startswith(WRAPPED_PREFIX) else None
        if parts is not None:
            schema, payload = parts
        else:
            try:
                payload = fast_loads(raw)
            except Exception:  # not JSON, or JSON the fast parser refuses: the exact parser decides
                return self._decode_exactly(raw, key_raw)
            if type(payload) is not dict or "schema" in payload or "payload" in payload:
                unwrapped = _unwrap(payload, "value")
                if isinstance(unwrapped, str):
                    return unwrapped
                schema, payload = unwrapped
        if type(payload) is not dict:
            return f"value 'payload' is {describe_json(payload)}, not a JSON object"
        if schema is not None and self.spec.detect_schema_changes:
            change = self._schema_change(schema)
            if change is not None:
                return change
        try:
            return self.decode_payload(payload, schema, raw, key_raw)
        except Reparse:
            return self._decode_exactly(raw, key_raw)

    def _schema_change(self, schema: dict[str, Any]) -> Report | None:
        """:func:`schema_change_of` for a message's envelope schema, once per distinct schema (the schema object
        is kept with its result, so its id cannot be reused while the entry lives)."""
        found = self._schema_checks.get(id(schema))
        if found is None or found[0] is not schema:
            fields = row_fields(schema)
            found = (schema, schema_change_of(self.spec, fields) if fields is not None else None)
            if len(self._schema_checks) >= _SCHEMA_CACHE_SIZE:
                self._schema_checks.clear()
            self._schema_checks[id(schema)] = found
        return found[1]

    def _decode_exactly(self, raw: bytes, key_raw: bytes | None) -> list[Any] | str | Report:
        """The slow path: the standard library parser, with exact Decimals for every non-integer number."""
        document, reason = _loads_exact(raw, "value")
        if reason is not None:
            return reason
        unwrapped = _unwrap(document, "value")
        if isinstance(unwrapped, str):
            return unwrapped
        schema, payload = unwrapped
        if schema is not None and self.spec.detect_schema_changes:
            change = self._schema_change(schema)
            if change is not None:
                return change
        try:
            return self.decode_payload(payload, schema, raw, key_raw)
        except Reparse:  # pragma: no cover - exact parsing yields no doubles
            return "value: a number could not be read exactly"

    # ---- the primary key -------------------------------------------------------------------------------------

    def read_key(self, key_raw: bytes | None, exact: bool) -> tuple[dict[str, Any], Ctx, str | None]:
        """A JsonConverter key, with or without its schema (which decides how its values are read)."""
        ctx: Ctx = (None, "", key_raw or b"")
        if key_raw is None:
            return {}, ctx, "message has no key"
        parts = _fast_wrapped(key_raw) if not exact and key_raw.startswith(WRAPPED_PREFIX) else None
        if parts is None:
            document, reason = _loads_exact(key_raw, "message key") if exact else _loads(key_raw, "message key")
            if reason is not None:
                return {}, ctx, reason
            if type(document) is dict and ("schema" in document or "payload" in document):
                parts = _unwrap(document, "message key")  # type: ignore[assignment]
                if type(parts) is str:
                    return {}, ctx, parts
            else:
                parts = None, document  # type: ignore[assignment]
        schema, key = parts  # type: ignore[misc]
        if type(key) is not dict:
            return {}, ctx, f"message key is {describe_json(key)}, not a JSON object of key columns"
        return key, (schema, "", key_raw), None
