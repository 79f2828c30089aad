"""A ClickHouse target goes back on its own: its table is truncated after the pipeline ran.

The ClickHouse sink's ledger rows live in Postgres, which the truncate does not touch: without a check, the next
run finds every batch ledgered and the table stays empty for good. With it, ``run`` refuses (exit 2, before Spark
starts) naming the table and ``cdcsync rewind --to-ledger``, which forgets that sink's ledger rows and reads the
source again from its start; afterwards every target equals the stream's final state and each sink's ledger holds
each batch once. (A table restored to a copy that has *some* of its batches is not detected: see
docs/operations.md#a-clickhouse-target-that-went-back.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.conftest import ClickHouseDatabase
from tests.faults.harness import FaultWorkload


def test_a_truncated_clickhouse_table_is_refused_then_rewound(
    fault_workload: Callable[..., FaultWorkload], clickhouse_database: ClickHouseDatabase
) -> None:
    faulted = fault_workload(changes=3_000, seed=307, max_offsets=1_000)
    faulted.run()
    clickhouse_database.client().command("TRUNCATE TABLE orders")

    refused = faulted.run(check=False)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert f"its ClickHouse table {clickhouse_database.database}.orders holds no rows" in refused.stderr
    assert f"cdcsync rewind {faulted.project.pipeline_file} --to-ledger" in refused.stderr
    assert "starting Spark" not in refused.stderr and "Traceback" not in refused.stderr

    started = time.monotonic()
    rewound = faulted.project.cdcsync("rewind", str(faulted.project.pipeline_file), "--to-ledger").stdout
    assert "to -1; the next run reads again from its start offsets" in rewound, rewound
    faulted.run()
    faulted.assert_exact(
        "ClickHouse table truncated after a run, then `rewind --to-ledger`", 1, time.monotonic() - started
    )
