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
