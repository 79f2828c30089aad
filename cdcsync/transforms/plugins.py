"""Plugin transforms (and the built-in ``handler`` and ``script`` transforms, planned like them) at run time: a
sink that reads one runs its chain of plugin transforms on each partition, on the executors, just before it writes
(:class:`PluginChainWriter`).

SQL transforms run as Spark SQL over the whole batch before the sinks; plugin transforms run inside the sinks'
single executor pass, so they cost no extra pass over the data. Each sink reading a plugin transform runs the
chain itself (two sinks of one plugin transform run it twice: it must be deterministic, as on a replay).

What a plugin returns is checked, not trusted: every declared output column and every ``_cdc_*`` column must be
there, castable to its declared type; the batch is then reordered to the declared columns, which is what the sink
was built for. A plugin that breaks this fails the batch (not retried), naming the transform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cdcsync.config.pipeline import METADATA_COLUMNS
from cdcsync.config.plan import PluginStep
from cdcsync.config.plugins import operator_of, options_of
from cdcsync.core.reports import ReportedFailure, write_failed
from cdcsync.transforms.handler import HandlerRunner
from cdcsync.transforms.script import ScriptRunner

if TYPE_CHECKING:
    import pyarrow as pa

CODE_RUNNERS: dict[str, type[HandlerRunner] | type[ScriptRunner]] = {"handler": HandlerRunner, "script": ScriptRunner}
"""The built-in transforms run like plugins: each builds once per task from its step and runs the task's rows."""


class _Writer(Protocol):
    def stage(self, table: pa.Table) -> int: ...


@dataclass(frozen=True)
class PluginChainWriter:
    """Executor side (picklable): run ``chain`` over a partition's changes, then hand them to ``writer``."""

    chain: tuple[PluginStep, ...]
    writer: Any
    """The sink's own executor writer."""

    def stage(self, table: pa.Table) -> int:
        for step in self.chain:
            table = run_step(step, table)
        return int(self.writer.stage(table)) if table.num_rows else 0


def run_step(step: PluginStep, table: pa.Table) -> pa.Table:
    """One plugin transform over ``table``, batch by batch; its output checked and reordered (module doc)."""
    import pyarrow as pa

    from cdcsync.sources.debezium.spec import arrow_type

    where = f"plugin transform '{step.id}' ({step.type})"
    try:
        if step.type in CODE_RUNNERS:
            outputs = CODE_RUNNERS[step.type].build(step).run(table).to_batches()
        else:
            operator = operator_of(step.type)(options_of(step.type, dict(step.options)))
            outputs = [operator.process(batch) for batch in table.to_batches()]  # type: ignore[attr-defined]
    except ReportedFailure:
        raise
    except Exception as error:
        raise ReportedFailure(write_failed(f"{where}: {type(error).__name__}: {error}", retriable=False)) from None
    wanted = [(name, arrow_type(pg.spark_type)) for name, pg in step.columns]
    wanted += [(name, table.schema.field(name).type) for name in METADATA_COLUMNS]
    arrays = []
    for name, kind in wanted:
        present = [batch.column(name) for batch in outputs if name in batch.schema.names]
        if len(present) != len(outputs):
            raise ReportedFailure(
                write_failed(f"{where}: returned a batch without column '{name}' it declares", retriable=False)
            )
        try:
            arrays.append(pa.chunked_array([array.cast(kind) for array in present], type=kind))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise ReportedFailure(
                write_failed(f"{where}: column '{name}' is not {kind}: {error}", retriable=False)
            ) from None
    return pa.Table.from_arrays(arrays, names=[name for name, _ in wanted])


def with_chain(writer: _Writer, chain: tuple[PluginStep, ...]) -> _Writer:
    """``writer``, running ``chain`` first when the sink reads a plugin transform."""
    return PluginChainWriter(chain, writer) if chain else writer
