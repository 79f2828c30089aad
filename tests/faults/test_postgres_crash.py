"""The target Postgres crashes (SIGKILL: crash recovery on restart) between staging and merge.

Staging tables are UNLOGGED, and crash recovery empties unlogged tables. A crash after the tasks staged a batch
and before the driver merged it left an empty (or, with tasks on both sides of the crash, partial) stage that the
merge used to apply and ledger as done: those changes were lost for good. The merge now counts the stage in its
own transaction against what the tasks reported and, short, fails retriably, so the batch is staged again.

Here Postgres is a private instance (:class:`tests.faults.conftest.FaultStack`), never the session's. The same crash
under a running pipeline (in staging and in merge) is in :mod:`tests.faults.test_services`.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from cdcsync.core.errors import SinkError
from tests.e2e.conftest import ledger_batches
from tests.faults.conftest import FaultStack
from tests.integration.test_postgres_sink import SCHEMA, change, make_sink, target


@pytest.fixture()
def postgres_dsn(private_postgres_dsn: str) -> str:
    """Every Postgres of these tests (target, ledger, lock) is the private one."""
    return private_postgres_dsn


def test_a_stage_emptied_by_a_crash_is_not_merged(fault_stack: FaultStack, postgres_dsn: str, tmp_path: Path) -> None:
    """Deterministic: stage, crash Postgres, merge. Before the fix the merge ledgered the empty stage (0 rows)."""
    sink = make_sink("hard", postgres_dsn, tmp_path)
    rows = pa.Table.from_pylist([change("c", key, 10 + key) for key in range(1, 51)], schema=SCHEMA)
    key = sink.ledger_key(0, "cp")
    assert sink.prepare(key)
    staged = sink.stage_writer(0).stage(rows)
    assert staged == 50
    fault_stack.kill("postgres")
    fault_stack.restart("postgres")  # crash recovery resets the unlogged stage

    with pytest.raises(SinkError) as caught:
        sink.merge(key, staged)
    assert caught.value.retriable, caught.value
    assert "holds 0 of the 50 row(s) the tasks staged" in str(caught.value)
    assert ledger_batches(postgres_dsn, "sinktest") == {}
    assert target(sink) == {}

    # What the runtime does with a retriable failure: the whole batch again, which lands every row.
    assert sink.prepare(key)
    assert sink.merge(key, sink.stage_writer(0).stage(rows)) == 50
    assert len(target(sink)) == 50
