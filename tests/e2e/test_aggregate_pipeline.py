"""Kafka -> Spark -> postgres_aggregate, end to end, with Streamling's own two examples (its README, "Postgres
Aggregation Sink"): ``finance.transfer_log -> account_balances`` and ``trading.trade_log -> market_stats``, fed
with inserts, updates (of values and of group keys) and deletes, which Streamling itself cannot aggregate exactly.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from cdcsync.devstack import workload
from tests.e2e.conftest import Project, ledger_batches

ACCOUNTS = [f"acct-{n:03d}" for n in range(40)]
MARKETS = ["BTC-USD", "ETH-USD", "SOL-USD", "DOGE-EUR", "ADA-EUR"]


def pipeline(transfers_topic: str, trades_topic: str, max_offsets: int) -> dict[str, Any]:
    return {
        "name": "aggs",
        "sources": {
            "transfers": {
                "type": "kafka",
                "topic": transfers_topic,
                "primary_key": "transfer_id",
                "max_offsets_per_trigger": max_offsets,
                "columns": {"transfer_id": "bigint", "account": "text", "amount": "numeric(18,2)"},
            },
            "trades": {
                "type": "kafka",
                "topic": trades_topic,
                "primary_key": "trade_id",
                "max_offsets_per_trigger": max_offsets,
                "columns": {
                    "trade_id": "bigint",
                    "market": "varchar(100)",
                    "volume": "numeric(20,5)",
                    "price": "numeric(18,4)",
                },
            },
        },
        "sinks": {
            # Streamling's examples, key for key (batch_flush_interval and batch_size are accepted as there).
            "balances": {
                "type": "postgres_aggregate",
                "from": "transfers",
                "schema": "finance",
                "landing_table": "transfer_log",
                "agg_table": "account_balances",
                "primary_key": "transfer_id",
                "batch_flush_interval": "1s",
                "batch_size": 100,
                "group_by": {"account": {"type": "text"}},
                "aggregate": {"balance": {"from": "amount", "fn": "sum"}},
            },
            "market_stats": {
                "type": "postgres_aggregate",
                "from": "trades",
                "schema": "trading",
                "landing_table": "trade_log",
                "agg_table": "market_stats",
                "primary_key": "trade_id",
                "group_by": {"market": {"type": "varchar(100)"}},
                "aggregate": {
                    "trade_count": {"fn": "count"},
                    "total_volume": {"from": "volume", "fn": "sum", "type": "numeric(30,5)"},
                    "avg_price": {"from": "price", "fn": "avg"},
                },
            },
        },
    }


@dataclass
class Table:
    """A source table and the Debezium changes (JsonConverter, no schemas) it emitted; ``rows`` is its state."""

    key: str
    random_row: Callable[[random.Random], dict[str, Any]]
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    events: list[workload.ChangeEvent] = field(default_factory=list)
    lsn: int = 1_000

    def emit(self, op: str, key_id: int, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        self.lsn += 16
        value = {
            "before": before,
            "after": after,
            "source": {"connector": "postgresql", "lsn": self.lsn, "ts_ms": 1_700_000_000_000 + self.lsn},
            "op": op,
            "ts_ms": 1_700_000_000_000 + self.lsn,
        }
        key = json.dumps({self.key: key_id}).encode()
        self.events.append(workload.ChangeEvent(key, json.dumps(value).encode(), key_id, op, self.lsn))
        if op == "d":
            self.events.append(workload.ChangeEvent(key, None, key_id, None))

    def changes(self, rng: random.Random, count: int, next_id: int) -> int:
        """``count`` random inserts, updates (values and group keys) and deletes; returns the next free id."""
        for _ in range(count):
            roll = rng.random()
            if roll < 0.45 or not self.rows:
                row = {self.key: next_id, **self.random_row(rng)}
                self.rows[next_id] = row
                self.emit("c", next_id, None, row)
                next_id += 1
            elif roll < 0.85:
                key_id = rng.choice(list(self.rows))
                row = {self.key: key_id, **self.random_row(rng)}
                self.emit("u", key_id, None, row)
                self.rows[key_id] = row
            else:
                key_id = rng.choice(list(self.rows))
                del self.rows[key_id]
                self.emit("d", key_id, {self.key: key_id}, None)
        return next_id


def transfer(rng: random.Random) -> dict[str, Any]:
    amount = None if rng.random() < 0.05 else str(Decimal(rng.randint(-500_000, 500_000)).scaleb(-2))
    return {"account": rng.choice(ACCOUNTS), "amount": amount}


def trade(rng: random.Random) -> dict[str, Any]:
    return {
        "market": rng.choice(MARKETS),
        "volume": str(Decimal(rng.randint(1, 10**9)).scaleb(-5)),
        "price": None if rng.random() < 0.05 else str(Decimal(rng.randint(1, 10**8)).scaleb(-4)),
    }


def expected_balances(transfers: Table) -> dict[str, Decimal | None]:
    sums: dict[str, Decimal | None] = {}
    for row in transfers.rows.values():
        current = sums.get(row["account"])
        if row["amount"] is None:
            sums.setdefault(row["account"], None)
        else:
            sums[row["account"]] = (current or Decimal(0)) + Decimal(row["amount"])
    return sums


def expected_market_stats(trades: Table) -> dict[str, tuple[int, Decimal]]:
    stats: dict[str, list[Any]] = defaultdict(lambda: [0, Decimal(0)])
    for row in trades.rows.values():
        stats[row["market"]][0] += 1
        stats[row["market"]][1] += Decimal(row["volume"])
    return {market: (count, volume) for market, (count, volume) in stats.items()}


def assert_exact(dsn: str, transfers: Table, trades: Table) -> None:
    with psycopg.connect(dsn) as conn:
        balances = dict(conn.execute("SELECT account, balance FROM finance.account_balances").fetchall())
        assert balances == expected_balances(transfers)
        stats = conn.execute("SELECT market, trade_count, total_volume, avg_price FROM trading.market_stats").fetchall()
        assert {market: (count, volume) for market, count, volume, _ in stats} == expected_market_stats(trades)
        fresh_avg = dict(conn.execute("SELECT market, avg(price) FROM trading.trade_log GROUP BY market").fetchall())
        assert {market: avg for market, _, _, avg in stats} == fresh_avg
        landed = conn.execute("SELECT count(*) FROM finance.transfer_log").fetchone()
        assert landed == (len(transfers.rows),)


def produce(bootstrap: str, topics: tuple[str, str], transfers: Table, trades: Table, start: int = 0) -> None:
    workload.produce(bootstrap, topics[0], transfers.events[start:], partitions=2)
    workload.produce(bootstrap, topics[1], trades.events[start:], partitions=2)


@pytest.fixture()
def topics(topic_name: str) -> tuple[str, str]:
    return f"{topic_name}.transfers", f"{topic_name}.trades"


def test_streamling_examples_with_updates_and_deletes(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topics: tuple[str, str]
) -> None:
    rng = random.Random(7)
    transfers, trades = Table("transfer_id", transfer), Table("trade_id", trade)
    next_transfer = transfers.changes(rng, 4_000, 1)
    next_trade = trades.changes(rng, 4_000, 1)
    produce(kafka_bootstrap, topics, transfers, trades)
    project = make_project(pipeline(*topics, max_offsets=1_500))
    project.prepare()
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_exact(postgres_dsn, transfers, trades)
    status = project.cdcsync("status", str(project.pipeline_file)).stdout
    assert "finance.account_balances" in status and "trading.market_stats" in status  # rows there are groups

    # More changes, mostly to rows that exist now, plus re-sent old events: exact again, nothing counted twice.
    sent_transfers, sent_trades = len(transfers.events), len(trades.events)
    transfers.changes(rng, 2_000, next_transfer)
    trades.changes(rng, 2_000, next_trade)
    transfers.events += rng.sample(transfers.events[:sent_transfers], 300)
    trades.events += rng.sample(trades.events[:sent_trades], 300)
    workload.produce(kafka_bootstrap, topics[0], transfers.events[sent_transfers:], partitions=2)
    workload.produce(kafka_bootstrap, topics[1], trades.events[sent_trades:], partitions=2)
    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_exact(postgres_dsn, transfers, trades)


# `make test` covers this sink through tests/faults/test_run_killed.py (mirror, aggregation and ClickHouse in one
# workload, 5 kills); this single-sink variant runs in `make soak`.
@pytest.mark.soak
def test_sigkill_mid_stream_then_restart_stays_exact(
    make_project: Callable[[dict[str, Any]], Project], postgres_dsn: str, kafka_bootstrap: str, topics: tuple[str, str]
) -> None:
    rng = random.Random(31)
    transfers, trades = Table("transfer_id", transfer), Table("trade_id", trade)
    transfers.changes(rng, 12_000, 1)
    trades.changes(rng, 12_000, 1)
    produce(kafka_bootstrap, topics, transfers, trades)
    project = make_project(pipeline(*topics, max_offsets=600))
    project.prepare()

    process = project.start("run", str(project.pipeline_file), "--available-now")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if sum(len(ids) for ids in ledger_batches(postgres_dsn, "aggs").values()) >= 4:
            break
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before it could be killed; make the workload larger"
    time.sleep(random.uniform(0.0, 1.5))
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    killed_at = ledger_batches(postgres_dsn, "aggs")
    assert sum(len(ids) for ids in killed_at.values()) < 2 * 40, "the kill came after the stream was drained"

    project.cdcsync("run", str(project.pipeline_file), "--available-now")
    assert_exact(postgres_dsn, transfers, trades)
    for sink, ids in ledger_batches(postgres_dsn, "aggs").items():
        assert ids == list(range(len(ids))), f"sink {sink}: ledger batch ids are not 0..n-1, each once"
