"""A batch of JsonConverter payloads decoded at once: Arrow's JSON reader parses them into columns, and
``pyarrow.compute`` does the envelope (the row by ``op``, ``_cdc_version``, ``_cdc_ts``) and the conversions.

Why: the row decoder (:mod:`cdcsync.sources.debezium.plan`) spends most of its time in Python per message and
value; here the per-message Python work is slicing bytes. It covers the common shapes of Debezium's Postgres
connector (ops ``c``/``u``/``r``/``d`` with a ``source.sequence``) and the column types whose readings it can
match exactly: integers, ``text`` / ``varchar``, ``boolean``, ``numeric(p,s)`` (JSON numbers, decimal strings,
Connect ``Decimal`` bytes at the column's scale) and ``timestamptz`` as ISO strings in UTC.

The rule: the batch path only declines. It never decides a message differently from the row decoder (orjson,
the standard library's parser where orjson refuses, the generated converters), which is the reference for rows,
dead letters and failure reports. Where it cannot vouch for an answer it hands over: a batch Arrow refuses to read
(a malformed message, a duplicate key, a value of an unexpected JSON type, an integer out of range or written as
``1e3`` / ``1.0``, a number with more digits than the column keeps, ``NaN``...), a batch with bytes that are not
UTF-8 (Arrow's reader checks none, not even in the fields it skips) or a spec with another column type goes to the
row decoder whole; a message whose values it cannot vouch for (no key in its row, a NUL in a text, an unusual
timestamp or position, a plain payload with a ``\\u`` escape of a lowercase letter, which may spell a top-level
``schema`` or ``payload`` key that makes the row decoder read a wrapper, a payload with enough brackets to be
nested deeper than the row decoder's parsers go) goes to it alone (:attr:`Columns.redo`). Declining costs speed,
never correctness, so a check is only worth making exact where Debezium's own messages would otherwise be declined.

``tests/unit/test_debezium_columnar.py`` checks both paths give the same batches over good, odd and bad values;
``tests/unit/test_decoder_differential.py`` writes the messages from parts (Debezium's, with one crafted feature
each among them: escaped and duplicate keys, extra and missing fields, pretty printing, numbers as strings or
floats in integer columns, surrogates, bytes that are not UTF-8, deep nesting, null and absent rows, truncates,
ops ``r c u d t m``, source blocks with and without positions), bare and schema-wrapped and cut on the JVM, and
holds the batch path's output to the row decoder's message by message (``make soak`` runs it 2,000 times).
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcsync.config.types import PgType
from cdcsync.sources.debezium.envelope import MAX_COMMIT, MAX_TS_MS, MIN_TS_MS
from cdcsync.sources.debezium.values import (
    DEBEZIUM_DECIMAL,
    INT_RANGES,
    column_schema,
    logical_type,
    unscaled_decimals,
)

if TYPE_CHECKING:
    import pyarrow as pa

_TEXT_TYPES = ("text", "character varying")
_ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
_OPS = ("c", "u", "r", "d")
# What ``datetime.fromisoformat`` reads exactly like Arrow's cast: years 0001-9999, a 'T', 1-6 fraction digits,
# 'Z'. Days that do not exist pass this and make the cast fail: the batch goes to the row decoder.
_UTC_TIMESTAMP_RE = (
    r"^(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
    r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?Z$"
)
# ``["<commit>","<lsn>"]``, or ``[null,"<lsn>"]`` (the first change after the connector started): one regex, one pass
# over the batch; a null in the commit's place leaves its group empty.
_SEQUENCE_RE = r'^\[(?:"(?P<commit>[0-9]{1,20})"|null),"(?P<lsn>[0-9]{1,20})"\]$'


@dataclass(frozen=True)
class ColumnReader:
    """How one column is read: ``kind`` is ``int``, ``text``, ``bool``, ``decimal`` (a JSON number or decimal
    string), ``connect_decimal`` (unscaled bytes at the column's scale: base64 in JSON) or ``utc_timestamp``;
    Avro (:mod:`cdcsync.sources.debezium.avro_columnar`) also has ``double``, ``date`` (epoch days) and
    ``epoch_timestamp`` (an integer since the epoch, in ``unit``)."""

    kind: str
    precision: int = 0
    scale: int = 0
    unit: int = 1
    """Avro ``date`` / ``epoch_timestamp``: what the value is scaled by (:func:`~.values.scale_int`'s unit); for
    ``epoch_timestamp`` ``precision`` is the step (µs) the column's precision allows."""

    def json_type(self) -> pa.DataType:
        """What Arrow's JSON reader is asked to read (it fails the batch on anything else)."""
        import pyarrow as pa

        if self.kind == "decimal":
            return pa.decimal128(38, self.scale)
        if self.kind in ("text", "connect_decimal", "utc_timestamp"):
            return pa.string()
        if self.kind == "bool":
            return pa.bool_()
        return {2**15: pa.int16(), 2**31: pa.int32()}.get(self.precision, pa.int64())  # by the range's bound


def column_reader(name: str, pg: PgType, schema: dict[str, Any] | None) -> ColumnReader | None:
    """The reader of a column in messages with this Connect envelope schema (None: schemas off), or None when
    this path has none (the row decoder then decodes the batch)."""
    if pg.name in INT_RANGES:
        return ColumnReader("int", precision=INT_RANGES[pg.name])  # read by the declared type alone
    if pg.name in _TEXT_TYPES and not pg.args:
        return ColumnReader("text")
    if pg.name == "boolean":
        return ColumnReader("bool")
    if pg.name == "timestamp with time zone" and pg.fraction_digits == 6:
        return ColumnReader("utc_timestamp")
    if pg.name == "numeric" and pg.args and pg.spark_type.startswith("decimal"):
        precision, scale = pg.args[0], (pg.args[1] if len(pg.args) > 1 else 0)
        fields = [column_schema((schema, struct, b""), name) for struct in ("after", "before")] if schema else []
        found = [field for field in fields if field is not None]
        if any(field != found[0] for field in found):
            return None
        logical, params = logical_type(found[0] if found else None)
        if logical is None:
            return ColumnReader("decimal", precision, scale)
        if logical == DEBEZIUM_DECIMAL and str(params.get("scale", 0)) == str(scale):
            return ColumnReader("connect_decimal", precision, scale)
    return None


@dataclass
class Columns:
    """The decoded columns of a batch's messages, in the row decoder's output order (business columns, then
    ``_cdc_op``, ``_cdc_version``, ``_cdc_ts``), and ``redo``: the messages the row decoder must decode instead
    (their values here are meaningless)."""

    arrays: list[pa.Array]
    redo: pa.Array


class ColumnarJson:
    """The batch path of one spec's JSON messages (see the module docstring)."""

    def __init__(self, columns: tuple[tuple[str, PgType], ...], primary_key: list[int]) -> None:
        self.columns = columns
        self.primary_key = primary_key
        self._readers: dict[int, tuple[dict[str, Any] | None, list[ColumnReader] | None, Any]] = {}

    def readers(self, schema: dict[str, Any] | None) -> tuple[list[ColumnReader], Any] | None:
        """The column readers and Arrow JSON parse options for messages with this envelope schema (built once per
        distinct schema object, which is kept with them so that its id is not reused), or None."""
        found = self._readers.get(id(schema))
        if found is None or found[0] is not schema:
            readers: list[ColumnReader] | None = []
            for name, pg in self.columns:
                reader = column_reader(name, pg, schema)
                if reader is None or readers is None:
                    readers = None
                    break
                readers.append(reader)
            found = (schema, readers, _parse_options(self.columns, readers, schema is None) if readers else None)
            if len(self._readers) >= 64:
                self._readers.clear()
            self._readers[id(schema)] = found
        return None if found[1] is None else (found[1], found[2])

    def decode(
        self, payloads: pa.Buffer, count: int, schema: dict[str, Any] | None, kafka_micros: Any
    ) -> Columns | None:
        """The columns of ``count`` payloads (compact JSON objects, one per line), or None when the row decoder
        must decode them all. ``kafka_micros()`` gives their Kafka timestamps (only asked for when a message has
        no ``ts_ms``). A plain payload must have a source block with a ``schema`` (see ``_payloads`` in
        :mod:`cdcsync.sources.debezium.json`)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj

        ready = self.readers(schema)
        if ready is None or not count:
            return None
        readers, options = ready
        try:
            table = pj.read_json(
                pa.BufferReader(payloads),
                read_options=pj.ReadOptions(use_threads=False, block_size=payloads.size + 1),
                parse_options=options,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError, ValueError):
            return None
        if table.num_rows != count:  # every payload is one object: more rows means one held two
            return None
        table = table.combine_chunks()
        op = table.column("op").chunk(0)
        if op.null_count or not pc.all(pc.is_in(op, value_set=pa.array(_OPS))).as_py():
            return None  # truncates, dead letters: the row decoder's
        is_delete = pc.equal(op, "d")
        after = table.column("after").chunk(0)
        before = table.column("before").chunk(0)
        source = table.column("source").chunk(0)
        if schema is None and pc.struct_field(source, "schema").null_count:
            return None
        redo = pc.or_(pc.is_null(source), pc.and_(pc.invert(is_delete), pc.is_null(after)))

        arrays: list[pa.Array] = []
        for i, reader in enumerate(readers):
            values = pc.if_else(is_delete, pc.struct_field(before, [i]), pc.struct_field(after, [i]))
            converted = convert(reader, values)
            if converted is None:
                return None
            array, bad = converted
            if bad is not None:
                redo = pc.or_(redo, bad)
            arrays.append(array)
        for i in self.primary_key:  # a row without its key takes it from the message key: the row decoder's
            redo = pc.or_(redo, pc.is_null(arrays[i]))

        version = versions(op, source)
        if version is None:
            return None
        version_array, bad_position = version
        redo = pc.or_(redo, bad_position)
        arrays += [op, version_array, timestamps(source, table.column("ts_ms").chunk(0), kafka_micros)]
        return Columns(arrays, redo)


def _parse_options(columns: tuple[tuple[str, PgType], ...], readers: list[ColumnReader], plain: bool) -> Any:
    import pyarrow as pa
    import pyarrow.json as pj

    row = pa.struct([(name, reader.json_type()) for (name, _), reader in zip(columns, readers, strict=True)])
    source = [("ts_ms", pa.int64()), ("sequence", pa.string()), ("lsn", pa.uint64()), ("snapshot", pa.string())]
    if plain:
        source.append(("schema", pa.string()))
    schema = pa.schema(
        [("before", row), ("after", row), ("source", pa.struct(source)), ("op", pa.string()), ("ts_ms", pa.int64())]
    )
    return pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False)


def convert(reader: ColumnReader, values: pa.Array) -> tuple[pa.Array, pa.Array | None] | None:
    """(the output column, the rows to redo or None), or None: the batch is the row decoder's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = reader.kind
    if kind in ("int", "bool"):
        return values, None
    if kind == "text":
        return values, pc.fill_null(pc.match_substring(values, "\x00"), False)  # the row decoder rejects NULs
    if kind == "decimal":
        try:
            return pc.cast(values, pa.decimal128(reader.precision, reader.scale)), None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    if kind == "utc_timestamp":
        bad = pc.fill_null(pc.invert(pc.match_substring_regex(values, _UTC_TIMESTAMP_RE)), False)
        try:
            return pc.cast(pc.if_else(bad, pa.scalar(None, pa.string()), values), pa.timestamp("us", tz="UTC")), bad
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    assert kind == "connect_decimal"
    out_type = pa.decimal128(reader.precision, reader.scale)
    texts = values.to_pylist()
    try:
        unscaled = [None if t is None else _from_bytes(_a2b(t, strict_mode=True), "big", signed=True) for t in texts]
        array = pa.array(unscaled, pa.int64())
    except (ValueError, OverflowError, pa.ArrowInvalid):  # bad base64 (the row decoder says why), wide values
        return _connect_decimals_one_by_one(texts, reader, out_type)
    limit = 10**reader.precision
    if limit <= 2**63:
        bad = pc.fill_null(pc.greater_equal(pc.abs_checked(array), limit), False)
        array = pc.if_else(bad, pa.scalar(None, pa.int64()), array)
    else:
        bad = pa.array([False] * len(array))
    return array.cast(pa.decimal128(38, 0)).view(out_type), bad


_a2b = binascii.a2b_base64
_from_bytes = int.from_bytes


def _connect_decimals_one_by_one(
    texts: list[Any], reader: ColumnReader, out_type: pa.DataType
) -> tuple[pa.Array, pa.Array]:
    import pyarrow as pa

    limit = 10**reader.precision
    unscaled: list[int | None] = []
    bad_rows: list[bool] = []
    for text in texts:
        number = None
        if text is not None:
            try:
                number = int.from_bytes(_a2b(text, strict_mode=True), "big", signed=True)
            except ValueError:
                number = limit
        ok = number is None or -limit < number < limit
        unscaled.append(number if ok else None)
        bad_rows.append(not ok)
    return unscaled_decimals(unscaled, out_type), pa.array(bad_rows, pa.bool_())


def versions(op: pa.Array, source: pa.Array) -> tuple[pa.Array, pa.Array] | None:
    """``_cdc_version`` from ``source.sequence`` (:func:`~cdcsync.sources.debezium.envelope.change_position`),
    and the rows whose position this path does not read (no sequence, a position out of range)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    sequence = pc.struct_field(source, "sequence")
    pair = pc.extract_regex(sequence, _SEQUENCE_RE)
    read = pc.is_valid(pair)
    has_commit = pc.fill_null(pc.not_equal(pc.struct_field(pair, "commit"), ""), False)
    source_lsn = pc.struct_field(source, "lsn")
    # No sequence: source.lsn alone. A sequence this path does not read, or neither: the row decoder's.
    by_lsn = pc.and_(pc.is_null(sequence), pc.is_valid(source_lsn))
    zero = pa.scalar("0")
    try:
        commit = pc.cast(pc.if_else(has_commit, pc.struct_field(pair, "commit"), zero), pa.uint64())
        lsn = pc.cast(pc.if_else(read, pc.struct_field(pair, "lsn"), zero), pa.uint64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    lsn = pc.if_else(by_lsn, source_lsn, lsn)
    none, most = pa.scalar(0, pa.uint64()), pa.scalar(MAX_COMMIT, pa.uint64())
    bad = pc.or_(pc.invert(pc.or_(read, by_lsn)), pc.equal(lsn, none))
    bad = pc.or_(bad, pc.and_(has_commit, pc.or_(pc.equal(commit, none), pc.greater(commit, most))))
    # A snapshot read (not an incremental one) ranks at its last commit, else at S; see envelope.py.
    snapshot = pc.fill_null(pc.not_equal(pc.struct_field(source, "snapshot"), "incremental"), True)
    snapshot_read = pc.and_(pc.equal(op, "r"), snapshot)
    commit_or_lsn = pc.if_else(has_commit, commit, lsn)
    high = pc.if_else(snapshot_read, commit, commit_or_lsn)
    # An LSN in the commit's place can make the version wider than decimal(38,0): the row decoder's to report.
    bad = pc.or_(bad, pc.greater(high, most))
    low = pc.if_else(pc.and_(snapshot_read, has_commit), none, lsn)
    words = np.empty((len(op), 2), dtype="<u8")
    words[:, 0] = low.to_numpy(zero_copy_only=False)
    words[:, 1] = high.to_numpy(zero_copy_only=False)
    version = pa.Array.from_buffers(pa.decimal128(38, 0), len(op), [None, pa.py_buffer(words.tobytes())])
    return version, bad


def timestamps(source: pa.Array, payload_ts: pa.Array, kafka_micros: Any) -> pa.Array:
    """``_cdc_ts``: ``source.ts_ms``, else the payload's ``ts_ms``, else the Kafka timestamp (in range)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def in_range(ms: pa.Array) -> pa.Array:
        fits = pc.and_(pc.greater_equal(ms, MIN_TS_MS), pc.less_equal(ms, MAX_TS_MS))
        return pc.multiply(pc.if_else(fits, ms, pa.scalar(None, pa.int64())), 1000)

    micros = pc.coalesce(in_range(pc.struct_field(source, "ts_ms")), in_range(payload_ts))
    if micros.null_count:
        micros = pc.coalesce(micros, kafka_micros())
    return micros.cast(pa.timestamp("us", tz="UTC"))
