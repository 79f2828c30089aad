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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

VERSION = "_cdc_version"


@dataclass
class SortedRows:
    """The rows of ``table`` in the order ``order`` (indices into it), a column copied in that order only when
    asked for. The collapse per key reads the key columns (and the TOASTable ones) in order and then keeps about
    a third of a task's rows: the other columns are copied once, for the kept rows alone (:meth:`kept`).
    ``columns`` holds the columns already in order (those read, and the ranked versions and carried values that
    replace the table's)."""

    table: pa.Table
    order: pa.Array
    columns: dict[str, pa.Array] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return len(self.order)

    def column(self, name: str) -> pa.Array:
        found = self.columns.get(name)
        if found is None:
            found = self.columns[name] = self.table.column(name).take(self.order).combine_chunks()
        return found

    def kept(self, mask: pa.Array) -> pa.Table:
        """The rows where ``mask`` (in this order) is true, as a table with ``table``'s columns."""
        import pyarrow as pa

        rows = self.order.filter(mask)
        arrays, fields = [], []
        for column_field in self.table.schema:
            name = column_field.name
            in_order = self.columns.get(name)
            if in_order is None:
                arrays.append(self.table.column(name).take(rows))
                fields.append(column_field)
            else:
                arrays.append(in_order.filter(mask))
                fields.append(column_field.with_type(in_order.type))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=self.table.schema.metadata))


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


def ranked_newest_first(table: pa.Table, primary_key: tuple[str, ...]) -> SortedRows | None:
    """``table`` ranked (:func:`rank_tombstones`) and in order by key, then by ``_cdc_version`` and ``_cdc_offset``
    descending (what :func:`cdcsync.sinks.postgres.newest_per_key` sorts by), in one sort by key and offset; None
    when that shortcut does not give the same order.

    Why: ranking sorted the rows by key and offset, then by version twice (decimal128 sorts, to rank the versions),
    and the collapse sorted them again by key and version: most of the staging's CPU. In a task's rows (one Kafka
    partition) a key's versions nearly always grow with the offset; then the offset order, reversed within each
    key, is the version order too, and a tombstone's rank is simply the version of the nearest earlier change of
    its key (carried forward). The shortcut checks that growth and declines otherwise (a re-snapshot below a
    streamed change, the same offset twice, null or floating keys), and the caller takes the general path."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    if n < 2 or "_cdc_offset" not in table.column_names or table.column("_cdc_offset").null_count:
        return None
    keys = [table.column(k) for k in primary_key]
    if any(key.null_count or pa.types.is_floating(key.type) or pa.types.is_null(key.type) for key in keys):
        return None
    order = pc.sort_indices(table, sort_keys=[*((k, "ascending") for k in primary_key), ("_cdc_offset", "ascending")])
    offsets = table.column("_cdc_offset").take(order).combine_chunks()
    new_group: pa.Array | None = None
    for key in keys:
        column = key.take(order).combine_chunks()
        differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
        new_group = differs if new_group is None else pc.or_(new_group, differs)
    assert new_group is not None
    starts = np.concatenate([[True], new_group.to_numpy(zero_copy_only=False)])
    if not pc.all(pc.or_(new_group, pc.greater(offsets.slice(1), offsets.slice(0, n - 1)))).as_py():
        return None  # the same offset twice in a key: only the general path orders those
    versions = table.column(VERSION).take(order).combine_chunks()
    rows = np.arange(n)
    group_start = np.maximum.accumulate(np.where(starts, rows, 0))
    last_valid = np.maximum.accumulate(np.where(versions.is_valid().to_numpy(zero_copy_only=False), rows, -1))
    carried = np.where(last_valid >= group_start, last_valid, -1)  # the key's nearest change so far, or none
    ranked = versions.take(pa.array(carried, mask=carried < 0)) if versions.null_count else versions
    # A change below the version carried to the row before it (same key): versions do not grow with the offset.
    fell = pc.fill_null(pc.less(versions.slice(1), ranked.slice(0, n - 1)), False)
    if pc.any(pc.and_(fell, pc.invert(new_group))).as_py():
        return None
    # Reverse each key's rows: position p of a key spanning [start, end) goes to start + end - 1 - p (its own
    # inverse), which turns offset-ascending into newest-first.
    group_end = np.append(np.flatnonzero(starts)[1:], n)[np.cumsum(starts) - 1]
    reversed_within = pa.array(group_start + group_end - 1 - rows)
    return SortedRows(table, order.take(reversed_within), {VERSION: ranked.take(reversed_within)})


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
