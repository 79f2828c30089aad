"""``make demo``: the whole loop a new user would run by hand, then proof that the mirrors equal the source.

1. ``cdcsync dev up``: embedded Postgres and a KRaft Kafka broker, no Docker;
2. ``cdcsync validate`` / ``init`` / ``migrate`` for ``examples/shop.yaml``;
3. a few thousand Debezium changes (inserts, updates, deletes), some malformed messages and some stale replays
   produced to ``shop.public.orders``;
4. ``cdcsync run --available-now`` with the live view;
5. a summary of the target tables, checked row by row against the state the changes leave the source in.

Running it again is safe: the same changes are produced again, and the mirrors do not move.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cdcsync.config.load import load_pipeline
from cdcsync.config.settings import load_settings
from cdcsync.devstack import workload

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "examples" / "shop.yaml"
CHANGES, KEYS, SEED = 5_000, 2_000, 42

console = Console()


def cdcsync(*args: str) -> None:
    command = [sys.executable, "-m", "cdcsync", *args]
    console.print(f"\n[bold cyan]$ cdcsync {' '.join(args)}[/]")
    completed = subprocess.run(command, cwd=ROOT, env=os.environ.copy())
    if completed.returncode != 0:
        console.print(f"[bold red]cdcsync {args[0]} failed with exit code {completed.returncode}[/]")
        sys.exit(completed.returncode)


def fetch(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def main() -> None:
    pipeline = load_pipeline(PIPELINE)
    settings = load_settings()
    source = pipeline.sources["orders"]

    cdcsync("dev", "up")
    cdcsync("validate", str(PIPELINE.relative_to(ROOT)))
    cdcsync("init", str(PIPELINE.relative_to(ROOT)))
    cdcsync("migrate", str(PIPELINE.relative_to(ROOT)))

    load = workload.generate(CHANGES, KEYS, seed=SEED, wrapped=True)
    malformed = workload.malformed_events(wrapped=True)
    replays = workload.stale_replays(load, 200, seed=SEED)
    console.print(
        f"\n[bold]producing[/] {load.changes:,} Debezium changes ({load.counts['c']:,} inserts, "
        f"{load.counts['u']:,} updates, {load.counts['d']:,} deletes), {len(malformed)} malformed messages and "
        f"{len(replays)} stale replays to [cyan]{source.topic}[/]"
    )
    workload.produce(settings.bootstrap_servers, source.topic, [*load.events, *malformed, *replays])

    cdcsync("run", str(PIPELINE.relative_to(ROOT)), "--available-now")
    summarise(settings.postgres_dsn, load.expected)


def summarise(dsn: str, expected: dict[int, dict[str, Any]]) -> None:
    columns = list(workload.ORDERS_COLUMNS)
    quoted = ", ".join(f'"{c}"' for c in columns)
    mirror = {row[0]: dict(zip(columns, row, strict=True)) for row in fetch(dsn, f"SELECT {quoted} FROM app.orders")}
    audit = fetch(dsn, "SELECT count(*), count(*) FILTER (WHERE _cdc_deleted) FROM app.orders_with_deleted")[0]
    dead = fetch(dsn, "SELECT reason, count(*) FROM cdcsync.dead_letters WHERE pipeline = 'shop' GROUP BY 1 ORDER BY 1")
    ledger = fetch(dsn, "SELECT sink, count(*), sum(rows_written) FROM cdcsync.batch_ledger GROUP BY 1 ORDER BY 1")
    revenue = {
        row[0]: row[1:]
        for row in fetch(dsn, "SELECT customer_id, revenue, orders, largest, avg_amount FROM app.revenue_by_customer")
    }

    table = Table(title="target tables", title_justify="left")
    for column in ("table", "rows", "note"):
        table.add_column(column)
    table.add_row("app.orders", f"{len(mirror):,}", "hard deletes: one row per live key")
    table.add_row("app.orders_with_deleted", f"{audit[0]:,}", f"soft deletes: {audit[1]:,} flagged _cdc_deleted")
    table.add_row("app.revenue_by_customer", f"{len(revenue):,}", "groups: sum, count, avg, max per customer_id")
    table.add_row("cdcsync.dead_letters", f"{sum(n for _, n in dead):,}", "; ".join(f"{n} x {r[:40]}" for r, n in dead))
    for sink, batches, rows in ledger:
        table.add_row(f"cdcsync.batch_ledger, sink {sink}", f"{batches:,} batches", f"{rows:,} changes applied")
    console.print()
    console.print(table)

    sample = Table(title="app.orders (first 5 rows)", title_justify="left")
    for column in columns:
        sample.add_column(column)
    for key in sorted(mirror)[:5]:
        sample.add_row(*(str(mirror[key][c]) for c in columns))
    console.print(sample)

    top = Table(title="app.revenue_by_customer (top 5 by revenue)", title_justify="left")
    for column in ("customer_id", "revenue", "orders", "largest", "avg_amount"):
        top.add_column(column)
    for customer, values in sorted(revenue.items(), key=lambda item: -(item[1][0] or 0))[:5]:
        top.add_row(str(customer), *(str(v) for v in values[:3]), f"{values[3]:.2f}")
    console.print(top)

    if workload.revenue_by_customer(expected) != {customer: values[:3] for customer, values in revenue.items()}:
        console.print("[bold red]app.revenue_by_customer differs from the source's final state[/]")
        sys.exit(1)
    differing = [k for k in expected if mirror.get(k) != expected[k]]
    extra = mirror.keys() - expected.keys()
    if differing or extra:
        console.print(f"[bold red]mirror differs from the source: {len(differing)} rows differ, {len(extra)} extra[/]")
        sys.exit(1)
    console.print(
        f"[bold green]verified:[/] app.orders equals the source's final state, row for row ({len(expected):,} rows), "
        f"and app.revenue_by_customer its sums, counts and maxima ({len(revenue):,} customers)"
    )


if __name__ == "__main__":
    main()
