"""A batch of Avro messages of one writer schema decoded at once: numpy walks the writer schema field by field
over every message together, then the declared columns and the envelope become Arrow columns.

Why: fastavro's ``schemaless_reader`` builds Python dicts per message and field, and that is most of what an
Avro source costs (``benchmarks/decode.py``). Here the messages' bytes are one numpy buffer and each message's
read position one element of an array: reading a field is a handful of numpy operations over all messages (a
union's branch index splits them into groups that read their branch), whatever the batch size. The walk follows
the writer schema exactly (Avro binary has no field tags), so every field is read, kept or not.

Exactness comes first, as in :mod:`cdcsync.sources.debezium.columnar`, and this path only declines. A writer
schema with a type it does not walk (arrays, maps, a recursive record) or a declared column whose Avro type it
does not convert exactly as :mod:`cdcsync.sources.debezium.avro_values` and the converters do, leaves its
messages to the row decoder; a message that does not read cleanly (a varint longer than 64 bits, a length or
union branch out of range, a boolean byte other than 0 or 1, bytes left over, a string that is not UTF-8), a
value out of its column's range, a NUL in a text, an unusual timestamp or position, a truncate or a row without
its key goes to the row decoder alone (:attr:`~cdcsync.sources.debezium.columnar.Columns.redo`), which decides
what it is. ``tests/unit/test_avro_columnar.py`` checks both paths give the same batches, over damaged bodies and
fields encoded as AvroConverter never would (strings that are not UTF-8 or run past the message, varints padded
to ten bytes or beyond 64 bits, NaNs, ``-0.0`` and infinities, floats compared to the bit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdcsync.config.types import PgType
from cdcsync.core.temporal import MAX_DATE_DAYS, MIN_DATE_DAYS, MIN_TIMESTAMP_MICROS, TIMESTAMP_POSITIVE_INFINITY
from cdcsync.sources.debezium.avro_schema import avro_annotations, resolve
from cdcsync.sources.debezium.avro_values import decimal_scale, integer_unit
from cdcsync.sources.debezium.columnar import ColumnReader, Columns, convert, timestamps, versions
from cdcsync.sources.debezium.temporal import DEBEZIUM_DATE_SENTINELS, PGJDBC_TIMESTAMP_SENTINELS
from cdcsync.sources.debezium.values import INT_RANGES

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

_PAD = 16  # zero bytes before and after the messages: a read window never leaves the buffer
_MAX_DEPTH = 24
_OPS = ("c", "u", "r", "d")
_ENVELOPE_LEAVES = {
    ("op",): "string",
    ("ts_ms",): "long",
    ("source", "ts_ms"): "long",
    ("source", "sequence"): "string",
    ("source", "lsn"): "long",
    ("source", "snapshot"): "string",
}
"""The envelope fields the batch path reads, with the Avro type each must have (else the row decoder's)."""
_FIXED_SIZES = {"boolean": 1, "float": 4, "double": 8}
_TIMESTAMPS = ("timestamp without time zone", "timestamp with time zone")


class Unsupported(Exception):
    """The writer schema (or a declared column's type in it) is not for this path."""


@dataclass
class Leaf:
    """What the walk keeps of one field over the batch: ``valid`` rows, and either ``values`` (ints, floats,
    booleans) or ``starts``/``lengths`` into the buffer (strings, bytes)."""

    kind: str
    valid: np.ndarray
    values: np.ndarray | None = None
    starts: np.ndarray | None = None
    lengths: np.ndarray | None = None


@dataclass
class Node:
    """One type of the writer schema, compiled: ``kind`` is an Avro type name (``union`` with ``branches``,
    ``record`` with ``fields``); ``path`` is set where the walk keeps the value (or, for a record, where it is)."""

    kind: str
    path: tuple[str, ...] | None = None
    size: int = 0  # fixed: bytes; enum: symbols
    branches: list[Node] = field(default_factory=list)
    fields: list[Node] = field(default_factory=list)


def column_kind(pg: PgType, avro_type: Any, names: dict[str, Any], namespace: str) -> ColumnReader:
    """How a declared column is read from values of this Avro type, or :class:`Unsupported`."""
    resolved, namespace = resolve(avro_type, names, namespace)
    if isinstance(resolved, list):
        live = [b for b in resolved if b != "null"]
        if len(live) != 1:
            raise Unsupported("a union of several types")  # the translator decides by value
        resolved, namespace = resolve(live[0], names, namespace)
    base, logical, info = avro_annotations(resolved)
    if pg.name in INT_RANGES and base in ("int", "long"):
        return ColumnReader("int", precision=INT_RANGES[pg.name])
    if pg.name in ("text", "character varying") and not pg.args and base == "string":
        return ColumnReader("text")
    if pg.name == "boolean" and base == "boolean":
        return ColumnReader("bool")
    if pg.name == "double precision" and base == "double":
        return ColumnReader("double")
    if pg.name == "timestamp with time zone" and pg.fraction_digits == 6 and base == "string":
        return ColumnReader("utc_timestamp")
    if pg.name == "date" and base in ("int", "long") and integer_unit(pg, logical) == 1:
        return ColumnReader("date")
    if pg.name in _TIMESTAMPS and base in ("int", "long"):
        unit = integer_unit(pg, logical)
        assert unit is not None
        return ColumnReader("epoch_timestamp", precision=10 ** (6 - pg.fraction_digits), unit=unit)
    if pg.name == "numeric" and pg.args and pg.spark_type.startswith("decimal") and base == "bytes":
        precision, scale = pg.args[0], (pg.args[1] if len(pg.args) > 1 else 0)
        if decimal_scale(info) == scale:
            return ColumnReader("connect_decimal", precision, scale)
    raise Unsupported(f"column type {pg.sql} from Avro {base or resolved!r}")


class Compiler:
    """Turns a writer schema into :class:`Node` s, marking the envelope fields (of a value) and the declared
    columns (in ``before`` and ``after`` of a value, at the top of a key)."""

    def __init__(self, names: dict[str, Any], columns: tuple[tuple[str, PgType], ...], *, key: bool = False) -> None:
        self.names = names
        self.columns = dict(columns)
        self.envelope = not key
        self.rows: tuple[tuple[str, ...], ...] = ((),) if key else (("before",), ("after",))
        self.records = ((),) if key else ((), ("before",), ("after",), ("source",))
        self.readers: dict[str, ColumnReader] = {}

    def node(self, schema: Any, namespace: str, path: tuple[str, ...], depth: int = 0) -> Node:
        if depth > _MAX_DEPTH:
            raise Unsupported("nested too deeply (a recursive type?)")
        schema, namespace = resolve(schema, self.names, namespace)
        if isinstance(schema, list):
            return Node("union", branches=[self.node(b, namespace, path, depth + 1) for b in schema])
        base, _, info = avro_annotations(schema)
        if base in ("record", "error"):
            fields = []
            for entry in info.get("fields", []):
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise Unsupported("a record field without a name")
                fields.append(self.node(entry.get("type"), namespace, self._child(path, entry, namespace), depth + 1))
            return Node("record", path=path if path in self.records else None, fields=fields)
        if base in ("null", "boolean", "int", "long", "float", "double", "bytes", "string"):
            return Node(base, path=self._keep(path, base))
        if base == "fixed" and isinstance(info.get("size"), int):
            return Node("fixed", size=info["size"])
        if base == "enum" and isinstance(info.get("symbols"), list) and self._keep(path, base) is None:
            return Node("enum", size=len(info["symbols"]))
        raise Unsupported(f"Avro type {base or schema!r}")

    def _child(self, path: tuple[str, ...], entry: dict[str, Any], namespace: str) -> tuple[str, ...]:
        name = entry["name"]
        if path not in self.records:
            return ("",)  # deeper: nothing kept
        if path in self.rows and name in self.columns:
            reader = column_kind(self.columns[name], entry.get("type"), self.names, namespace)
            if self.readers.setdefault(name, reader) != reader:
                raise Unsupported(f"column '{name}' differs between before and after")
        return (*path, name)

    def _keep(self, path: tuple[str, ...], base: str) -> tuple[str, ...] | None:
        if base == "null" or not path:
            return None
        if self.envelope and path in _ENVELOPE_LEAVES:
            if _ENVELOPE_LEAVES[path] != base:
                raise Unsupported(f"envelope field {'.'.join(path)} is {base}")
            return path
        if path[:-1] in self.rows and path[-1] in self.columns:
            return path
        return None


class Walk:
    """Every message's read position, advanced field by field through the compiled writer schema."""

    def __init__(self, values: pa.BinaryArray, header: int, bad: np.ndarray) -> None:
        import numpy as np

        buffers = values.buffers()
        offsets = np.frombuffer(buffers[1], np.int32, len(values) + 1, values.offset * 4).astype(np.int64)
        data = buffers[2]
        first, last = int(offsets[0]), int(offsets[-1])
        self.buf = np.zeros(last - first + 2 * _PAD, np.uint8)
        if last > first:
            self.buf[_PAD : _PAD + last - first] = np.frombuffer(data, np.uint8, last - first, first)
        self.end = offsets[1:] - first + _PAD
        self.pos = np.minimum(offsets[:-1] - first + _PAD + header, self.end)
        self.bad = bad.copy()
        self.leaves: dict[tuple[str, ...], Leaf] = {}
        self.strings: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.n = len(values)

    @classmethod
    def over(cls, root: Node, messages: pa.BinaryArray, header: int, bad: np.ndarray) -> Walk | None:
        """``messages`` read through the compiled schema ``root``; None when a string is not UTF-8."""
        import numpy as np

        walk = cls(messages, header, bad)
        walk.read(root, np.arange(len(messages)))
        try:
            walk.finish()
        except Unsupported:
            return None
        return walk

    # ---- primitives ------------------------------------------------------------------------------------------

    def _advance(self, rows: np.ndarray, ok: np.ndarray, new: np.ndarray) -> None:
        import numpy as np

        end = self.end[rows]
        ok &= new <= end
        if not ok.all():
            self.bad[rows[~ok]] = True
        self.pos[rows] = np.where(ok, new, end)

    def varint(self, rows: np.ndarray) -> np.ndarray:
        """Zigzag varints (Avro int and long) at each row's position."""
        import numpy as np

        pos = self.pos[rows]
        first = self.buf[pos]
        if (first < 0x80).all():  # one byte each: the common case
            unsigned = first.astype(np.int64)
            self._advance(rows, np.ones(len(rows), bool), pos + 1)
            return (unsigned >> 1) ^ -(unsigned & 1)
        window = self.buf[pos[:, None] + np.arange(10)]
        stops = window < 0x80
        length = stops.argmax(axis=1) + 1
        ok = stops.any(axis=1) & ~((length == 10) & (window[:, 9] > 1))
        parts = (window & 0x7F).astype(np.uint64) << (7 * np.arange(10, dtype=np.uint64))
        parts[np.arange(10) >= length[:, None]] = 0
        unsigned = np.bitwise_or.reduce(parts, axis=1)
        self._advance(rows, ok, pos + length)
        return (unsigned >> np.uint64(1)).astype(np.int64) ^ -(unsigned & np.uint64(1)).astype(np.int64)

    def span(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of each row's bytes or string."""
        import numpy as np

        length = self.varint(rows)
        pos = self.pos[rows]
        ok = (length >= 0) & (length <= self.end[rows] - pos)
        length = np.where(ok, length, 0)
        self._advance(rows, ok, pos + length)
        return pos, length

    def fixed(self, rows: np.ndarray, size: int) -> np.ndarray:
        pos = self.pos[rows]
        self._advance(rows, pos == pos, pos + size)
        return pos

    # ---- the schema ------------------------------------------------------------------------------------------

    def read(self, node: Node, rows: np.ndarray) -> None:
        import numpy as np

        if not len(rows):
            return
        kind = node.kind
        if kind == "record":
            if node.path is not None:
                self._leaf(node.path, "present").valid[rows] = True
            for child in node.fields:
                self.read(child, rows)
        elif kind == "union":
            index = self.varint(rows)
            out = (index < 0) | (index >= len(node.branches))
            if out.any():
                self.bad[rows[out]] = True
            for i, branch in enumerate(node.branches):
                self.read(branch, rows[index == i])
        elif kind in ("int", "long", "enum"):
            values = self.varint(rows)
            if kind == "enum":
                wrong = (values < 0) | (values >= node.size)
                if wrong.any():
                    self.bad[rows[wrong]] = True
            elif node.path is not None:
                leaf = self._leaf(node.path, "long")
                leaf.valid[rows] = True
                assert leaf.values is not None
                leaf.values[rows] = values
        elif kind in ("string", "bytes"):
            starts, lengths = self.span(rows)
            if kind == "string":
                self.strings.append((rows, starts, lengths))
            if node.path is not None:
                leaf = self._leaf(node.path, kind)
                leaf.valid[rows] = True
                assert leaf.starts is not None and leaf.lengths is not None
                leaf.starts[rows], leaf.lengths[rows] = starts, lengths
        elif kind in _FIXED_SIZES:
            pos = self.fixed(rows, _FIXED_SIZES[kind])
            if kind == "boolean":
                byte = self.buf[pos]
                if (byte > 1).any():
                    self.bad[rows[byte > 1]] = True
            if node.path is not None and kind != "float":
                leaf = self._leaf(node.path, kind)
                leaf.valid[rows] = True
                assert leaf.values is not None
                if kind == "boolean":
                    leaf.values[rows] = self.buf[pos] == 1
                else:
                    leaf.values[rows] = self.buf[pos[:, None] + np.arange(8)].view("<f8")[:, 0]
        elif kind == "fixed":
            self.fixed(rows, node.size)
        # null: nothing to read

    def _leaf(self, path: tuple[str, ...], kind: str) -> Leaf:
        import numpy as np

        leaf = self.leaves.get(path)
        if leaf is None:
            n = self.n
            valid = np.zeros(n, bool)
            if kind in ("string", "bytes"):
                leaf = Leaf(kind, valid, starts=np.zeros(n, np.int64), lengths=np.zeros(n, np.int64))
            else:
                dtype = {"long": np.int64, "double": np.float64, "boolean": np.bool_}.get(kind, np.bool_)
                leaf = Leaf(kind, valid, values=np.zeros(n, dtype))
            self.leaves[path] = leaf
        return leaf

    def finish(self) -> None:
        """Bytes left over after the record make their message the row decoder's; a string that is not UTF-8
        (fastavro refuses it) makes the batch the row decoder's (:class:`Unsupported`). Only strings with a byte
        over 0x7f need a look (a running count of such bytes finds them)."""
        import numpy as np
        import pyarrow as pa

        self.bad |= self.pos != self.end
        high = self.buf >= 0x80
        if not self.strings or not high.any():
            return
        count = np.zeros(len(self.buf) + 1, np.int32)
        np.cumsum(high, out=count[1:])
        for rows, starts, lengths in self.strings:
            lengths = np.where(self.bad[rows], 0, lengths)
            suspect = count[starts + lengths] != count[starts]
            if not suspect.any():
                continue
            try:
                self._binary(starts[suspect], lengths[suspect], None).cast(pa.string())
            except pa.ArrowInvalid:
                raise Unsupported("a string that is not UTF-8") from None

    # ---- to Arrow --------------------------------------------------------------------------------------------

    def _gather_index(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        import numpy as np

        total = int(lengths.sum())
        ends = np.cumsum(lengths)
        return np.repeat(starts - (ends - lengths), lengths) + np.arange(total)

    def _binary(self, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None) -> pa.Array:
        import numpy as np
        import pyarrow as pa

        offsets = np.zeros(len(starts) + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        data = self.buf[self._gather_index(starts, lengths)]
        bitmap = None if valid is None else pa.array(valid, pa.bool_()).buffers()[1]
        nulls = 0 if valid is None else int(len(valid) - valid.sum())
        return pa.Array.from_buffers(
            pa.binary(), len(starts), [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
        )

    def array(self, path: tuple[str, ...], arrow_type: pa.DataType) -> pa.Array:
        """The kept values of a field as Arrow (null where a row has none, or no such field)."""
        import pyarrow as pa

        leaf = self.leaves.get(path)
        if leaf is None:
            return pa.nulls(self.n, arrow_type)
        valid = leaf.valid & ~self.bad  # what a message that did not read cleanly holds means nothing
        if leaf.starts is not None and leaf.lengths is not None:
            return self._binary(leaf.starts, leaf.lengths * valid, valid).cast(arrow_type)
        return pa.array(leaf.values, mask=~valid).cast(arrow_type)

    def present(self, path: tuple[str, ...]) -> np.ndarray:
        import numpy as np

        leaf = self.leaves.get(path)
        return leaf.valid if leaf is not None else np.zeros(self.n, bool)

    def decimals(self, path: tuple[str, ...], reader: ColumnReader) -> tuple[pa.Array, np.ndarray]:
        """Connect ``Decimal`` bytes (big-endian two's complement, unscaled) as the column's decimal, and the rows
        to redo (over 8 bytes, or more digits than the column keeps)."""
        import numpy as np
        import pyarrow as pa

        leaf = self.leaves.get(path)
        out_type = pa.decimal128(reader.precision, reader.scale)
        if leaf is None or leaf.starts is None or leaf.lengths is None:
            return pa.nulls(self.n, out_type), np.zeros(self.n, bool)
        valid = leaf.valid & ~self.bad
        lengths = np.where(valid, leaf.lengths, 0)
        wide = lengths > 8
        lengths = np.where(wide, 0, lengths)
        window = self.buf[(leaf.starts + lengths - 8)[:, None] + np.arange(8)]
        negative = (lengths > 0) & (self.buf[leaf.starts] >= 0x80)
        before = np.arange(8) < (8 - lengths)[:, None]
        window = np.where(before, np.where(negative, 0xFF, 0)[:, None], window).astype(np.uint8)
        unscaled = window.view(">i8")[:, 0].astype(np.int64)
        bad = wide
        if reader.precision <= 18:
            limit = 10**reader.precision
            bad = bad | (unscaled >= limit) | (unscaled <= -limit)
        bad &= valid
        valid &= ~bad
        array = pa.array(np.where(valid, unscaled, 0), pa.int64(), mask=~valid)
        return array.cast(pa.decimal128(38, 0)).view(out_type), bad


class ColumnarAvro:
    """The batch path of one spec's messages written with one writer schema (see the module docstring)."""

    def __init__(
        self,
        columns: tuple[tuple[str, PgType], ...],
        primary_key: list[int],
        writer: Any,
        names: dict[str, Any],
        row_types: list[pa.DataType],
    ) -> None:
        """:class:`Unsupported` when the writer schema or a declared column is not for this path."""
        self.columns = columns
        self.primary_key = primary_key
        self.row_types = row_types
        compiler = Compiler(names, columns)
        self.root = compiler.node(writer, "", ())
        if self.root.kind != "record":
            raise Unsupported("the value is not a record")
        self.readers = [compiler.readers.get(name) for name, _ in columns]

    def decode(self, values: pa.BinaryArray, header: int, bad: np.ndarray, kafka_micros: Any) -> Columns | None:
        """The columns of ``values`` (Confluent wire format: ``header`` bytes, then the body), rows ``bad`` and any
        this path cannot vouch for in :attr:`Columns.redo`; None when the row decoder must decode them all."""
        import pyarrow as pa
        import pyarrow.compute as pc

        walk = Walk.over(self.root, values, header, bad)
        if walk is None:
            return None
        op = walk.array(("op",), pa.string())
        is_delete = pc.fill_null(pc.equal(op, "d"), False)
        redo = walk.bad | ~pc.fill_null(pc.is_in(op, value_set=pa.array(_OPS)), False).to_numpy(zero_copy_only=False)
        delete = is_delete.to_numpy(zero_copy_only=False)
        redo |= ~walk.present(("source",)) | (~delete & ~walk.present(("after",)))
        arrays: list[pa.Array] = []
        for i, ((name, _), reader) in enumerate(zip(self.columns, self.readers, strict=True)):
            if reader is None:  # in neither row record: null, as a field missing from a JSON message
                arrays.append(pa.nulls(len(values), self.row_types[i]))
                continue
            column, column_redo = self._column(walk, name, reader, is_delete, self.row_types[i])
            if column is None:
                return None
            redo |= column_redo
            arrays.append(column)
        for i in self.primary_key:  # a row without its key takes it from the message key: the row decoder's
            redo |= pc.is_null(arrays[i]).to_numpy(zero_copy_only=False)
        lsn = walk.array(("source", "lsn"), pa.int64())
        positive = pc.fill_null(pc.greater(lsn, 0), False)
        source = pa.StructArray.from_arrays(
            [
                walk.array(("source", "ts_ms"), pa.int64()),
                walk.array(("source", "sequence"), pa.string()),
                pc.if_else(positive, lsn, pa.scalar(None, pa.int64())).cast(pa.uint64()),
                walk.array(("source", "snapshot"), pa.string()),
            ],
            names=["ts_ms", "sequence", "lsn", "snapshot"],
        )
        found = versions(pc.fill_null(op, "c"), source)  # a row without an op is redone already
        if found is None:
            return None
        version, bad_position = found
        redo |= pc.fill_null(bad_position, True).to_numpy(zero_copy_only=False)
        arrays += [op, version, timestamps(source, walk.array(("ts_ms",), pa.int64()), kafka_micros)]
        return Columns(arrays, pa.array(redo, pa.bool_()))

    def _column(
        self, walk: Walk, name: str, reader: ColumnReader, is_delete: pa.Array, out_type: pa.DataType
    ) -> tuple[pa.Array | None, np.ndarray]:
        """A declared column from ``before`` (deletes) or ``after`` (the rest), and the rows to redo."""
        import numpy as np
        import pyarrow.compute as pc

        before, bad_before = raw_column(walk, ("before", name), reader)
        after, bad_after = raw_column(walk, ("after", name), reader)
        array, redo = converted_column(reader, pc.if_else(is_delete, before, after), out_type)
        return array, redo | np.where(is_delete.to_numpy(zero_copy_only=False), bad_before, bad_after)


def raw_column(walk: Walk, path: tuple[str, ...], reader: ColumnReader) -> tuple[pa.Array, np.ndarray]:
    """A kept field as read (Connect decimals already as the column's decimal), and the rows to redo."""
    import numpy as np
    import pyarrow as pa

    if reader.kind == "connect_decimal":
        return walk.decimals(path, reader)
    integral = reader.kind in ("int", "date", "epoch_timestamp")
    arrow_type = pa.int64() if integral else {"bool": pa.bool_(), "double": pa.float64()}.get(reader.kind, pa.string())
    return walk.array(path, arrow_type), np.zeros(walk.n, bool)


def converted_column(
    reader: ColumnReader, values: pa.Array, out_type: pa.DataType
) -> tuple[pa.Array | None, np.ndarray]:
    """A column's values as the row decoder's converters give them (None: the batch is the row decoder's), and
    the rows to redo."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    none = np.zeros(len(values), bool)
    if reader.kind in ("connect_decimal", "double"):
        return values, none
    if reader.kind == "int":
        bound = reader.precision
        if bound > 2**62:  # bigint: every Avro long fits
            return values.cast(out_type), none
        fits = pc.and_(pc.greater_equal(values, -bound), pc.less(values, bound))
        redo = ~pc.fill_null(fits, True).to_numpy(zero_copy_only=False)
        return pc.if_else(fits, values, pa.scalar(None, pa.int64())).cast(out_type), redo
    if reader.kind in ("date", "epoch_timestamp"):
        return epoch_column(reader, values, out_type)
    converted = convert(reader, values)
    if converted is None:
        return None, none
    array, bad = converted
    return array.cast(out_type), (none if bad is None else bad.to_numpy(zero_copy_only=False))


def epoch_column(reader: ColumnReader, values: pa.Array, out_type: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Epoch days (``date``) or an integer timestamp scaled to microseconds, as the temporal converters read them
    (:mod:`cdcsync.sources.debezium.temporal`); Debezium's and pgjdbc's infinity sentinels, values out of
    Postgres' range and digits finer than the column keeps are the row decoder's."""
    import numpy as np
    import pyarrow as pa

    valid = values.is_valid().to_numpy(zero_copy_only=False)
    raw = values.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if reader.kind == "date":
        low, high, sentinels = MIN_DATE_DAYS, MAX_DATE_DAYS, DEBEZIUM_DATE_SENTINELS
        scaled = raw
        fits = (raw >= low) & (raw <= high)
    else:
        low, high, sentinels = MIN_TIMESTAMP_MICROS, TIMESTAMP_POSITIVE_INFINITY - 1, PGJDBC_TIMESTAMP_SENTINELS
        unit = reader.unit
        if unit > 0:  # scaled by multiplying: only values that cannot overflow, the rest are out of range anyway
            fits = (raw >= -(-low // unit)) & (raw <= high // unit)
            scaled = np.where(fits, raw, 0) * unit
        else:
            scaled = np.floor_divide(raw, -unit)
            fits = (scaled >= low) & (scaled <= high)
        fits &= scaled % reader.precision == 0
    # a sentinel is the same number in every unit (temporal.PGJDBC_TIMESTAMP_INFINITIES): compared before scaling
    redo = valid & ~(fits & ~np.isin(raw, np.array(sorted(sentinels), np.int64)))
    keep = valid & ~redo
    array = pa.array(np.where(keep, scaled, 0), pa.int64(), mask=~keep)
    if reader.kind == "date":
        return array.cast(pa.int32()).cast(out_type), redo
    return array.cast(out_type), redo


class KeyColumns:
    """The declared primary key read from a batch of Avro message keys of one writer schema: what a tombstone
    (a delete of its key) needs."""

    def __init__(self, columns: tuple[tuple[str, PgType], ...], writer: Any, names: dict[str, Any]) -> None:
        """:class:`Unsupported` when the key schema or a key column is not for this path."""
        self.columns = columns
        compiler = Compiler(names, columns, key=True)
        self.root = compiler.node(writer, "", ())
        if self.root.kind != "record":
            raise Unsupported("the key is not a record")
        self.readers = [compiler.readers.get(name) for name, _ in columns]

    def decode(
        self, keys: pa.BinaryArray, header: int, bad: np.ndarray, out_types: list[pa.DataType]
    ) -> tuple[list[pa.Array], pa.Array] | None:
        """The key columns of ``keys`` and the rows to redo (a key column missing or null, a value the batch path
        does not vouch for); None when the row decoder must read them all."""
        import pyarrow as pa

        walk = Walk.over(self.root, keys, header, bad)
        if walk is None:
            return None
        redo = walk.bad
        arrays = []
        for (name, _), reader, out_type in zip(self.columns, self.readers, out_types, strict=True):
            if reader is None:
                return None  # not in the key: every tombstone is skipped, which the row decoder says
            values, bad_values = raw_column(walk, (name,), reader)
            array, bad_array = converted_column(reader, values, out_type)
            if array is None:
                return None
            redo = redo | bad_values | bad_array | ~array.is_valid().to_numpy(zero_copy_only=False)
            arrays.append(array)
        return arrays, pa.array(redo, pa.bool_())
