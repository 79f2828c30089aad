"""Primary-key changes into ClickHouse when the delete of the old key and the create of the new key are in
different tasks or micro-batches, and chains of them (:mod:`cdcsync.sinks.key_moves` says why this is needed and
what the key-move rows are).

A ReplacingMergeTree cannot keep a column's old value, and the old key's row is gone (merged away behind its delete
row) by the time a later batch brings the create. So the delete row carries the values: the task that inserts the
delete of an old key that moved (its key-move row names the new key) fills the delete row's placeholder columns
with the old key's values, from the changes before it in the task, else from the old key's stored row
(:func:`carry_into_deletes`). The delete row is the old key's newest row, so no merge removes it.

What ties that delete row to the new key is only the key-move row, which the table cannot keep: a create row at
the same version is merged away as soon as the new key changes again, or never inserted (collapsed behind a later
change of its key in the same task). So the task records a **link** per moved delete, (new key, version, old key),
in Postgres' ``cdcsync.key_moves`` (:func:`record_links`). A task's create whose delete came first finds its
link and takes the values before its insert (:func:`fill_from_links`). After every batch the driver passes the
values on (:func:`pass_on`), in bulk, with no task running beside it: one read of every stored row of the pending
links' keys (``moved_rows.sql.j2``, not ``FINAL``, which hides delete rows), then, in version order,

* a new key whose newest row (at or after the move) still holds the placeholder takes the old key's values;
* a new key that has moved on itself (its newest row is its own delete, without the values: they came after it
  moved) takes them on that delete row, which is the old key of the next link, so the values go on along a chain
  7 -> 21 -> 31 -> ... to its end, whatever the batches and their order;

and one insert of those rows again, each at its own version (ReplacingMergeTree keeps the row inserted last among
rows of one version). A link goes once its new key's row has taken the values; one whose old key's values never
come (it held placeholders itself) or whose new key never comes stays, as in a Postgres sink.

``OPTIMIZE ... FINAL CLEANUP`` removes delete rows, and ``append_only_mode: false`` writes none: a create that comes
after that keeps the placeholder (docs/clickhouse.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cdcsync.config.clickhouse_types import DELETED_COLUMN as DELETED
from cdcsync.config.clickhouse_types import TS_COLUMN
from cdcsync.config.clickhouse_types import VERSION_COLUMN as VERSION

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


def creates_holding_placeholders(table: pa.Table, toastable: tuple[tuple[str, Placeholder], ...]) -> pa.Array:
    """Which rows of ``table`` are creates holding Debezium's placeholder: the new keys of key changes (an INSERT
    never holds one). Found with Arrow: such rows are rare, and every task asks."""
    import functools

    import pyarrow.compute as pc

    from cdcsync.sinks.postgres import placeholder_mask

    held = functools.reduce(pc.or_, [placeholder_mask(table.column(name), value) for name, value in toastable])
    return pc.and_(pc.equal(table.column("_cdc_op"), "c"), held)


def placeholder_creates(table: pa.Table, primary_key: tuple[str, ...], held: pa.Array) -> dict[Key, int]:
    """Key -> version of the newest create in ``table`` holding a placeholder (``held``, from
    :func:`creates_holding_placeholders`): the new key of a key change."""
    if table.num_rows == 0:
        return {}
    creates = table.filter(held)
    created: dict[Key, int] = {}
    for key, version in zip(keys_of(creates, primary_key), creates.column("_cdc_version").to_pylist(), strict=True):
        created[key] = max(created.get(key, 0), int(version))
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
) -> pa.Table:
    """Put the old key's values (``earlier`` in the task, else ``stored``) into each moved delete's row of
    ``table`` (collapsed per key)."""
    at = {(m.old, m.version) for m in moved}
    ops, versions = table.column("_cdc_op").to_pylist(), table.column("_cdc_version").to_pylist()
    fills: dict[int, dict[str, Any]] = {}
    for i, key in enumerate(keys_of(table, primary_key)):
        if ops[i] == "d" and versions[i] is not None and (key, int(versions[i])) in at:
            carried = {**stored.get(key, {}), **earlier.get(key, {})}
            if carried:
                fills[i] = carried
    return with_values(table, fills) if fills else table


@dataclass(frozen=True)
class Link:
    """A primary-key change as the driver follows it: the new key, the move's version, the old key."""

    new: Key
    version: int
    old: Key


def key_json(primary_key: tuple[str, ...], key: Key) -> str:
    """A key as the JSON object ``cdcsync.key_moves`` holds (:func:`key_from_json` reads it back)."""
    return json.dumps(dict(zip(primary_key, key, strict=True)), sort_keys=True, default=str)


def key_from_json(value: dict[str, Any], primary_key: tuple[str, ...], key_types: tuple[str, ...]) -> Key:
    """The key of a :func:`key_json` object, each value as clickhouse-connect binds its ClickHouse type."""

    def typed(raw: Any, ch_type: str) -> Any:
        if not isinstance(raw, str):
            return raw
        if ch_type.startswith("Decimal"):
            return Decimal(raw)
        if ch_type.startswith("DateTime"):
            return datetime.fromisoformat(raw)
        if ch_type.startswith("Date"):
            return date.fromisoformat(raw)
        return raw

    return tuple(typed(value[name], ch_type) for name, ch_type in zip(primary_key, key_types, strict=True))


def record_links(
    dsn: str, sql: str, pipeline: str, sink: str, primary_key: tuple[str, ...], moved: list[MovedDelete]
) -> None:
    """Executor side: keep a link per moved delete (after the task's insert); recording one again changes nothing."""
    import psycopg

    rows = [
        {
            "pipeline": pipeline,
            "sink": sink,
            "key": key_json(primary_key, m.new),
            "version": m.version,
            "old_key": key_json(primary_key, m.old),
        }
        for m in moved
    ]
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.executemany(sql, rows)


def links_of(
    dsn: str,
    sql: str,
    pipeline: str,
    sink: str,
    primary_key: tuple[str, ...],
    key_types: tuple[str, ...],
    created: dict[Key, int],
) -> list[Link]:
    """Executor side: the links recorded for the keys of ``created`` (key -> its create's version) at that
    version: their moves' deletes have landed (in an earlier batch, or in a task of this one that went first)."""
    import psycopg

    names = {"pipeline": pipeline, "sink": sink, "keys": [key_json(primary_key, key) for key in created]}
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(sql, names).fetchall()
    links = [
        Link(key_from_json(new, primary_key, key_types), int(version), key_from_json(old, primary_key, key_types))
        for new, version, old in found
    ]
    return [link for link in links if created.get(link.new) == link.version]


def fill_from_links(
    client: Any,
    rows_sql: str,
    table: pa.Table,
    links: list[Link],
    columns: tuple[str, ...],
    primary_key: tuple[str, ...],
    toastable: tuple[tuple[str, Placeholder], ...],
    binary: tuple[str, ...],
) -> pa.Table:
    """Executor side, before the insert: the rows of ``table`` (collapsed) whose key a move created take the
    values its old key's delete row carries, where they still lack them, so that a create whose delete came
    first never shows the placeholder. What is not there yet the driver passes on after the batch."""
    if not links:
        return table
    names = (*columns, VERSION, DELETED, TS_COLUMN)
    newest = _newest_rows(
        stored_rows(client, rows_sql, {link.old for link in links}, binary), names, primary_key, toastable
    )
    carried = {link.new: values for link in links if (values := _carried(newest.get(link.old), link, toastable))}
    held = unavailable(table, toastable)
    deleted = [op == "d" for op in table.column("_cdc_op").to_pylist()]
    fills: dict[int, dict[str, Any]] = {}
    for i, key in enumerate(keys_of(table, primary_key)):
        values = carried.get(key, {})
        fill = {
            name: values[name]
            for name, placeholder in toastable
            if name in values
            and (held[name][i] or (deleted[i] and not known(table.column(name)[i].as_py(), placeholder)))
        }
        if fill:
            fills[i] = fill
    return with_values(table, fills) if fills else table


def _carried(old: dict[str, Any] | None, link: Link, toastable: tuple[tuple[str, Placeholder], ...]) -> dict[str, Any]:
    """The values the old key's newest row carries for ``link``: only a delete row at the move's version does."""
    if old is None or not old[DELETED] or int(old[VERSION]) != link.version:
        return {}
    return {name: old[name] for name, placeholder in toastable if known(old[name], placeholder)}


def is_placeholder(value: Any, placeholder: Placeholder) -> bool:
    """Whether a value read back from ClickHouse (an array as a list) is Debezium's placeholder."""
    if isinstance(placeholder, tuple):
        return value is not None and tuple(value) == placeholder
    return bool(value == placeholder)


def known(value: Any, placeholder: Placeholder) -> bool:
    """Whether a delete row's column carries a value: a value stored out of line is never empty, while a delete
    row that carries none holds NULL, an empty array (ClickHouse's default) or the placeholder."""
    return bool(value) and not is_placeholder(value, placeholder)


def pass_on(
    client: Any,
    links: list[Link],
    rows_sql: str,
    target: tuple[str, str],
    columns: tuple[str, ...],
    primary_key: tuple[str, ...],
    toastable: tuple[tuple[str, Placeholder], ...],
    binary: tuple[str, ...],
    token: str,
) -> list[Link]:
    """Driver side: pass the old keys' values on to the new keys along ``links`` (all of a sink's pending ones),
    in version order, so along a chain in one pass: one read of every row of the links' keys (``rows_sql``: the
    business ``columns``, then ``_version``, ``_is_deleted``, ``_cdc_ts``), one insert of the rows that took
    values, each at its own version (the row inserted last wins among rows of one version). ``binary``: columns
    read as bytes. Returns the links whose values have gone on."""
    names = (*columns, VERSION, DELETED, TS_COLUMN)
    keys = {key for link in links for key in (link.new, link.old)}
    newest = _newest_rows(stored_rows(client, rows_sql, keys, binary), names, primary_key, toastable)
    changed: dict[Key, dict[str, Any]] = {}
    done: list[Link] = []
    for link in sorted(links, key=lambda link: link.version):
        old, new = newest.get(link.old), newest.get(link.new)
        if old is None or not old[DELETED] or int(old[VERSION]) != link.version:
            done.append(link)  # the old key came back since: its delete row, and so the values, are gone
            continue
        have = _carried(old, link, toastable)
        if not have or new is None or int(new[VERSION]) < link.version:
            continue  # the values, or the new key, are still to come
        for name, held in toastable:
            if name in have and (is_placeholder(new[name], held) or (new[DELETED] and not known(new[name], held))):
                new[name] = have[name]  # in place: a later link from this key (it moved on) passes it further
                changed[link.new] = new
        done.append(link)
    if changed:
        data = [[row[name] for name in names] for row in changed.values()]
        digest = hashlib.sha256(repr(data).encode()).hexdigest()[:16]
        client.insert(
            target[1],
            data,
            column_names=list(names),
            database=target[0],
            settings={"insert_deduplication_token": f"{token}/{digest}"},
        )
    return done


def _newest_rows(
    rows: list[tuple[Any, ...]],
    names: tuple[str, ...],
    primary_key: tuple[str, ...],
    toastable: tuple[tuple[str, Placeholder], ...],
) -> dict[Key, dict[str, Any]]:
    """Each key's newest row (by ``name``), as ``FINAL`` would show it but delete rows included. Rows of one
    version differ only where a later one took values an earlier one lacked: what any of them knows is kept."""
    newest: dict[Key, dict[str, Any]] = {}
    for values in rows:
        row = dict(zip(names, values, strict=True))
        key = tuple(row[name] for name in primary_key)
        held = newest.get(key)
        if held is None or row[VERSION] > held[VERSION]:
            newest[key] = row
        elif row[VERSION] == held[VERSION]:
            for name, placeholder in toastable:
                if not known(held[name], placeholder) and known(row[name], placeholder):
                    held[name] = row[name]
    return newest
