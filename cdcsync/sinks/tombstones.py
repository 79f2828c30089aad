"""Kafka tombstones as deletes: what a compacted topic still says about a deleted row.

Debezium follows each delete event with a tombstone (the key with a null value). Once the log cleaner has run,
the delete event is gone (an older record of its key) and the tombstone alone says the key was deleted, until
``delete.retention.ms`` passes. A pipeline that reads that part of the topic only later must still delete the row.

A tombstone carries no ``source`` block, so it has no commit position of its own (the decoder leaves its
``_cdc_version`` null). What is known is its place in the key's partition: it comes after every change of the key
at a lower offset and before every change at a higher one, and commit positions grow the same way. So it ranks:

1. **within the task that read it** (:func:`rank_tombstones`): at the version of the newest change of its key at a
   lower offset (normally the delete event it follows: the two are then one delete; the offset breaks the tie in
   :func:`cdcsync.sinks.postgres.newest_per_key`). A change at a higher offset outranks it anyway.
2. **otherwise, against the target** (:func:`with_stored_versions`, one query per task and sink, only for such
   "lone" tombstones): one above the version the target holds for the key. Every stored change came from a lower
   offset (a partition lands in offset order), so the delete's real commit position is at least that; a change
   committed after the delete (a re-insert) ranks higher still and lands, and an older change replayed later
   (version at most the stored one) cannot bring the row back. A key the target does not hold (or holds deleted)
   needs nothing: the tombstone is dropped.

What stays open is written down in docs/operations.md ("Retention and compaction"): a lone tombstone cannot outrank
a dead letter of the key that is newer than the stored row (its real position is unknown), and a pipeline reset
that reads a tombstone again after a later re-insert of the key has landed removes that row until the re-insert is
read again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

VERSION = "_cdc_version"


def rank_tombstones(table: pa.Table, primary_key: tuple[str, ...]) -> pa.Table:
    """Give each tombstone (a null ``_cdc_version``) of ``table`` (one task's changes) the version of the newest
    change of its key at a lower offset; those without one stay null (lone).

    Vectorised (a task holds hundreds of thousands of rows, a tenth of them tombstones; a Python loop over them
    was a fifth of the workers' CPU): the rows sorted by key and offset, each version replaced by its rank among
    the versions (0 for a tombstone), the ranks offset by their key group's number so that one running maximum over
    the sorted rows never reaches into a previous group. At a tombstone that maximum is the rank of its key's newest
    version so far (0: none, the tombstone stays lone)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    versions = table.column(VERSION)
    if versions.null_count == 0 or "_cdc_offset" not in table.column_names:
        return table
    versions = versions.combine_chunks()
    n = table.num_rows
    order = pc.sort_indices(table, sort_keys=[*((k, "ascending") for k in primary_key), ("_cdc_offset", "ascending")])
    in_order = versions.take(order)
    tombstone = pc.is_null(in_order)
    by_version = pc.sort_indices(in_order)  # tombstones last
    ranks = pc.if_else(tombstone, 0, pc.add(pc.sort_indices(by_version), 1).cast(pa.int64()))
    new_group: pa.Array | None = None
    for key in primary_key:
        column = table.column(key).combine_chunks().take(order)
        later, earlier = column.slice(1), column.slice(0, n - 1)
        if pa.types.is_null(column.type):  # every key null (Arrow typed it so): one group
            differs = pa.array([False] * (n - 1), pa.bool_())
        else:  # null keys group together, as equal Python tuples did
            both_null = pc.and_(pc.is_null(later), pc.is_null(earlier))
            differs = pc.if_else(both_null, False, pc.fill_null(pc.not_equal(later, earlier), True))
        differs = pa.concat_arrays([pa.array([True]), differs.cast(pa.bool_())])
        new_group = differs if new_group is None else pc.or_(new_group, differs)
    assert new_group is not None
    base = pc.multiply(pc.cumulative_sum(new_group.cast(pa.int64())), n + 1)
    newest = pc.subtract(pc.cumulative_max(pc.add(base, ranks)), base)
    by_rank = pa.concat_arrays([pa.nulls(1, versions.type), in_order.take(by_version)])
    ranked = pc.if_else(tombstone, by_rank.take(newest), in_order)
    values = ranked.take(pc.sort_indices(order))
    return table.set_column(table.schema.get_field_index(VERSION), VERSION, values)


def lone(table: pa.Table) -> pa.Array | None:
    """Where ``table`` (collapsed per key) holds lone tombstones, or None when it holds none."""
    import pyarrow.compute as pc

    versions = table.column(VERSION)
    return pc.is_null(versions) if versions.null_count else None


def with_stored_versions(
    table: pa.Table, mask: pa.Array, lookup: Callable[[pa.Table], Iterable[tuple[int, Any]]]
) -> pa.Table:
    """``table`` with its lone tombstones (``mask``) ranked one above the version the target holds for the key.

    ``lookup`` gets the lone rows and yields (index among them, the stored version + 1) for each key the target
    holds live; the other lone tombstones are dropped."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = pc.indices_nonzero(mask).to_pylist()
    values = table.column(VERSION).to_pylist()
    for index, version in lookup(table.filter(mask)):
        values[rows[index]] = version
    versions = pa.array(values, type=table.column(VERSION).type)
    table = table.set_column(table.schema.get_field_index(VERSION), VERSION, versions)
    return table.filter(pc.is_valid(versions))
