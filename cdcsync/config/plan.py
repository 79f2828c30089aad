"""The transform graph as the runtime executes it: what each SQL transform reads, the Spark SQL it runs, and the
dynamic tables it checks or fills.

A :class:`PipelinePlan` is built once, at validation, from the pipeline YAML (no Spark, no services), so that
``validate`` can refuse a bad transform with its id and the runtime only executes what was checked.

Contract between the plan and the runtime (:mod:`cdcsync.engine.batch`):

* Every node (source or SQL transform) of one micro-batch is visible to Spark SQL as the temporary view
  :func:`input_view` of its id, with its business columns followed by the six ``_cdc_*`` columns.
* A dynamic table ``t`` is visible as two views (``key`` typed as ``DynamicTableSpec.key_type.spark_type``):
  :func:`prior_keys_view` (column ``key``: the keys the table held before this batch, unique) and
  :func:`batch_keys_view` (columns ``key`` and ``pos``: the keys this batch's side output adds, each with the
  smallest position ``named_struct('topic', _cdc_topic, 'partition', _cdc_partition, 'offset', _cdc_offset)`` of
  a row that produced it, unique by key).
* ``TransformStep.spark_sql`` reads only those views and yields exactly one row per input row: the business
  columns of ``TransformStep.columns`` in order, then the ``_cdc_*`` columns. A change that the transform's WHERE
  rejects comes out as a delete of its key (``_cdc_op = 'd'``, other computed columns NULL), so that downstream
  the target always equals the transform applied to each key's latest change; truncates (``_cdc_op = 't'``) and
  key-move rows (``'n'``, :data:`cdcsync.core.names.KEY_MOVE_OP`) pass.
* ``dynamic_table_check('t', e)`` is true when ``e`` (cast to the table's key type) is among the prior keys, or is
  added by this batch's side output at an earlier position than the row being checked (the table then behaves as
  if changes were processed one at a time, in offset order); false for NULL. Implemented with broadcast joins
  against the key views, never with a per-row lookup; except that a table whose keys are
  :attr:`DynamicTableSpec.checked_by_function` has no prior-keys view but the temporary function
  :func:`key_check_function` (the key in, true when it is a prior key; false for NULL), which tests a whole Arrow
  batch of keys at once.
* ``SideOutput.spark_sql`` reads :func:`input_view` of its input and yields ``key`` (non-NULL) and ``pos``, one
  row per input row that passes its WHERE.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import Literal

from cdcsync.config.types import PgType

POSITION_SQL = "named_struct('topic', _cdc_topic, 'partition', _cdc_partition, 'offset', _cdc_offset)"
"""A change's position in its batch: total, deterministic on replay (same offsets), comparable with ``<``."""


def _view_suffix(node_id: str) -> str:
    # Ids may hold dots and other characters Spark would need quoted; a stable, readable, unique name instead.
    readable = re.sub(r"[^A-Za-z0-9_]", "_", node_id)
    return f"{readable}_{zlib.crc32(node_id.encode()):08x}"


def input_view(node_id: str) -> str:
    return f"__cdc_in_{_view_suffix(node_id)}"


def prior_keys_view(table_id: str) -> str:
    return f"__cdc_dt_{_view_suffix(table_id)}"


def batch_keys_view(table_id: str) -> str:
    return f"__cdc_db_{_view_suffix(table_id)}"


def key_check_function(table_id: str) -> str:
    return f"__cdc_dk_{_view_suffix(table_id)}"


INTEGER_KEY_TYPES = frozenset({"smallint", "integer", "bigint"})


@dataclass(frozen=True)
class SideOutput:
    """A dynamic table's ``sql``: fills the table from a stream, in the same micro-batch."""

    input: str
    """Source or SQL transform id whose batch rows it reads."""
    spark_sql: str


@dataclass(frozen=True)
class DynamicTableSpec:
    id: str
    backend: Literal["postgres", "in_memory"]
    schema: str
    table: str
    key_column: str
    key_type: PgType
    fill: SideOutput | None = None

    @property
    def checked_by_function(self) -> bool:
        """Whether checks test the prior keys with :func:`key_check_function` rather than a broadcast join: the
        integer keys of a Postgres table. Spark cannot keep a broadcast relation from one query to the next, so a
        join rebuilt and broadcast the whole key set for every micro-batch (about a second for a million keys,
        docs/benchmarks.md "Lookups"); the function's sorted keys reach each Python worker once per reload. Other
        key types keep the join, where Spark's own casts and equality decide what matches."""
        return self.backend == "postgres" and self.key_type.name in INTEGER_KEY_TYPES


@dataclass(frozen=True)
class TransformStep:
    id: str
    input: str
    """The one source or SQL transform it reads (joins between streams are refused)."""
    spark_sql: str
    primary_key: tuple[str, ...]
    columns: tuple[tuple[str, PgType], ...]
    """Business output columns in order; the ``_cdc_*`` columns follow them."""
    dynamic_tables: tuple[str, ...] = ()


@dataclass(frozen=True)
class PluginStep:
    """A plugin transform (``type: namespace.operator``), run on the executors by the sinks that read it
    (:mod:`cdcsync.transforms.plugins`): it reads a source, a SQL transform or another plugin transform."""

    id: str
    input: str
    type: str
    options: tuple[tuple[str, object], ...]
    """As given in YAML; the operator's ``Options`` model validates them again where it is built."""
    primary_key: tuple[str, ...]
    columns: tuple[tuple[str, PgType], ...]


@dataclass(frozen=True)
class PluginSourceStep:
    """A plugin source (``type: namespace.operator``): one streaming query of its own, whose micro-batches the
    runtime gives the ``_cdc_*`` columns (:mod:`cdcsync.runtime.plugin_sources`)."""

    id: str
    type: str
    options: tuple[tuple[str, object], ...]
    primary_key: tuple[str, ...]
    columns: tuple[tuple[str, PgType], ...]


@dataclass(frozen=True)
class PipelinePlan:
    steps: tuple[TransformStep, ...] = ()
    """Topological order: a step comes after the step it reads, and after the input of every side output that
    fills a dynamic table it checks (so each fill can run as soon as its input view exists)."""
    dynamic_tables: dict[str, DynamicTableSpec] = field(default_factory=dict)
    source_of_node: dict[str, str] = field(default_factory=dict)
    """Node id (source or transform) -> the source whose micro-batches feed it."""
    plugin_steps: dict[str, PluginStep] = field(default_factory=dict)
    """Plugin transforms, by id."""
    plugin_sources: dict[str, PluginSourceStep] = field(default_factory=dict)
    """Plugin sources, by id (not in ``Pipeline.sources``, which are Kafka topics)."""

    def plugin_chain(self, node_id: str) -> tuple[PluginStep, ...]:
        """The plugin transforms between ``node_id`` and the nearest source or SQL transform, in the order they
        run; empty when ``node_id`` is not a plugin transform."""
        chain: list[PluginStep] = []
        while node_id in self.plugin_steps:
            chain.append(self.plugin_steps[node_id])
            node_id = self.plugin_steps[node_id].input
        return tuple(reversed(chain))

    def view_of(self, node_id: str) -> str:
        """The source or SQL transform whose rows the plugin transforms of ``node_id`` start from (itself when it
        is not a plugin transform)."""
        chain = self.plugin_chain(node_id)
        return chain[0].input if chain else node_id
