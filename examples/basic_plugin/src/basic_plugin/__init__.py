"""An example cdcsync plugin package, registered as the namespace ``basic_plugin`` (see ``pyproject.toml``).

Install it next to cdcsync (``pip install -e examples/basic_plugin``), check ``cdcsync plugins`` lists it, and
name its operators in a pipeline::

    transforms:
      inserts:
        type: basic_plugin.filter_transform
        from: orders
        options: {ops: [c, r]}
    sinks:
      shown:
        type: basic_plugin.print_sink
        from: inserts
        options: {mode: row}
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cdcsync.core.plugins import Plugin, SinkPlugin, SourcePlugin, TransformPlugin


class FilterOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ops: list[Literal["c", "r", "u", "d", "t"]] = Field(default=["c", "r"], min_length=1)
    """The Debezium ops to keep (Streamling's ``_gs_op`` filter): ``c`` insert, ``r`` snapshot read, ``u``
    update, ``d`` delete, ``t`` truncate."""


class FilterTransform(TransformPlugin):
    """Keeps only the changes whose op is listed in options.ops."""

    Options = FilterOptions

    def process(self, batch: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        return batch.filter(pc.is_in(batch.column("_cdc_op"), pa.array(self.options.ops)))


class PrintOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["row", "batch"] = "row"
    """``row``: one line per change; ``batch``: one line per write (its idempotency key and size)."""


class PrintSink(SinkPlugin):
    """Prints each change (or each batch) with the idempotency key the runtime gave it."""

    Options = PrintOptions

    def write(self, batch: Any, idempotency_key: str) -> None:
        if self.options.mode == "batch":
            lines = [f"basic_plugin {idempotency_key} {batch.num_rows} changes"]
        else:
            lines = [
                f"basic_plugin {idempotency_key} {json.dumps(row, default=str, sort_keys=True)}"
                for row in batch.to_pylist()
            ]
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()


class RandomOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    """A directory of its own: the rows are written there once (JSON lines, ``record_batch_size`` per file), then
    streamed from there, so a replay reads the same rows."""
    max_rows: int = Field(default=10_000, gt=0)
    record_batch_size: int = Field(default=1_000, gt=0)
    """Rows per file, and so per micro-batch."""
    seed: int = 0


class RandomSource(SourcePlugin):
    """Random rows (alphanumeric_field, num_field), max_rows of them, record_batch_size per micro-batch."""

    Options = RandomOptions

    def columns(self) -> Mapping[str, str]:
        return {"alphanumeric_field": "text", "num_field": "bigint"}

    def primary_key(self) -> list[str]:
        return ["alphanumeric_field"]

    def dataframe(self, spark: Any) -> Any:
        folder = Path(self.options.path)
        if not any(folder.glob("*.json")):
            folder.mkdir(parents=True, exist_ok=True)
            rng = random.Random(self.options.seed)
            rows = [
                {"alphanumeric_field": f"{rng.getrandbits(48):012x}", "num_field": rng.randrange(1000)}
                for _ in range(self.options.max_rows)
            ]
            size = self.options.record_batch_size
            for number, start in enumerate(range(0, len(rows), size)):
                part = folder / f"part-{number:06d}.json"
                (folder / f".{part.name}.tmp").write_text(
                    "".join(json.dumps(row) + "\n" for row in rows[start : start + size])
                )
                (folder / f".{part.name}.tmp").rename(part)  # the stream never sees a file half written
        return (
            spark.readStream.schema("alphanumeric_field string, num_field bigint")
            .option("maxFilesPerTrigger", 1)
            .json(str(folder))
        )


plugin = Plugin(
    sources={"random_source": RandomSource},
    transforms={"filter_transform": FilterTransform},
    sinks={"print_sink": PrintSink},
)
