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

    max_rows: int = Field(default=10_000, gt=0)
    rows_per_second: int = Field(default=1_000, gt=0)


class RandomSource(SourcePlugin):
    """Random rows (alphanumeric_field, num_field) from Spark's rate source (not run by cdcsync yet)."""

    Options = RandomOptions

    def columns(self) -> Mapping[str, str]:
        return {"alphanumeric_field": "text", "num_field": "bigint"}

    def dataframe(self, spark: Any) -> Any:
        from pyspark.sql import functions as F

        seed = random.randrange(2**31)
        rate = spark.readStream.format("rate").option("rowsPerSecond", self.options.rows_per_second).load()
        return rate.where(F.col("value") < self.options.max_rows).select(
            F.sha2(F.concat(F.lit(str(seed)), F.col("value").cast("string")), 256)
            .substr(1, 12)
            .alias("alphanumeric_field"),
            (F.rand(seed) * 1000).cast("bigint").alias("num_field"),
        )


plugin = Plugin(
    sources={"random_source": RandomSource},
    transforms={"filter_transform": FilterTransform},
    sinks={"print_sink": PrintSink},
)
