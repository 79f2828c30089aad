"""Chains of primary-key changes (K0 -> K1 -> ... -> Kn, the large values left alone) against a real Postgres,
in every order and split over micro-batches that Kafka and Spark can produce.

Each move i is two units: the delete of K(i-1) with its key-move row (one Kafka message: they always share a
batch), and the create of Ki holding placeholders. The only order Kafka fixes is per key: the create of Ki comes
no later than the delete of Ki (same key, same partition). Every ordered split of the units into batches that
keeps it is one *schedule*; the sweep lands all schedules of a chain length side by side, each chain with its
own keys and versions, so a whole sweep costs as many merges as its longest schedule has batches."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_postgres_sink import PLACEHOLDER, change, key_moves, land, live, make_sink

Unit = tuple[str, int]
"""('d', i): the delete of K(i-1) and its key-move row to Ki; ('c', i): the create of Ki."""


def schedules(moves: int) -> Iterator[list[tuple[Unit, ...]]]:
    """Every ordered split of a chain's units into batches in which no delete of Ki precedes the create of Ki."""
    units = [(op, i) for i in range(1, moves + 1) for op in ("d", "c")]

    def ready(unit: Unit, placed: set[Unit]) -> bool:
        op, i = unit
        return op == "c" or i == 1 or ("c", i - 1) in placed

    def split(left: list[Unit], placed: set[Unit]) -> Iterator[list[tuple[Unit, ...]]]:
        if not left:
            yield []
            return
        for size in range(1, len(left) + 1):
            for batch in combinations(left, size):
                now = placed | set(batch)
                if all(ready(unit, now) for unit in batch):
                    rest = [unit for unit in left if unit not in batch]
                    for later in split(rest, now):
                        yield [batch, *later]

    yield from split(units, set())


def sweep(delete_mode: str, moves: int, dsn: str, tmp_path: Path, every: int = 1) -> int:
    """Land every ``every``-th schedule of a chain of ``moves`` key changes; returns how many were landed."""
    sink = make_sink(delete_mode, dsn, tmp_path)
    chains = [s for n, s in enumerate(schedules(moves)) if n % every == 0]
    stride = moves + 1

    def key(chain: int, step: int) -> int:
        return chain * stride + step

    def value(chain: int) -> tuple[str, bytes]:
        return f"chain {chain}", chain.to_bytes(4, "big")

    def rows(chain: int, unit: Unit) -> list[dict[str, object]]:
        op, i = unit  # move i happens at version key(chain, i): unique, and rising along the chain
        if op == "c":
            return [change("c", key(chain, i), key(chain, i), PLACEHOLDER, blob=PLACEHOLDER.encode())]
        return [
            change("d", key(chain, i - 1), key(chain, i), None, None),
            change("n", key(chain, i), key(chain, i), None, None),
        ]

    land(sink, 0, [change("c", key(c, 0), key(c, 0), value(c)[0], blob=value(c)[1]) for c in range(len(chains))])
    for batch in range(2 * moves):
        staged = [row for c, s in enumerate(chains) if batch < len(s) for unit in s[batch] for row in rows(c, unit)]
        if staged:
            land(sink, batch + 1, staged)
    found = live(sink)
    wrong = [
        (chain, schedule)
        for chain, schedule in enumerate(chains)
        if (lambda row: row is None or (row["Name"], bytes(row["blob"])) != value(chain))(found.get(key(chain, moves)))
    ]
    assert not wrong, f"{len(wrong)} of {len(chains)} schedules lost the values, e.g. {wrong[:3]}"
    assert set(found) == {key(c, moves) for c in range(len(chains))}
    assert key_moves(sink) == []
    return len(chains)


@pytest.mark.parametrize("delete_mode", ["hard", "soft"])
@pytest.mark.parametrize(
    ("moves", "every", "landed"),
    [(2, 1, 44), (3, 1, 1460), (4, 211, 417)],
    ids=["2 moves, all", "3 moves, all", "4 moves, every 211th"],
)
def test_every_schedule_of_a_chain_of_key_changes_ends_with_the_values(
    delete_mode: str, moves: int, every: int, landed: int, postgres_dsn: str, tmp_path: Path
) -> None:
    assert sweep(delete_mode, moves, postgres_dsn, tmp_path, every) == landed


@pytest.mark.soak
@pytest.mark.parametrize("delete_mode", ["hard", "soft"])
def test_every_schedule_of_four_key_changes_ends_with_the_values(
    delete_mode: str, postgres_dsn: str, tmp_path: Path
) -> None:
    assert sweep(delete_mode, 4, postgres_dsn, tmp_path) == 87788


def clickhouse_sweep(lengths: list[int], sink: Any, client: Any, every: int = 1) -> tuple[int, list[Any]]:
    """Land every ``every``-th schedule of chains of each length of ``lengths`` side by side into a ClickHouse sink
    (per batch, the deletes in one task and the creates in another, as two partitions would, then the driver's
    step after the tasks); returns how many chains landed and those that lost the values."""
    import datetime as dt

    import pyarrow as pa

    chains = [(moves, s) for moves in lengths for n, s in enumerate(schedules(moves)) if n % every == 0]
    stride = max(lengths) + 1

    def table(rows: list[tuple[int, str, int, str | None]], offset: int) -> pa.Table:
        n = len(rows)
        return pa.table(
            {
                "id": pa.array([r[0] for r in rows], pa.int64()),
                "body": pa.array([r[3] for r in rows], pa.string()),
                "_cdc_op": [r[1] for r in rows],
                "_cdc_version": pa.array([r[2] for r in rows], pa.decimal128(38, 0)),
                "_cdc_ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)] * n, pa.timestamp("us", "UTC")),
                "_cdc_topic": ["t.things"] * n,
                "_cdc_partition": pa.array([0] * n, pa.int32()),
                "_cdc_offset": pa.array(range(offset, offset + n), pa.int64()),
            }
        )

    offset = 0
    first = [(c * stride, "c", c * stride, f"chain {c}") for c in range(len(chains))]
    sink.stage_writer(0, "c").stage(table(first, offset))
    offset += len(first)
    for batch in range(2 * max(lengths)):
        tasks: list[list[tuple[int, str, int, str | None]]] = [[], []]  # by the key's parity: its partition
        for c, (_, schedule) in enumerate(chains):
            for op, i in schedule[batch] if batch < len(schedule) else ():
                if op == "c":
                    tasks[i % 2].append((c * stride + i, "c", c * stride + i, PLACEHOLDER))
                else:
                    tasks[(i - 1) % 2].append((c * stride + i - 1, "d", c * stride + i, None))
                    tasks[(i - 1) % 2].append((c * stride + i, "n", c * stride + i, None))
        writer = sink.stage_writer(batch + 1, "c")
        for rows in tasks:
            if rows:
                writer.stage(table(sorted(rows, key=lambda row: row[2]), offset))
                offset += len(rows)
        sink.follow_key_moves("c", batch + 1)
    found = dict(client.query("SELECT id, body FROM things FINAL WHERE NOT _is_deleted").result_rows)
    wrong = [(c, s) for c, (moves, s) in enumerate(chains) if found.get(c * stride + moves) != f"chain {c}"]
    assert set(found) == {c * stride + moves for c, (moves, _) in enumerate(chains)}
    return len(chains), wrong


def test_clickhouse_chains_of_two_and_three_key_changes_keep_the_values_in_every_schedule(
    clickhouse_database: Any, tmp_path: Path, postgres_dsn: str
) -> None:
    """Every schedule of two and three key changes in a row (44 + 1460), side by side in one sink; the middle
    keys' values often come only after they moved on (the first delete comes last, or a middle key's create and
    delete are in one task before it), and go on along the chain to its end. No link is left waiting."""
    from tests.integration.test_clickhouse_sink import _things_sink, key_move_links

    sink = _things_sink(clickhouse_database, tmp_path, postgres_dsn, {"id": "bigint", "body": "text"})
    landed, wrong = clickhouse_sweep([2, 3], sink, clickhouse_database.client())
    assert not wrong, f"{len(wrong)} of {landed} schedules lost the values, e.g. {wrong[:3]}"
    assert landed == 44 + 1460
    assert key_move_links(postgres_dsn) == []


@pytest.mark.soak
def test_clickhouse_every_schedule_of_four_key_changes_keeps_the_values(
    clickhouse_database: Any, tmp_path: Path, postgres_dsn: str
) -> None:
    from tests.integration.test_clickhouse_sink import _things_sink, key_move_links

    sink = _things_sink(clickhouse_database, tmp_path, postgres_dsn, {"id": "bigint", "body": "text"})
    landed, wrong = clickhouse_sweep([4], sink, clickhouse_database.client())
    assert not wrong, f"{len(wrong)} of {landed} schedules lost the values, e.g. {wrong[:3]}"
    assert landed == 87788
    assert key_move_links(postgres_dsn) == []


@pytest.mark.parametrize("delete_mode", ["hard", "soft"])
def test_a_value_the_middle_key_set_wins_over_the_first_keys_that_come_later(
    delete_mode: str, postgres_dsn: str, tmp_path: Path
) -> None:
    """7 -> 21 -> 31, and 21 changed one large value between the moves: 31 takes 21's new value and 7's other
    one, though 7's values come (its delete) after the delete of 21 and before the create of 31."""
    sink = make_sink(delete_mode, postgres_dsn, tmp_path)
    land(sink, 0, [change("c", 7, 10, "seven", blob=b"\x07")])
    land(sink, 1, [change("c", 21, 20, PLACEHOLDER, blob=PLACEHOLDER.encode()), change("u", 21, 25, "own")])
    land(sink, 2, [change("d", 21, 30, None, None), change("n", 31, 30, None, None)])
    land(sink, 3, [change("d", 7, 20, None, None), change("n", 21, 20, None, None)])
    land(sink, 4, [change("c", 31, 30, PLACEHOLDER, blob=PLACEHOLDER.encode())])
    row = live(sink)[31]
    assert (row["Name"], bytes(row["blob"])) == ("own", b"\x07")
    assert set(live(sink)) == {31} and key_moves(sink) == []
