"""Plugin sinks at run time: the runtime's wrapping of a :class:`~cdcsync.core.plugins.SinkPlugin`.

Like every sink, a plugin sink's batches are looked up in the ledger before and recorded after (a batch that
landed is skipped on a replay). On the executors, :class:`PluginSinkWriter` builds the plugin with its validated
options, hands it the partition's changes in parts of at most ``batch_size``, each with an idempotency key that is
the same on every replay (pipeline, sink, checkpoint, batch, the Kafka range the task read, part), retries a
:class:`~cdcsync.core.plugins.PluginRetriable` failure with backoff within the retry budget, and fails the batch
(not retried) on any other exception, naming the plugin. The delivery is at least once; the keys let the plugin
make it exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcsync.config.plugins import operator_of, options_of
from cdcsync.core.errors import CdcsyncError
from cdcsync.core.reports import ReportedFailure, write_failed
from cdcsync.db.retry import RetryBudget, with_retries
from cdcsync.sinks.clickhouse import deduplication_token
from cdcsync.sinks.recorded import RecordedSink

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.config.pipeline import Pipeline
    from cdcsync.config.plugins import PluginSink


@dataclass(frozen=True)
class PluginSinkWriter:
    """Executor side (picklable)."""

    type: str
    options: tuple[tuple[str, object], ...]
    batch_size: int
    key_prefix: str
    sink_id: str
    batch_id: int
    budget: RetryBudget

    def stage(self, table: pa.Table) -> int:
        if table.num_rows == 0:
            return 0
        where = f"sink '{self.sink_id}' ({self.type})"
        task_key = deduplication_token(self.key_prefix, table)
        try:
            plugin = operator_of(self.type)(options_of(self.type, dict(self.options)))
        except Exception as error:
            raise ReportedFailure(write_failed(f"{where}: {type(error).__name__}: {error}", retriable=False)) from None
        try:
            for part, start in enumerate(range(0, table.num_rows, self.batch_size)):
                batch = table.slice(start, self.batch_size).combine_chunks().to_batches()[0]
                key = f"{task_key}/{part}"
                with_retries(
                    lambda batch=batch, key=key: plugin.write(batch, key),  # type: ignore[attr-defined, misc]
                    describe=f"{where}: writing batch {self.batch_id} ({key})",
                    budget=self.budget,
                )
        except CdcsyncError as error:
            raise ReportedFailure(write_failed(str(error), retriable=error.retriable)) from None
        except Exception as error:
            raise ReportedFailure(
                write_failed(
                    f"{where}: writing batch {self.batch_id}: {type(error).__name__}: {error}", retriable=False
                )
            ) from None
        finally:
            plugin.close()  # type: ignore[attr-defined]
        return table.num_rows


class PluginTableSink(RecordedSink):
    """Driver side of one plugin sink (``type: namespace.operator``)."""

    def __init__(self, pipeline: Pipeline, sink_id: str, sink: PluginSink, dsn: str, budget: RetryBudget) -> None:
        super().__init__(pipeline, sink_id, dsn)
        self.sink = sink
        self.budget = budget

    @property
    def target_name(self) -> str:
        return self.sink.type

    def stage_writer(self, batch_id: int, checkpoint_id: str = "") -> PluginSinkWriter:
        return PluginSinkWriter(
            type=self.sink.type,
            options=tuple(self.sink.options.items()),
            batch_size=self.sink.batch_size,
            key_prefix=self.key_prefix(checkpoint_id, batch_id),
            sink_id=self.sink_id,
            batch_id=batch_id,
            budget=self.budget,
        )
