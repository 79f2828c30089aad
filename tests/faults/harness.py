"""The fault suite's workload and checker, and the figures table it feeds.

The workload: a seeded stream of Debezium changes to ``orders`` (:func:`cdcsync.devstack.workload.generate`) on
one topic, read by one pipeline with the three kinds of sink a fault can hurt differently: a Postgres mirror
(``mirror``, merges are idempotent by ``_cdc_version``), a Postgres aggregation (``revenue``: sum and count per
customer, where a change applied twice shows) and a ClickHouse table (``orders_ch``, exactly once through the
ledger and insert tokens).

The checker compares every target with the state the stream leaves behind and reads the ledger:

* **lost**: mirror or ClickHouse rows missing, left over or different, aggregation groups short of rows or
  summing wrong, gaps in a sink's ledgered batch ids;
* **applied twice**: a batch id ledgered twice for a sink, aggregation groups counting rows twice, ClickHouse rows
  beyond those the ledger says its batches wrote (background merges are stopped, so the raw count is exact; a
  test that restarts ClickHouse stops them again at once, since a restarted server forgets it).

Every fault test records a :class:`Figures` row (:func:`record`) and asserts both are 0.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from cdcsync.devstack import workload
from tests.conftest import ClickHouseDatabase
from tests.e2e.conftest import Project, ledger_batches, mirror_rows
from tests.e2e.test_clickhouse_pipeline import (
    clickhouse_pipeline,
    clickhouse_rows,
    ledger_rows_written,
    raw_rows,
    stop_merges,
    with_clickhouse,
)

COLUMNS = list(workload.ORDERS_COLUMNS)
SINKS = ("mirror", "revenue", "orders_ch")
BOUND_S = 600.0
"""Upper bound on any wait in the fault tests; reaching it fails the test, it never decides a pass."""


@dataclass
class Figures:
    """One row of the figures table."""

    fault: str
    injected: int
    sent: int
    """Changes (inserts, updates, deletes) in the stream."""
    lost: int
    twice: int
    recover_s: float | None
    """From the end of the fault (the service back, the run restarted) until every target held every change."""


FIGURES: list[Figures] = []
"""Rows recorded by the tests run in this process; ``tests/faults/conftest.py`` hands each test's rows on with its
report, so the table (``tests/conftest.py``'s ``pytest_terminal_summary``) also has those of xdist's workers."""


def record(figures: Figures) -> Figures:
    FIGURES.append(figures)
    return figures


def figures_table(rows: list[Figures]) -> str:
    """The table as docs/operations.md keeps it (Markdown)."""
    lines = [
        "| fault | injected | changes sent | lost | applied twice | time to recover |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        recover = "-" if row.recover_s is None else f"{row.recover_s:.1f} s"
        lines.append(f"| {row.fault} | {row.injected} | {row.sent:,} | {row.lost} | {row.twice} | {recover} |")
    return "\n".join(lines)


@dataclass
class FaultWorkload:
    """The seeded stream, produced, and the project that reads it."""

    load: workload.Workload
    project: Project
    dsn: str
    clickhouse: ClickHouseDatabase
    pipeline: str
    sinks: tuple[str, ...] = SINKS

    @property
    def sent(self) -> int:
        return self.load.changes

    def run(self, *extra: str, check: bool = True, timeout: float = BOUND_S) -> Any:
        return self.project.cdcsync(
            "run", str(self.project.pipeline_file), "--available-now", *extra, check=check, timeout=timeout
        )

    def start(self, *extra: str) -> Any:
        return self.project.start("run", str(self.project.pipeline_file), "--available-now", *extra)

    def batches(self) -> int:
        return sum(len(ids) for ids in ledger_batches(self.dsn, self.pipeline).values())

    def wait_batches(self, at_least: int, process: Any | None = None) -> None:
        deadline = time.monotonic() + BOUND_S
        while self.batches() < at_least:
            assert process is None or process.poll() is None, "the run ended before the batches the test waits for"
            assert time.monotonic() < deadline, f"fewer than {at_least} batches ledgered after {BOUND_S}s"
            time.sleep(0.1)

    def moving_again(self, back_at: float, process: Any) -> float:
        """Seconds from ``back_at`` (the fault ended) until the running ``process`` ledgered its next batch."""
        self.wait_batches(self.batches() + 1, process)
        return time.monotonic() - back_at

    def finish(self, process: Any) -> str:
        """Wait for the run to drain the topic; it must exit 0. Returns its stderr."""
        _stdout, stderr = process.communicate(timeout=BOUND_S)
        assert process.returncode == 0, stderr[-4000:]
        return str(stderr)

    def check(self) -> tuple[int, int, list[str]]:
        """(lost, applied twice, what was wrong) over every target and the ledger."""
        lost, twice, problems = 0, 0, []
        expected = self.load.expected
        targets = [("mirror", lambda: mirror_rows(self.dsn, "app", "Orders Mirror", COLUMNS))]
        if "orders_ch" in self.sinks:
            targets.append(("orders_ch", lambda: clickhouse_rows(self.clickhouse)))
        for name, read in targets:
            actual = read()
            wrong = (actual.keys() ^ expected.keys()) | {
                key for key in actual.keys() & expected.keys() if actual[key] != expected[key]
            }
            lost += len(wrong)
            if wrong:
                problems.append(f"{name}: {len(wrong)} row(s) missing, left over or different")
        want = {customer: values[:2] for customer, values in workload.revenue_by_customer(expected).items()}
        with psycopg.connect(self.dsn) as conn:
            have = {
                row[0]: (row[1], row[2])
                for row in conn.execute("SELECT customer_id, revenue, orders FROM app.revenue_by_customer")
            }
        for customer in want.keys() | have.keys():
            (want_sum, want_n), (have_sum, have_n) = want.get(customer, (None, 0)), have.get(customer, (None, 0))
            if have_n > want_n:
                twice += 1
            elif have_n < want_n or have_sum != want_sum:
                lost += 1
        if lost + twice:
            problems.append(f"revenue: groups differ (lost {lost}, twice {twice} so far)")
        for sink, ids in ledger_batches(self.dsn, self.pipeline).items():
            repeated = sum(n - 1 for n in Counter(ids).values())
            gaps = len(set(range(max(ids) + 1)) - set(ids))
            twice, lost = twice + repeated, lost + gaps
            if repeated or gaps:
                problems.append(f"ledger of {sink}: {repeated} batch id(s) twice, {gaps} missing")
        # Rows the ledger says were written but the table lacks show in the FINAL comparison above; fewer raw rows
        # can also mean merges ran (a restarted server forgets SYSTEM STOP MERGES), so only a surplus counts here.
        surplus = 0
        if "orders_ch" in self.sinks:
            surplus = raw_rows(self.clickhouse) - ledger_rows_written(self.dsn, self.pipeline, "orders_ch")
        if surplus > 0:
            problems.append(f"orders_ch: {surplus} raw row(s) more than the ledger says its batches wrote")
            twice += surplus
        return lost, twice, problems

    def assert_exact(self, fault: str, injected: int, recover_s: float | None) -> Figures:
        """Record the figures row, then fail unless nothing was lost or applied twice."""
        lost, twice, problems = self.check()
        figures = record(Figures(fault, injected, self.sent, lost, twice, recover_s))
        assert (lost, twice) == (0, 0), problems
        assert set(ledger_batches(self.dsn, self.pipeline)) == set(self.sinks)
        return figures


def fault_pipeline(
    topic: str, database: str, *, max_offsets: int, clickhouse: bool = True, transform: bool = False
) -> dict[str, Any]:
    """Mirror, aggregation and (unless ``clickhouse`` is false) ClickHouse sinks on one topic; the name is unique
    (ClickHouse's migration ledger is shared by the session). Postgres sinks alone merge a batch while the next one
    stages (``run.overlap_merges``). ``transform``: the mirror reads the source through a SQL transform."""
    pipeline = clickhouse_pipeline(topic, database, with_mirror=True, max_offsets=max_offsets)
    if not clickhouse:
        del pipeline["sinks"]["orders_ch"]
    if transform:
        pipeline["transforms"] = {"all_orders": {"type": "sql", "sql": "SELECT * FROM orders", "primary_key": "id"}}
        pipeline["sinks"]["mirror"]["from"] = "all_orders"
    pipeline["name"] = f"fault_{uuid.uuid4().hex[:10]}"
    pipeline["sinks"]["revenue"] = {
        "type": "postgres_aggregate",
        "from": "orders",
        "schema": "app",
        "landing_table": "orders_state",
        "agg_table": "revenue_by_customer",
        "group_by": {"customer_id": {"type": "bigint"}},
        "aggregate": {"revenue": {"from": "amount", "fn": "sum"}, "orders": {"fn": "count"}},
    }
    return pipeline


def prepare_workload(
    make_project: Callable[[dict[str, Any]], Project],
    dsn: str,
    bootstrap: str,
    clickhouse: ClickHouseDatabase,
    topic: str,
    *,
    changes: int,
    keys: int,
    seed: int,
    max_offsets: int,
    clickhouse_sink: bool = True,
    transform: bool = False,
) -> FaultWorkload:
    """Generate and produce the seeded stream, write the project and apply its migrations; ClickHouse's background
    merges are stopped so its raw row count stays exact."""
    load = workload.generate(changes, keys, seed=seed, wrapped=True)
    workload.produce(bootstrap, topic, load.events)
    pipeline = fault_pipeline(
        topic, clickhouse.database, max_offsets=max_offsets, clickhouse=clickhouse_sink, transform=transform
    )
    project = with_clickhouse(make_project(pipeline), clickhouse)
    project.prepare()
    stop_merges(clickhouse)
    sinks = SINKS if clickhouse_sink else tuple(sink for sink in SINKS if sink != "orders_ch")
    return FaultWorkload(load, project, dsn, clickhouse, pipeline["name"], sinks)
