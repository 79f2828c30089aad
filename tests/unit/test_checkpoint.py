"""Reading Spark's checkpoint without Spark: the offset ranges each batch reads, as the ledger records them; the
marker of a batch committed before its merges ran (cdcsync.runtime.overlap)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcsync.core.errors import CdcsyncError
from cdcsync.runtime.checkpoint import (
    UNMERGED_MARKER,
    batch_ids,
    batch_offsets,
    checkpoint_id,
    clear_unmerged,
    last_committed,
    mark_unmerged,
    rewind_unmerged,
)


def test_batch_offsets_start_where_the_previous_batch_ended(tmp_path: Path) -> None:
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    (tmp_path / "sources" / "0" / "0").write_text('\0v1\n{"t":{"0":5,"1":0}}')
    (tmp_path / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":9,"1":4}}')
    (tmp_path / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":9,"1":6,"2":3}}')
    (tmp_path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')

    assert checkpoint_id(tmp_path) is None and last_committed(tmp_path) == 0
    assert batch_offsets(tmp_path, 0) == {"t": {"0": [5, 9], "1": [0, 4]}}  # from where the query started
    # Partition 2 is new in batch 1: the checkpoint does not say where it started.
    assert batch_offsets(tmp_path, 1) == {"t": {"0": [9, 9], "1": [4, 6], "2": [None, 3]}}
    assert batch_offsets(tmp_path, 2) is None


def _checkpoint_with_batches(folder: Path, offsets: int, commits: int) -> None:
    for log, count in (("offsets", offsets), ("commits", commits)):
        (folder / log).mkdir(parents=True)
        for batch_id in range(count):
            (folder / log / str(batch_id)).write_text("v1\n{}\n{}")
            (folder / log / f".{batch_id}.crc").write_bytes(b"crc")


def test_a_batch_committed_before_its_merges_ran_is_run_again(tmp_path: Path) -> None:
    # Batch 2's merges were running, Spark had committed 2 and planned 3 when the run stopped.
    _checkpoint_with_batches(tmp_path, offsets=4, commits=3)
    mark_unmerged(tmp_path, 2)
    assert (tmp_path / UNMERGED_MARKER).read_text() == "2\n"

    assert rewind_unmerged(tmp_path) == 2
    assert batch_ids(tmp_path, "offsets") == [0, 1, 2] and last_committed(tmp_path) == 1  # Spark runs 2 again
    assert not (tmp_path / "commits" / ".2.crc").exists() and not (tmp_path / "offsets" / ".3.crc").exists()
    assert not (tmp_path / UNMERGED_MARKER).exists()
    assert rewind_unmerged(tmp_path) is None  # nothing more at the next start


def test_a_cleared_marker_rewinds_nothing(tmp_path: Path) -> None:
    _checkpoint_with_batches(tmp_path, offsets=3, commits=3)
    mark_unmerged(tmp_path, 2)
    clear_unmerged(tmp_path)  # its merges ran
    assert rewind_unmerged(tmp_path) is None and last_committed(tmp_path) == 2


def test_a_marker_that_names_no_batch_is_refused_with_the_way_on(tmp_path: Path) -> None:
    _checkpoint_with_batches(tmp_path, offsets=2, commits=2)
    (tmp_path / UNMERGED_MARKER).write_text("garbage")
    with pytest.raises(CdcsyncError, match="names no batch") as raised:
        rewind_unmerged(tmp_path)
    assert raised.value.hint is not None and "delete" in raised.value.hint
    assert last_committed(tmp_path) == 1  # nothing deleted
