"""What a plugin implements: the interfaces of plugin sources, transforms and sinks, and how a package registers
them.

A plugin package names a :class:`Plugin` in the entry-point group ``cdcsync.plugins``; the entry point's name is
the plugin's namespace, and a pipeline names each operator ``<namespace>.<operator>`` with its ``options:``::

    [project.entry-points."cdcsync.plugins"]
    basic_plugin = "basic_plugin:plugin"

The runtime owns what must be right in production, around the plugin's code: options validated (with their YAML
path) before Spark starts, the checkpoint, the batch ledger, idempotency keys, retries with backoff for
:class:`PluginRetriable` failures, the check of what a transform returns. Transforms and sinks run on the
executors and see Arrow record batches: the business columns of their input, then the six ``_cdc_*`` columns; a
source gives the driver a streaming Spark DataFrame (docs/plugins.md).

This module imports nothing heavy, so that ``cdcsync plugins`` and ``validate`` stay fast; pyarrow is imported by
the plugin's own code where it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from cdcsync.core.errors import CdcsyncError

if TYPE_CHECKING:
    import pyarrow as pa

ENTRY_POINT_GROUP = "cdcsync.plugins"


class PluginRetriable(CdcsyncError):
    """Raised by plugin code for a failure a retry may mend (a timeout, a service away): retried with backoff
    within the retry budget. Any other exception from plugin code fails the batch without a retry."""

    retriable = True


class Operator:
    """What every plugin operator shares: its options, validated before Spark starts.

    ``Options``: a pydantic model of the operator's ``options:`` (unknown keys are refused); without one, options
    are a mapping of names to strings, numbers or booleans. The validated options are passed to ``__init__``,
    which runs on the driver (to check them against the input) and again on each executor.
    """

    Options: ClassVar[type[BaseModel] | None] = None

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = options


class TransformPlugin(Operator):
    """A per-batch function on the executors: an Arrow batch of changes in, an Arrow batch of changes out."""

    def output_columns(self, input_columns: Mapping[str, str]) -> Mapping[str, str]:
        """The business columns it returns (name -> Postgres type), from its input's; the same by default."""
        return input_columns

    def process(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The changes of ``batch`` transformed: the columns :meth:`output_columns` names, then the ``_cdc_*``
        columns, which must pass through (dropping a row drops that change for every sink downstream).
        Deterministic, so a replayed batch yields the same changes."""
        raise NotImplementedError


class SinkPlugin(Operator):
    """Writes changes somewhere, on the executors."""

    def write(self, batch: pa.RecordBatch, idempotency_key: str) -> None:
        """Write ``batch``. ``idempotency_key`` names it (pipeline, sink, checkpoint, batch, Kafka range, part) and
        is the same when the batch is replayed: a target that remembers it can write each change once."""
        raise NotImplementedError

    def close(self) -> None:
        """Called once after the task's last :meth:`write` (also after a failure)."""


class SourcePlugin(Operator):
    """A source of rows: a streaming Spark DataFrame, run by the driver as a streaming query of its own."""

    def columns(self) -> Mapping[str, str]:
        """Its columns: name -> Postgres type (the DataFrame's columns are cast to them)."""
        raise NotImplementedError

    def primary_key(self) -> list[str]:
        """Its key, unless the pipeline names one."""
        return []

    def dataframe(self, spark: Any) -> Any:
        """A streaming DataFrame with :meth:`columns` (and, optionally, ``_cdc_op``: ``c``, ``u``, ``d``; else
        every row is an upsert). Replayable from Spark's checkpoint, as Spark's own sources are."""
        raise NotImplementedError


@dataclass(frozen=True)
class Plugin:
    """What an entry point of the group ``cdcsync.plugins`` names: the package's operators by name."""

    sources: Mapping[str, type[SourcePlugin]] = field(default_factory=dict)
    transforms: Mapping[str, type[TransformPlugin]] = field(default_factory=dict)
    sinks: Mapping[str, type[SinkPlugin]] = field(default_factory=dict)
