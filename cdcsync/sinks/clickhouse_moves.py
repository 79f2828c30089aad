"""Primary-key changes into ClickHouse when the delete of the old key and the create of the new key are in
different tasks or micro-batches (:mod:`cdcsync.sinks.key_moves` says why this is needed and what the key-move
rows are).

A ReplacingMergeTree cannot keep a column's old value, and the old key's row is gone (merged away behind its delete
row) by the time a later batch brings the create. So the delete row carries the values: the task that inserts the
delete of an old key that moved (its key-move row names the new key) fills the delete row's placeholder columns
with the old key's values, from the changes before it in the task, else from the old key's stored row
(:func:`carry_into_deletes`). Then, with no key in common, the two halves meet through the version they share:

* a create (or a later change of its key in the task) still holding placeholders looks up the delete rows at its
  create's version (:func:`fill_from_deletes`, one query per task); the delete may be in an earlier batch or in
  another task of this batch that has already inserted it;
* after inserting its delete rows, a task corrects the rows of the new keys that landed before them holding the
  placeholder (:func:`correct_landed`, server side, at the rows' own versions: the row inserted last wins);
* and a task whose creates found nothing looks again once they are inserted: of two tasks of one batch, each
  inserts and then reads, so at least one sees the other's rows.

``OPTIMIZE ... FINAL CLEANUP`` removes delete rows, and ``append_only_mode: false`` writes none: a create that comes
after that keeps the placeholder (docs/clickhouse.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.config.toast import Placeholder

Key = tuple[Any, ...]


@dataclass(frozen=True)
class MovedDelete:
    """The delete of an old key whose key-move row names the new key."""

    old: Key
    new: Key
    version: int


def keys_of(table: pa.Table, primary_key: tuple[str, ...]) -> list[Key]:
    return list(zip(*(table.column(k).to_pylist() for k in primary_key), strict=True))


def moved_deletes(moves: pa.Table, changes: pa.Table, primary_key: tuple[str, ...]) -> list[MovedDelete]:
    """The deletes of ``changes`` that a key-move row of ``moves`` (same task) names the new key of."""
    if moves.num_rows == 0:
        return []
    new_at = dict(zip(moves.column("_cdc_version").to_pylist(), keys_of(moves, primary_key), strict=True))
    ops, versions = changes.column("_cdc_op").to_pylist(), changes.column("_cdc_version").to_pylist()
    return [
        MovedDelete(key, new_at[versions[i]], int(versions[i]))
        for i, key in enumerate(keys_of(changes, primary_key))
        if ops[i] == "d" and versions[i] in new_at and new_at[versions[i]] != key
    ]


def unavailable(table: pa.Table, toastable: tuple[tuple[str, Placeholder], ...]) -> dict[str, list[bool]]:
    """Per placeholder column, which values of ``table`` are the placeholder."""
    from cdcsync.sinks.postgres import placeholder_mask

    return {name: placeholder_mask(table.column(name), value).to_pylist() for name, value in toastable}


def values_before(
    table: pa.Table,
    wanted: dict[Key, int],
    primary_key: tuple[str, ...],
    toastable: tuple[tuple[str, Placeholder], ...],
) -> dict[Key, dict[str, Any]]:
    """For each key of ``wanted`` (key -> version), the values of its placeholder columns that its changes in
    ``table`` below that version set (the newest per column; deletes and placeholders set nothing)."""
    if not wanted:
        return {}
    keys = keys_of(table, primary_key)
    ops, versions = table.column("_cdc_op").to_pylist(), table.column("_cdc_version").to_pylist()
    values = {name: table.column(name).to_pylist() for name, _ in toastable}
    held = unavailable(table, toastable)
    rows = sorted(
        (
            (versions[i], i)
            for i, key in enumerate(keys)
            if key in wanted and ops[i] != "d" and versions[i] is not None and versions[i] < wanted[key]
        ),
        reverse=True,
    )
    known: dict[Key, dict[str, Any]] = {}
    for _, i in rows:
        found = known.setdefault(keys[i], {})
        for name in values:
            if name not in found and not held[name][i] and values[name][i] is not None:
                found[name] = values[name][i]
    return known


def placeholder_creates(
    table: pa.Table, primary_key: tuple[str, ...], toastable: tuple[tuple[str, Placeholder], ...]
) -> dict[Key, int]:
    """Key -> version of the newest create in ``table`` holding a placeholder: the new key of a key change."""
    held = unavailable(table, toastable)
    ops, versions = table.column("_cdc_op").to_pylist(), table.column("_cdc_version").to_pylist()
    created: dict[Key, int] = {}
    for i, key in enumerate(keys_of(table, primary_key)):
        if ops[i] == "c" and any(column[i] for column in held.values()):
            created[key] = max(created.get(key, 0), int(versions[i]))
    return created


def with_values(table: pa.Table, fills: dict[int, dict[str, Any]]) -> pa.Table:
    """``table`` with row index -> {column: value} set (Python values, of the column's type)."""
    import pyarrow as pa

    names = {name for fill in fills.values() for name in fill}
    for name in sorted(names):
        column = table.column(name)
        values = column.to_pylist()
        for index, fill in fills.items():
            if name in fill:
                values[index] = fill[name]
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, type=column.type))
    return table


def stored_rows(client: Any, sql: str, keys: Iterable[Key], binary: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """Rows of a query over keys (``keys`` parameter), UUIDs as text and byte columns as bytes."""
    return list(
        client.query(
            sql,
            parameters={"keys": sorted(set(keys), key=repr)},
            query_formats={"UUID": "string"},
            column_formats={name: "bytes" for name in binary},
        ).result_rows
    )


def live_values(
    rows: list[tuple[Any, ...]], width: int, schema: pa.Schema, toastable: tuple[tuple[str, Placeholder], ...]
) -> dict[Key, dict[str, Any]]:
    """From ``stored_values.sql.j2`` rows (key, ``_is_deleted``, placeholder columns): each live key's values that
    are neither NULL nor the placeholder."""
    import pyarrow as pa

    from cdcsync.sinks.postgres import placeholder_mask

    live: dict[Key, dict[str, Any]] = {}
    for row in rows:
        if row[width]:
            continue
        found = live.setdefault(tuple(row[:width]), {})
        for (name, placeholder), value in zip(toastable, row[width + 1 :], strict=True):
            if (
                value is not None
                and not placeholder_mask(pa.array([value], schema.field(name).type), placeholder)[0].as_py()
            ):
                found[name] = value
    return live


def carry_into_deletes(
    table: pa.Table,
    moved: list[MovedDelete],
    earlier: dict[Key, dict[str, Any]],
    stored: dict[Key, dict[str, Any]],
    primary_key: tuple[str, ...],
) -> tuple[pa.Table, dict[Key, dict[str, Any]]]:
    """Put the old key's values (``earlier`` in the task, else ``stored``) into each moved delete's row of
    ``table`` (collapsed per key); also returns them by old key."""
    at = {(m.old, m.version) for m in moved}
    ops, versions = table.column("_cdc_op").to_pylist(), table.column("_cdc_version").to_pylist()
    fills: dict[int, dict[str, Any]] = {}
    carried: dict[Key, dict[str, Any]] = {}
    for i, key in enumerate(keys_of(table, primary_key)):
        if ops[i] == "d" and versions[i] is not None and (key, int(versions[i])) in at:
            carried[key] = {**stored.get(key, {}), **earlier.get(key, {})}
            if carried[key]:
                fills[i] = carried[key]
    return (with_values(table, fills) if fills else table), carried


def fill_from_deletes(
    client: Any,
    sql: str,
    table: pa.Table,
    created: dict[Key, int],
    primary_key: tuple[str, ...],
    toastable: tuple[tuple[str, Placeholder], ...],
    binary: tuple[str, ...],
) -> tuple[pa.Table, list[int]]:
    """Fill the placeholders of the rows of ``table`` whose key was created by a key change (``created``: key ->
    the create's version) from the delete rows at those versions; also returns the rows still holding one."""
    held = unavailable(table, toastable)
    keys = keys_of(table, primary_key)
    ops = table.column("_cdc_op").to_pylist()
    wanted = [i for i, key in enumerate(keys) if key in created and ops[i] != "d" and any(c[i] for c in held.values())]
    if not wanted:
        return table, []
    names = [name for name, _ in toastable]
    rows = client.query(
        sql,
        parameters={"versions": sorted({created[keys[i]] for i in wanted})},
        query_formats={"UUID": "string"},
        column_formats={name: "bytes" for name in binary},
    ).result_rows
    carried: dict[int, dict[str, Any]] = {}
    for row in rows:
        found = carried.setdefault(int(row[0]), {})
        found.update({name: value for name, value in zip(names, row[1:], strict=True) if value is not None})
    fills: dict[int, dict[str, Any]] = {}
    left = []
    for i in wanted:
        values = carried.get(created[keys[i]], {})
        fill = {name: values[name] for name in names if held[name][i] and name in values}
        if fill:
            fills[i] = fill
        if any(held[name][i] and name not in fill for name in names):
            left.append(i)
    return (with_values(table, fills) if fills else table), left


def correct_landed(
    client: Any,
    rows_sql: str,
    correct_sql: str,
    moved: list[MovedDelete],
    carried: dict[Key, dict[str, Any]],
    schema: pa.Schema,
    primary_key: tuple[str, ...],
    toastable: tuple[tuple[str, Placeholder], ...],
    binary: tuple[str, ...],
    settings: dict[str, Any],
) -> None:
    """Rewrite the newest rows of the moved deletes' new keys that hold placeholders the old key's values
    (``carried``) fill: they landed before the delete came."""
    import pyarrow as pa

    from cdcsync.sinks.postgres import placeholder_mask

    wanted = [m for m in moved if carried.get(m.old)]
    if not wanted:
        return
    width = len(primary_key)
    newest = {tuple(row[:width]): row for row in stored_rows(client, rows_sql, (m.new for m in wanted), binary)}
    corrections = []
    for move in wanted:
        row = newest.get(move.new)
        if row is None or row[width + 1] or int(row[width]) < move.version:
            continue
        flags = []
        for (name, placeholder), value in zip(toastable, row[width + 2 :], strict=True):
            stored = pa.array([value], type=schema.field(name).type)
            if name in carried[move.old] and placeholder_mask(stored, placeholder).to_pylist()[0]:
                flags.append(name)
        if flags:
            corrections.append((move.new, move.old, move.version, flags))
    if corrections:
        client.raw_query(correct_sql, parameters={"moves": corrections}, settings=settings)
