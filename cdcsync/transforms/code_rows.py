"""What ``handler`` and ``script`` transforms share on the executors: which changes go to the user's code, and how
its results become the step's output batch (the contract is in :mod:`cdcsync.config.code_transforms`).

The code sees plain values (a dict per change) and answers with plain values; Arrow is only met here, once per
task's batch: the columns the code left alone are taken from the input as they are (no round trip through Python
or JSON), and only the values it changed are converted to their declared types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cdcsync.config.pipeline import METADATA_COLUMNS
from cdcsync.config.plan import PluginStep
from cdcsync.core.reports import ReportedFailure, refused

if TYPE_CHECKING:
    import pyarrow as pa

PROCESSED_OPS = frozenset({"c", "u", "r"})
"""Changes that carry a row for the code: inserts, updates, snapshot reads. Deletes, truncates and key moves
pass the code untouched (a sink needs only their key)."""

Result = Mapping[str, Any] | None
"""The code's answer for one change: its new columns, or None to drop it (it becomes a delete of its key)."""


def processed_rows(table: pa.Table) -> list[int]:
    """Positions of the changes the code sees (:data:`PROCESSED_OPS`), in order."""
    return [i for i, op in enumerate(table.column("_cdc_op").to_pylist()) if op in PROCESSED_OPS]


def apply_results(
    step: PluginStep,
    where: str,
    table: pa.Table,
    positions: Sequence[int],
    sent: Sequence[Mapping[str, Any]],
    results: Sequence[Result],
    same: Callable[[Any, Any], bool] = lambda a, b: bool(a == b),
) -> pa.Table:
    """``table`` with each change at ``positions`` replaced by its result: ``sent`` holds the values the code was
    given (in the form it saw them), so a value equal to the one sent keeps the input's exact value, and a key or
    ``_cdc_*`` value that differs fails the batch. ``where`` names the transform in every message."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from cdcsync.sources.debezium.spec import arrow_type

    frozen = set(step.primary_key) | set(METADATA_COLUMNS)
    kept = [False] * table.num_rows
    dropped = [False] * table.num_rows
    changed: dict[str, dict[int, Any]] = {}
    for position, given, result in zip(positions, sent, results, strict=True):
        if result is None:
            dropped[position] = True
            continue
        if not isinstance(result, Mapping):
            raise ReportedFailure(refused(f"{where}: returned a {type(result).__name__} for a change, not an object"))
        kept[position] = True
        for name, value in result.items():
            if name in given and same(value, given[name]):
                continue
            if name in frozen:
                shown = key_text(step, given)
                message = f"{where}: changed '{name}' of the change with key {shown}"
                raise ReportedFailure(refused(f"{message}; the key and the _cdc_* columns pass through unchanged"))
            changed.setdefault(name, {})[position] = value
    arrays: list[pa.ChunkedArray | pa.Array] = []
    names: list[str] = []
    drop_mask = pa.array(dropped, type=pa.bool_())
    for name, pg in step.columns:
        kind = arrow_type(pg.spark_type)
        if name in table.column_names and table.schema.field(name).type == kind:
            base: pa.ChunkedArray | pa.Array = table.column(name)
        else:
            base = pa.nulls(table.num_rows, type=kind)
        values = changed.get(name)
        if values:
            mask = pa.array([i in values for i in range(table.num_rows)], type=pa.bool_())
            given_values = _typed(where, name, kind, [values.get(i) for i in range(table.num_rows)])
            base = pc.if_else(mask, given_values, base)
        if name not in step.primary_key:
            base = pc.if_else(drop_mask, pa.nulls(table.num_rows, type=kind), base)
        arrays.append(base)
        names.append(name)
    for name in METADATA_COLUMNS:
        column = table.column(name)
        if name == "_cdc_op" and any(dropped):
            column = pc.if_else(drop_mask, pa.scalar("d", type=column.type), column)
        arrays.append(column)
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def _typed(where: str, name: str, kind: pa.DataType, values: list[Any]) -> pa.Array:
    """The code's values for one column as ``kind``: built directly, else inferred and cast (a JSON number into
    ``numeric``, an ISO string into a timestamp)."""
    import pyarrow as pa

    try:
        return pa.array(values, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        pass
    try:
        return pa.array(values).cast(kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as error:
        sample = next((v for v in values if v is not None), None)
        raise ReportedFailure(
            refused(f"{where}: column '{name}' got {sample!r}, which is not a {kind} ({type(error).__name__})")
        ) from None


def key_text(step: PluginStep, given: Mapping[str, Any]) -> str:
    """The change's key, for messages."""
    return ", ".join(f"{column}={given.get(column)!r}" for column in step.primary_key)
