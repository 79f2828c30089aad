"""The ``print`` and ``blackhole`` sinks: changes to the executors' standard output, or counted and dropped.

Both are ledgered like every sink (the driver records each batch after the tasks are done), so a replayed batch
that landed is skipped. ``print`` is at least once: a batch printed but not yet recorded (a crash, a retried task)
is printed again when it is replayed. ``blackhole`` writes nothing, so its throughput is what the engine itself
reaches: reading Kafka, decoding, transforms, the executor pass and the ledger.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcsync.core import changes_json
from cdcsync.sinks.recorded import RecordedSink

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcsync.config.operators import BlackholeSink, PrintSink
    from cdcsync.config.pipeline import Pipeline


@dataclass(frozen=True)
class PrintWriter:
    """Executor side of ``print`` (picklable): one line per change, ``OP {json}``, every ``sample_every``-th."""

    sample_every: int

    def stage(self, table: pa.Table) -> int:
        if self.sample_every > 1:
            table = table.take(list(range(0, table.num_rows, self.sample_every)))
        lines = [
            changes_json.OP_WORDS.get(str(row.get("_cdc_op")), str(row.get("_cdc_op"))).encode()
            + b" "
            + changes_json.dumps(row)
            for row in changes_json.rows(table)
        ]
        if lines:
            out = sys.stdout.buffer
            out.write(b"\n".join(lines) + b"\n")
            out.flush()
        return table.num_rows


@dataclass(frozen=True)
class BlackholeWriter:
    """Executor side of ``blackhole`` (picklable): counts."""

    def stage(self, table: pa.Table) -> int:
        return table.num_rows


class ConsoleTableSink(RecordedSink):
    """Driver side of one ``type: print`` or ``type: blackhole`` sink."""

    def __init__(self, pipeline: Pipeline, sink_id: str, sink: PrintSink | BlackholeSink, dsn: str) -> None:
        super().__init__(pipeline, sink_id, dsn)
        self.sink = sink

    @property
    def target_name(self) -> str:
        return "stdout" if self.sink.type == "print" else "blackhole"

    def stage_writer(self, batch_id: int, checkpoint_id: str = "") -> PrintWriter | BlackholeWriter:
        if self.sink.type == "print":
            return PrintWriter(self.sink.sample_every)
        return BlackholeWriter()
