"""Reading Spark's checkpoint without Spark: the offset ranges each batch reads, as the ledger records them."""

from __future__ import annotations

from pathlib import Path

from cdcsync.runtime.checkpoint import batch_offsets, checkpoint_id, last_committed


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
