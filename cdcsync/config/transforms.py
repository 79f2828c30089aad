"""The ``transforms:`` entries of a pipeline: SQL transforms and dynamic lookup tables (Streamling's vocabulary);
``handler`` and ``script`` transforms are in :mod:`cdcsync.config.code_transforms`.

These models check only the shape of each entry. What the SQL means (its input, its output columns and types,
what it is allowed to do) is decided by :mod:`cdcsync.config.compile`, which builds the
:class:`~cdcsync.config.plan.PipelinePlan` the runtime executes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from cdcsync.config.base import StrictModel, as_key_list
from cdcsync.config.code_transforms import CODE_TRANSFORM_TYPES


class SqlTransform(StrictModel):
    """Spark SQL over each micro-batch of one stream: projections, computed columns and filters only."""

    type: Literal["sql"]
    sql: str = Field(min_length=1)
    primary_key: list[str] = Field(min_length=1)
    from_: list[str] | None = Field(default=None, alias="from")
    """Optional, as in Streamling; when given it must name the stream the SQL's FROM reads."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Output column -> Postgres type, for columns whose type cannot be inferred or should differ."""

    _normalise_pk = field_validator("primary_key", mode="before")(as_key_list)
    _normalise_from = field_validator("from_", mode="before")(as_key_list)

    @field_validator("columns")
    @classmethod
    def _types_are_text(cls, columns: dict[str, str]) -> dict[str, str]:
        for name, type_text in columns.items():
            if not isinstance(type_text, str):
                raise ValueError(f"column '{name}': type must be a string such as 'bigint'")
        return columns


def _backend_spelling(value: Any) -> Any:
    """Streamling writes ``Postgres``, ``InMemory``, ``in-memory``; all mean the same here."""
    if not isinstance(value, str):
        return value
    folded = value.strip().lower().replace("-", "_")
    return {"inmemory": "in_memory", "memory": "in_memory"}.get(folded, folded)


class DynamicTable(StrictModel):
    """A set of keys that SQL transforms test with ``dynamic_table_check('id', expr)``.

    ``postgres``: a table created by ``cdcsync init`` that anyone may edit at any time; ``in_memory``: kept by the
    pipeline itself, lost on restart. With ``sql``, the pipeline adds the keys that query yields from its stream.
    """

    type: Literal["dynamic_table"]
    backend_type: Literal["postgres", "in_memory"]
    backend_entity_name: str = Field(min_length=1)
    """The table's name (``postgres``) or a label (``in_memory``)."""
    schema_: str = Field(default="public", alias="schema", min_length=1)
    sql: str | None = Field(default=None, min_length=1)
    """Fills the table from a stream: a projection and a filter yielding exactly one column, the key."""
    key_column: str | None = Field(default=None, min_length=1)
    """Defaults to the name of the column ``sql`` yields, else ``key``."""
    key_type: str | None = None
    """Postgres type of the key; defaults to the type of the column ``sql`` yields, else ``text``."""

    _normalise_backend = field_validator("backend_type", mode="before")(_backend_spelling)


TransformModel = SqlTransform | DynamicTable
TRANSFORM_TYPES: dict[str, type[StrictModel]] = {
    "sql": SqlTransform,
    "dynamic_table": DynamicTable,
    **CODE_TRANSFORM_TYPES,
}
