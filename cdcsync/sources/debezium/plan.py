"""One spec's decoding plan: the converters, a generated row decoder, and the assembly of output batches.

:class:`RowPlan` is what both formats share; :class:`~cdcsync.sources.debezium.json.JsonPlan` and
:class:`~cdcsync.sources.debezium.avro.AvroPlan` read their messages into Debezium payloads and keys and hand
them to the generated decoder. Plans are cached per spec and executor process
(:func:`cdcsync.sources.debezium.dispatch.plan_for`).

Speed (``benchmarks/decode.py``): each spec gets a generated row decoder with the common cases inlined; decimals
travel as unscaled integers into ``decimal128``; the cyclic garbage collector is paused while a batch is decoded.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import DecodeError
from cdcsync.core.names import KEY_MOVE_OP
from cdcsync.core.reports import Report, ReportedFailure, undecodable
from cdcsync.sources.debezium.converters import converter_for
from cdcsync.sources.debezium.envelope import (
    NEW_KEY_COLUMN,
    PAYLOAD_HEAD,
    PAYLOAD_TAIL,
    envelope_namespace,
    offset_version,
)
from cdcsync.sources.debezium.spec import output_arrow_schema
from cdcsync.sources.debezium.values import (
    INT_RANGES,
    MAX_US,
    MIN_US,
    Ctx,
    Reject,
    Reparse,
    unscaled_decimals,
)
from cdcsync.sources.debezium.wrappers import restored_batch

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.sources.debezium.spec import DecodeSpec

# Inline tests for values that are already what the output column holds, so that the common case costs no
# function call; everything else goes through the column's converter.
_INLINE_CHECKS: dict[str, str] = {
    "double precision": "type({v}) is float",
    "boolean": "{v} is True or {v} is False",
    "text": 'type({v}) is str and "\\x00" not in {v}',
}


def compile_payload_decoder(plan: RowPlan) -> Callable[[dict[str, Any], Any, bytes, Any], list[Any] | str]:
    """Generate ``decode_payload(payload, schema, raw, key_raw) -> row list | reason`` for one spec.

    The per-column loop is unrolled and the common already-right values (an in-range int for an integer
    column, a str for text, ...) are accepted inline, which saves a loop step and a function call per column
    and message. Column names only ever appear as ``repr`` literals, so any name is safe. The envelope around
    the columns (``op``, the ``source`` block) is :mod:`cdcsync.sources.debezium.envelope`'s."""
    namespace: dict[str, Any] = {
        **envelope_namespace(),
        "Reject": Reject,
        "key_from_message": plan.key_from_message,
        "key_fallback": plan.key_fallback,
    }
    lines = [PAYLOAD_HEAD.strip("\n")]
    for i, ((name, pg), convert) in enumerate(zip(plan.spec.columns, plan.converters, strict=True)):
        v = f"v{i}"
        namespace[f"c{i}"] = convert
        namespace[f"m{i}"] = f"column '{name}': "
        if pg.name in INT_RANGES:
            bound = INT_RANGES[pg.name]
            check: str | None = f"type({v}) is int and {-bound} <= {v} <= {bound - 1}"
        elif pg.name == "character varying" and not pg.args:
            check = _INLINE_CHECKS["text"].format(v=v)
        else:
            template = _INLINE_CHECKS.get(pg.name)
            check = template.format(v=v) if template else None
        lines.append(f"    {v} = row.get({name!r})")
        lines.append(f"    if {v} is not None" + (f" and not ({check}):" if check else ":"))
        lines += [
            "        try:",
            f"            {v} = c{i}({v}, ctx)",
            "        except Reject as error:",
            f"            return m{i} + str(error)",
        ]
    lines.append("    values = [" + ", ".join(f"v{i}" for i in range(len(plan.names))) + "]")
    if plan.pk_index is None:
        lines += [
            "    reason = key_from_message(values, key_raw)",
            "    if reason is not None:",
            "        return reason",
        ]
    else:
        lines += [
            "    if " + " or ".join(f"v{i} is None" for i in plan.pk_index) + ":",
            "        reason = key_fallback(values, key_raw)",
            "        if reason is not None:",
            "            return reason",
        ]
    source = "\n".join(lines) + "\n" + PAYLOAD_TAIL
    # A truncate (op 't') has no row and no key: every business column is null; the sinks apply it by version.
    source += f"\ndef decode_truncate(payload):\n    op = 't'\n    values = [None] * {len(plan.names)}\n"
    source += PAYLOAD_TAIL
    exec(compile(source, f"<cdcsync decoder for source {plan.spec.source_id!r}>", "exec"), namespace)
    return namespace["decode_payload"]


class RowPlan:
    """Per-spec precomputation: converters, key handling and output types. A format's plan reads its messages
    (:meth:`decode_message`) and message keys (:meth:`read_key`); the rest is shared."""

    def __init__(self, spec: DecodeSpec) -> None:
        import pyarrow as pa

        self.spec = spec
        self.names = [name for name, _ in spec.columns]
        if len(set(self.names)) != len(self.names):
            raise DecodeError(f"source '{spec.source_id}': a column is declared twice")
        self.index = {name: i for i, name in enumerate(self.names)}
        time_mode = spec.time_precision_mode if spec.format == "json" else None  # Avro values arrive scaled
        self.converters = [converter_for(name, pg, spec.source_id, time_mode) for name, pg in spec.columns]
        if spec.primary_key is not None:
            missing = [k for k in spec.primary_key if k not in self.index]
            if missing:
                raise DecodeError(f"source '{spec.source_id}': primary key column '{missing[0]}' is not declared")
            self.pk_index: list[int] | None = [self.index[k] for k in spec.primary_key]
        else:
            self.pk_index = None
        self.schema = output_arrow_schema(spec)
        width = len(self.names) + 3  # business columns, then _cdc_op, _cdc_version, _cdc_ts
        self.row_types = [self.schema.field(i).type for i in range(width)]
        self.null_row = [None] * width
        self.pa = pa
        self.decode_payload = compile_payload_decoder(self)

    def begin_task(self) -> None:
        """Called at the start of each Spark task (one :func:`~cdcsync.sources.debezium.dispatch.decode_batches`
        call), for per-task state."""

    def decode_message(self, raw: bytes, key_raw: bytes | None) -> list[Any] | str | Report:
        """One message: the output row, a dead-letter reason, or a report that stops the batch."""
        raise NotImplementedError

    def read_key(self, key_raw: bytes | None, exact: bool) -> tuple[dict[str, Any], Ctx, str | None]:
        """(the message key's fields, the context their converters get, None), or ({}, ctx, why not). ``exact``
        is the second attempt, after a converter asked for the exact text of a number (:class:`Reparse`)."""
        raise NotImplementedError

    def decode_tombstone(self, key_raw: bytes | None) -> list[Any] | str:
        """A tombstone (a null value: Debezium's second message for a delete, the one that log compaction keeps)
        as a delete of its key, with no version: it carries no source block. Its rank comes from the key's other
        changes (:func:`cdcsync.sinks.tombstones.rank_tombstones`). A key that does not give the source's primary
        key (a declared key outside the message key) is no dead letter: the tombstone is skipped."""
        values: list[Any] = [None] * len(self.names)
        reason = self.key_from_message(values, key_raw) if self.pk_index is None else self.key_fallback(values, key_raw)
        if reason is not None:
            return f"tombstone: {reason}"
        return [*values, "d", None, None]

    def _key_move(self, new_key_raw: bytes, delete: list[Any]) -> list[Any] | None:
        """The key-move row (:data:`~cdcsync.core.names.KEY_MOVE_OP`) of ``delete`` (a decoded
        delete whose message names the new key); None when that key does not give the primary key (the pairing
        then falls back to what the batch shows, as without the header)."""
        values: list[Any] = [None] * len(self.names)
        reason = (
            self.key_from_message(values, new_key_raw)
            if self.pk_index is None
            else self.key_fallback(values, new_key_raw)
        )
        if reason is not None:
            return None
        return [*values, KEY_MOVE_OP, delete[-2], delete[-1]]

    # ---- the primary key -------------------------------------------------------------------------------------

    def key_fallback(self, values: list[Any], key_raw: bytes | None) -> str | None:
        """Fill the null declared key columns of ``values`` from the message key; a dead-letter reason if not."""
        try:
            return self._key_fallback(values, key_raw, exact=False)
        except Reparse:
            return self._key_fallback(values, key_raw, exact=True)

    def key_from_message(self, values: list[Any], key_raw: bytes | None) -> str | None:
        """No declared primary key: the message key's fields are the key columns and override the row's."""
        try:
            return self._key_from_message(values, key_raw, exact=False)
        except Reparse:
            return self._key_from_message(values, key_raw, exact=True)

    def _key_fallback(self, values: list[Any], key_raw: bytes | None, exact: bool) -> str | None:
        assert self.pk_index is not None
        missing = [i for i in self.pk_index if values[i] is None]
        key, ctx, reason = self.read_key(key_raw, exact)
        if reason is not None:
            return f"primary key column '{self.names[missing[0]]}' is null ({reason})"
        for i in missing:
            name = self.names[i]
            value = key.get(name)
            if value is not None:
                try:
                    values[i] = self.converters[i](value, ctx)
                except Reject as error:
                    return f"message key column '{name}': {error}"
            if values[i] is None:
                return f"primary key column '{name}' is null"
        return None

    def _key_from_message(self, values: list[Any], key_raw: bytes | None, exact: bool) -> str | None:
        key, ctx, reason = self.read_key(key_raw, exact)
        if reason is not None:
            return f"{reason}, and the source declares no primary_key to take the key from"
        if not key:
            return "message key has no fields, and the source declares no primary_key"
        index = self.index
        for name, value in key.items():
            if name not in index:
                return f"message key field '{name}' is not a declared column of source '{self.spec.source_id}'"
            if value is None:
                return f"primary key column '{name}' is null"
            i = index[name]
            try:
                values[i] = self.converters[i](value, ctx)
            except Reject as error:
                return f"message key column '{name}': {error}"
        return None

    # ---- one batch -------------------------------------------------------------------------------------------

    def decode_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        # Decoding allocates many short-lived containers while the output rows accumulate; the cyclic garbage
        # collector would rescan those rows again and again, and nothing here creates reference cycles.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._decode_batch(batch)
        finally:
            if collecting:
                gc.enable()

    def _decode_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return self.decode_rows(batch)[0]

    def decode_rows(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[int]]:
        """The batch decoded message by message, and the input row of each output row (a tombstone without a
        key, or with one that does not give the primary key, yields none)."""
        pa = self.pa
        batch = restored_batch(batch)  # the whole messages, should the JVM have cut their schema wrappers off
        names = batch.schema.names
        values_in = batch.column(names.index("value")).to_pylist()
        keys_in = batch.column(names.index("key")).to_pylist() if "key" in names else [None] * len(values_in)
        # The new key of a primary-key change, on the delete of the old key (nearly always null: read only if set).
        new_keys_in: list[Any] | None = None
        if NEW_KEY_COLUMN in names:
            new_keys = batch.column(names.index(NEW_KEY_COLUMN))
            if new_keys.null_count < len(new_keys):
                new_keys_in = new_keys.to_pylist()
        offsets_in: list[Any] | None = None
        kafka_ts: list[Any] | None = None

        rows: list[list[Any]] = []
        sources: list[int] = []
        dead: list[tuple[int, str | Report]] = []  # (output row, reason or report)
        decode = self.decode_message
        null_row = self.null_row
        for i, raw in enumerate(values_in):
            key_raw = keys_in[i]
            tombstone = raw is None
            if tombstone and key_raw is None:
                continue  # nothing to delete
            try:
                result = decode(raw, key_raw) if raw is not None else self.decode_tombstone(key_raw)
            except ReportedFailure:  # an infrastructure fault (the registry): fail the task, dead-letter nothing
                raise
            except Exception as error:  # a decoder bug must not fail the query: dead-letter the message
                result = f"decoder error: {type(error).__name__}: {error}"[:300]
            if tombstone and type(result) is not list:
                continue  # a key that does not give the primary key: skipped, as its delete event said it all
            sources.append(i)
            if type(result) is list:
                if result[-2] is None and not tombstone:
                    if offsets_in is None:
                        offsets_in = batch.column(names.index("offset")).to_pylist()
                    result[-2] = offset_version(offsets_in[i], result[-3])
                if result[-1] is None:
                    if kafka_ts is None:
                        kafka_ts = self.kafka_micros(batch).to_pylist()
                    result[-1] = kafka_ts[i]
                rows.append(result)
                if new_keys_in is not None and new_keys_in[i] is not None and result[-3] == "d" and not tombstone:
                    marker = self._key_move(new_keys_in[i], result)
                    if marker is not None:
                        sources.append(i)
                        rows.append(marker)
            else:
                dead.append((len(rows), result))  # type: ignore[arg-type]
                rows.append(null_row)

        count = len(rows)
        try:
            arrays = self._arrays(rows)
        except Exception:  # a converter bug, not bad input: find the rows Arrow refuses and dead-letter them
            for row_index, row in enumerate(rows):
                try:
                    self._arrays([row])
                except Exception as error:
                    rows[row_index] = null_row
                    dead.append((row_index, f"decoder error: {type(error).__name__}: {error}"[:300]))
            dead.sort()
            arrays = self._arrays(rows)
        arrays += self.kafka_columns(batch, pa.array(sources, type=pa.int64()))
        if dead:
            reasons: list[str | None] = [None] * count
            reports: list[str | None] = [None] * count
            dead_keys: list[bytes | None] = [None] * count
            dead_values: list[bytes | None] = [None] * count
            for at, found in dead:
                report = undecodable(found) if type(found) is str else found
                assert isinstance(report, Report)
                reasons[at] = report.describe()
                reports[at] = report.encode()
                dead_keys[at] = keys_in[sources[at]]
                dead_values[at] = values_in[sources[at]]
            arrays.append(pa.array(reasons, type=pa.string()))
            arrays.append(pa.array(reports, type=pa.string()))
            arrays.append(pa.array(dead_keys, type=pa.binary()))
            arrays.append(pa.array(dead_values, type=pa.binary()))
        else:
            arrays += self.no_dead_letters(count)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema), sources

    def with_row_decoder(
        self,
        batch: pa.RecordBatch,
        changes: pa.Array,
        arrays: list[pa.Array],
        redo: pa.Array,
        *,
        ordered: bool = True,
    ) -> pa.RecordBatch:
        """A batch path's output merged with the row decoder's, in input order: ``arrays`` are the decoded
        columns (business, ``_cdc_op``, ``_cdc_version``, ``_cdc_ts``) of the input rows ``changes`` (in
        ascending order unless not ``ordered``), good but for ``redo``; the row decoder decodes those and every
        other input row."""
        pa = self.pa
        import numpy as np
        import pyarrow.compute as pc

        if NEW_KEY_COLUMN in batch.schema.names:  # a key change's delete: the row decoder adds its key-move row
            redo = pc.or_(redo, pc.is_valid(batch.column(batch.schema.names.index(NEW_KEY_COLUMN)).take(changes)))
        keep = pc.invert(redo)
        fast = changes.filter(keep)
        arrays = [array.filter(keep) for array in arrays] if redo.true_count else list(arrays)
        arrays += self.kafka_columns(batch, fast) + self.no_dead_letters(len(fast))
        decoded = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        if len(fast) == batch.num_rows:
            return decoded if ordered else decoded.take(pc.sort_indices(fast))
        # The other rows, by a mask: a Python range of every row and a hash lookup per row cost more than the
        # decoding of the few rows they find (tombstones, mostly).
        remaining = np.ones(batch.num_rows, dtype=bool)
        remaining[fast.to_numpy(zero_copy_only=False)] = False
        slow = pa.array(np.flatnonzero(remaining), pa.int64())
        rest, sources = self.decode_rows(batch.take(slow))
        positions = pa.concat_arrays([fast.cast(pa.int64()), slow.take(pa.array(sources, pa.int64()))])
        # sort_indices is stable: a delete stays before its key-move row (both from one message)
        return pa.concat_batches([decoded, rest]).take(pc.sort_indices(positions))

    def kafka_columns(self, batch: pa.RecordBatch, take: pa.Array) -> list[pa.Array]:
        """``_cdc_topic``, ``_cdc_partition`` and ``_cdc_offset`` of the input rows ``take``."""
        pa = self.pa
        names = batch.schema.names
        arrays = []
        for column, arrow_type in (("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())):
            taken = batch.column(names.index(column)).take(take)
            arrays.append(taken if taken.type == arrow_type else taken.cast(arrow_type))
        return arrays

    def no_dead_letters(self, count: int) -> list[pa.Array]:
        """The ``_dlq_*`` columns of ``count`` decoded rows: all null."""
        pa = self.pa
        return [pa.nulls(count, type=t) for t in (pa.string(), pa.string(), pa.binary(), pa.binary())]

    def _arrays(self, rows: list[list[Any]]) -> list[pa.Array]:
        columns: Any = zip(*rows, strict=True) if rows else ([] for _ in self.row_types)
        return [self._array(column, t) for column, t in zip(columns, self.row_types, strict=True)]

    def _array(self, column: Any, arrow_type: pa.DataType) -> pa.Array:
        pa = self.pa
        if not pa.types.is_decimal(arrow_type):
            return pa.array(column, type=arrow_type)
        # Decimal columns hold unscaled integers: 16-byte two's complement is the decimal128 layout itself.
        # A failed int64 conversion costs more than the wide path, so a column whose first value is wide (every
        # streamed _cdc_version) goes there at once.
        first = next((u for u in column if u is not None), 0)
        if not -(2**63) <= first < 2**63:
            return self._wide_decimals(column, arrow_type)
        try:
            unscaled = pa.array(column, type=pa.int64())
        except OverflowError:
            return self._wide_decimals(column, arrow_type)
        return unscaled.cast(pa.decimal128(38, 0)).view(arrow_type)

    def _wide_decimals(self, column: Any, arrow_type: pa.DecimalType) -> pa.Array:
        """Unscaled integers beyond int64 (large numerics, and every streamed ``_cdc_version``)."""
        return unscaled_decimals(list(column), arrow_type)

    def kafka_micros(self, batch: pa.RecordBatch) -> pa.Array:
        """The Kafka timestamps of the batch's messages in microseconds (int64), null where there is none or it
        lies outside the dates the output column holds."""
        pa = self.pa
        import pyarrow.compute as pc

        names = batch.schema.names
        if "timestamp" not in names:
            return pa.nulls(batch.num_rows, pa.int64())
        column = batch.column(names.index("timestamp"))
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
        micros = column.cast(pa.int64())
        fits = pc.and_(pc.greater_equal(micros, MIN_US), pc.less_equal(micros, MAX_US))
        return pc.if_else(fits, micros, pa.scalar(None, pa.int64()))
