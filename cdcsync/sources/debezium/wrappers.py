"""JsonConverter's schema wrapper, cut off on the JVM before the messages cross into Python.

Why: a schema-wrapped message (``{"schema":<schema>,"payload":<payload>}``, Kafka Connect's default) is about
2.9 KB, of which the schema, byte-identical in every message of a table, is about 2.5 KB. Every byte of it is
copied from Spark's rows into Arrow, sent over the socket to the Python workers and read there, only for the
decoder to check it equals the first message's and slice it off. So the JVM does the check and the slicing
(:func:`cdcsync.sources.kafka.decoder_input`): for each *wrapper* the driver knows (the bytes
``{"schema":<schema>,"payload":``, at most :data:`MAX_WRAPPERS`), a message that starts with exactly those bytes
and ends with ``}`` crosses as its payload alone, with the wrapper's index in :data:`WRAPPER_COLUMN`; any other
message (another schema, no wrapper, a tombstone, a malformed one) crosses whole with a null index. Message keys
(about 170 bytes wrapped, against the payload's ``{"id":8}``) are cut the same way, beside
:data:`KEY_WRAPPER_COLUMN`.

The cut loses nothing: a cut message is its wrapper, its payload and ``}``, so :func:`restored` gives back every
original byte, for the row decoder and for dead letters. The decoder reads a batch cut with one wrapper as it read
a batch whose messages all began with one known schema: that is the rule :func:`~.json._wrapped_schema` applies
to whole messages, moved to the JVM, and byte for byte. A wrapper is only ever learned from a message whose
schema parses as a JSON object (:func:`~.json.wrapper_prefix`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

WRAPPER_COLUMN = "value_wrapper"
"""Beside ``value``: the index of the wrapper cut off it (the JVM's int; in Python a dictionary column whose
dictionary holds the wrappers themselves, :func:`with_wrappers`), null when ``value`` is the whole message."""
KEY_WRAPPER_COLUMN = "key_wrapper"
"""The same for ``key``."""
CUT_COLUMNS = (("value", WRAPPER_COLUMN), ("key", KEY_WRAPPER_COLUMN))
"""Each column that may be cut, and its wrapper column."""
WRAPPED_PREFIX = b'{"schema":'
PAYLOAD_MARK = b',"payload":'
MAX_WRAPPERS = 6
"""Wrappers a source cuts with at once (the newest learned): a table's value and key schemas, and a few more while
its schema changes."""


def with_wrappers(batch: pa.RecordBatch, wrappers: tuple[bytes, ...]) -> pa.RecordBatch:
    """The JVM's batch with its wrapper indices as dictionary columns over ``wrappers``, so that the batch
    carries what it needs to restore its messages wherever it goes."""
    import pyarrow as pa

    for _, wrapper_column in CUT_COLUMNS:
        names = batch.schema.names
        if wrapper_column not in names:
            continue
        at = names.index(wrapper_column)
        indices = batch.column(at)
        if not pa.types.is_dictionary(indices.type):
            column = pa.DictionaryArray.from_arrays(indices.cast(pa.int32()), pa.array(wrappers, pa.binary()))
            batch = batch.set_column(at, wrapper_column, column)
    return batch


def restored(values: pa.Array, wrapper: pa.Array | None) -> pa.Array:
    """The whole messages: a cut one is its wrapper, its payload and ``}``; the others as they are."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if wrapper is None or wrapper.null_count == len(wrapper):
        return values
    prefixes = wrapper.dictionary.take(wrapper.indices)
    values = values.cast(pa.binary()) if values.type != pa.binary() else values
    joined = pc.binary_join_element_wise(prefixes, values, pa.scalar(b"}"), pa.scalar(b""))
    return pc.if_else(pc.is_valid(wrapper), joined, values)


def restored_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with whole messages and keys, without wrapper columns (as if nothing had been cut)."""
    for column, wrapper_column in CUT_COLUMNS:
        names = batch.schema.names
        if wrapper_column in names:
            at = names.index(column)
            whole = restored(batch.column(at), batch.column(names.index(wrapper_column)))
            batch = batch.set_column(at, column, whole).drop_columns([wrapper_column])
    return batch


def one_wrapper(wrapper: pa.Array) -> bytes | None:
    """The wrapper every one of these messages was cut with, when they were all cut with the same one."""
    import pyarrow.compute as pc

    if not len(wrapper) or wrapper.null_count:
        return None
    bounds = pc.min_max(wrapper.indices)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low != high:
        return None
    found: bytes = wrapper.dictionary[low].as_py()
    return found
