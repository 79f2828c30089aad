"""The test behind ``dynamic_table_check`` for integer keys of a Postgres table
(:attr:`~cdcsync.config.plan.DynamicTableSpec.checked_by_function`): a scalar Arrow UDF that looks a whole Arrow
batch of values up in the table's keys, sorted once per reload and shipped to each Python worker once as a Spark
broadcast variable. A broadcast join would rebuild and ship the whole key set in every micro-batch instead.

Imported on the driver only when such a table is checked, and by the Python workers that run the function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pyspark import Broadcast


def sorted_keys(packed: bytes) -> np.ndarray:
    """The keys as the load sends them (8-byte big-endian integers, one after another) as the function searches
    them: native int64, sorted (and unique: they are the table's primary key)."""
    keys = np.frombuffer(packed, dtype=">i8").astype(np.int64)
    keys.sort()
    return keys


def key_check(keys: Broadcast[np.ndarray]) -> Callable[[pa.Array], pa.Array]:
    """The function for one load of the keys: true for a value among them, false for any other value and NULL.
    Its type hints tell Spark it is a scalar Arrow UDF (Arrow array in, Arrow array out)."""

    def contains(values: pa.Array) -> pa.Array:
        held: np.ndarray = keys.value
        candidates = values.fill_null(0).to_numpy(zero_copy_only=False)
        at = np.searchsorted(held, candidates)
        inside = at < len(held)
        found = np.zeros(len(candidates), dtype=bool)
        found[inside] = held[at[inside]] == candidates[inside]
        if values.null_count:
            found &= values.is_valid().to_numpy(zero_copy_only=False)
        return pa.array(found, type=pa.bool_())

    return contains
