"""Primary-key changes whose create holds TOAST placeholders: the key-move rows that pair them across partitions
and micro-batches.

Debezium's Postgres connector sends an UPDATE of a primary key as a delete of the old key (Kafka header
``__debezium.newkey``), its tombstone, and a create of the new key (header ``__debezium.oldkey``), all at the same
source position (one ``_cdc_version``). Under ``REPLICA IDENTITY DEFAULT`` the create holds Debezium's placeholder
for every large value the UPDATE left alone; those values are the old key's. The delete and the create are keyed
differently, so they may sit in different Kafka partitions, and Spark may read them in different micro-batches, in
either order.

The decoder turns the ``__debezium.newkey`` header of a delete into a *key-move row*
(:data:`~cdcsync.core.names.KEY_MOVE_OP`): the new key, the delete's version, nothing else. With it, the side that
merges the delete knows which key will need the old key's values, whichever comes first:

* **delete first**: the old key's values (from the batch, else from the target) are kept keyed by (new key,
  version): for Postgres sinks in ``cdcsync.key_moves`` (``templates/postgres/runtime/key_moves.sql.j2``), for
  ClickHouse sinks in the delete row itself, which carries them (:mod:`cdcsync.sinks.clickhouse_moves`). The
  create, merged later, takes them from there.
* **create first** (it lands holding the placeholder: the old key's values are not known yet, and the old key's
  stored row may be older than the change): the delete, merged later, replaces the placeholders the new key's row
  still holds. A placeholder in a target row can only come from such a move (an INSERT never sends one), so
  nothing else is touched, and a value set since (a later change of the new key) is kept.

* **a chain** (7 -> 21 -> 31 -> ..., the large values untouched): 21 is the new key of one move and the old key
  of the next, so its values may come only after it moved on. Values that come for a key once it is deleted go
  on to the key created at the version of that delete (a move's delete and create share one source position),
  and on from there, to the end of the chain (Postgres sinks). The link from a delete to the next key is the
  key-move row in the batch, or, later, the stash entry of the next key, kept (empty) until its values came.

Only the ``__debezium.newkey`` header crosses into Python (:func:`cdcsync.sources.kafka.decoder_input`): the old
key is not needed, because the create never reads the old key's stored row (it could be stale: the old key's
partition may lag).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcsync.core.names import KEY_MOVE_OP, OP_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa


def split(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(the key-move rows of ``table``, its changes)."""
    import pyarrow.compute as pc

    moves = pc.fill_null(pc.equal(table.column(OP_COLUMN), KEY_MOVE_OP), False)
    if not pc.any(moves).as_py():
        return table.slice(0, 0), table
    return table.filter(moves), table.filter(pc.invert(moves))
