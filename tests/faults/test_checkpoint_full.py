"""The checkpoint directory's disk fills up mid-run (ENOSPC), on a small tmpfs mounted for the test.

Spark cannot write the batch's offsets or commit, so the run must stop with exit 1 and the reason, never exit 0 or
hang; the batch it could not commit is replayed by the next run once there is space, and the ledger skips what
had landed. Mounting needs root (or CAP_SYS_ADMIN): where the machine refuses, the test is skipped with the
reason, and docs/operations.md says it was not run."""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.harness import BOUND_S, FaultWorkload


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"this machine refuses a tmpfs mount, so ENOSPC is not injected: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the disk is full."""
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(chunk)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error


def test_checkpoint_disk_full_stops_the_run_and_the_next_run_replays(
    fault_workload: Callable[..., FaultWorkload], small_disk: Path
) -> None:
    faulted = fault_workload(changes=6_000, seed=28, max_offsets=700)
    faulted.project.env["CDCSYNC__STATE_DIR"] = str(small_disk / "state")
    process = faulted.start()
    faulted.wait_batches(3, process)
    filler = small_disk / "filler"
    fill(filler)
    _stdout, stderr = process.communicate(timeout=BOUND_S)
    assert process.returncode == 1, stderr[-4000:]
    assert "No space left on device" in stderr, stderr[-4000:]

    filler.unlink()
    back_at = time.monotonic()
    faulted.run()
    faulted.assert_exact("checkpoint dir full (ENOSPC)", 1, time.monotonic() - back_at)
