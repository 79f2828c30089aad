"""The vectorised test behind ``dynamic_table_check`` for integer keys (pure logic: the function Spark runs on
its Python workers, given what a Spark broadcast variable would hand it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest

from cdcsync.transforms.key_check import key_check, sorted_keys


@dataclass
class _Held:
    """What the function reads of a broadcast variable."""

    value: np.ndarray


def _packed(keys: list[int]) -> bytes:
    """As ``dynamic_keys_load.sql.j2`` sends integer keys: 8-byte big-endian, one after another."""
    return np.array(keys, dtype=">i8").tobytes()


def test_the_loaded_keys_come_out_sorted_native_integers() -> None:
    keys = sorted_keys(_packed([7, -3, 2**62, 0]))
    assert keys.dtype == np.int64 and keys.tolist() == [-3, 0, 7, 2**62]
    assert sorted_keys(b"").tolist() == []


@pytest.mark.parametrize("arrow_type", [pa.int16(), pa.int32(), pa.int64()])
def test_a_value_is_a_member_exactly_when_it_is_a_key_and_null_never(arrow_type: pa.DataType) -> None:
    check = key_check(_Held(sorted_keys(_packed([-3, 7, 100]))))  # type: ignore[arg-type]
    values = pa.array([None, -4, -3, 0, 7, 8, 100, 101, None], type=arrow_type)
    found = check(values)
    assert found.type == pa.bool_() and found.null_count == 0
    assert found.to_pylist() == [False, False, True, False, True, False, True, False, False]


def test_no_keys_means_no_members() -> None:
    check = key_check(_Held(sorted_keys(b"")))  # type: ignore[arg-type]
    assert check(pa.array([1, None, -1], type=pa.int64())).to_pylist() == [False, False, False]
