"""``benchmarks.common.MachineCpu``: the machine's busy and idle core-seconds over a run's window, from samples of
``/proc/stat``. The arithmetic on given samples, then the sampler on this machine."""

from __future__ import annotations

import time

import pytest

from benchmarks.common import CpuSample, MachineCpu

pytestmark = pytest.mark.unit


def _given(*samples: tuple[float, float, float]) -> MachineCpu:
    cpu = MachineCpu()
    cpu.samples = [CpuSample(at, busy, idle) for at, busy, idle in samples]
    return cpu


def test_a_window_between_samples_is_interpolated() -> None:
    # 2 cores: both busy for the first second, one for the next.
    cpu = _given((0.0, 0.0, 0.0), (1.0, 2.0, 0.0), (2.0, 3.0, 1.0))
    assert cpu.window(0.0, 2.0) == (3.0, 1.0)
    assert cpu.window(0.5, 1.5) == pytest.approx((1.5, 0.5))


def test_cores_busy_slice_by_slice_with_a_shorter_last_slice() -> None:
    cpu = _given((0.0, 0.0, 0.0), (1.0, 2.0, 0.0), (2.0, 3.0, 1.0), (2.2, 3.2, 1.2))
    assert cpu.cores_busy(0.0, 2.2) == pytest.approx([2.0, 2.0, 1.0, 1.0, 1.0])
    assert cpu.cores_busy(0.0, 2.0, step=1.0) == pytest.approx([2.0, 1.0])


def test_a_moment_outside_the_samples_is_refused() -> None:
    cpu = _given((1.0, 0.0, 0.0), (2.0, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"no CPU samples around 2\.500"):
        cpu.window(1.0, 2.5)
    with pytest.raises(ValueError, match=r"no CPU samples around 0\.500"):
        cpu.window(0.5, 2.0)


def test_the_sampler_counts_this_process_spinning() -> None:
    with MachineCpu(interval=0.02) as cpu:
        start = time.monotonic()
        while time.monotonic() - start < 0.3:  # one core busy, whatever else the machine does
            pass
        end = time.monotonic()
    busy, idle = cpu.window(start, end)
    # /proc/stat counts in clock ticks (10 ms): allow two ticks per core of rounding.
    assert busy >= 0.3 - 0.05
    assert busy + idle == pytest.approx((end - start) * len(_online_cores()), abs=0.1)


def _online_cores() -> list[str]:
    with open("/proc/stat") as stat:
        return [line for line in stat if line.startswith("cpu") and not line.startswith("cpu ")]
