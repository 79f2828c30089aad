"""What every pipeline YAML model shares: unknown keys refused, keys given as one name or a list."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys are refused: a typo in YAML must never be silently ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def as_key_list(value: str | list[str] | None) -> list[str] | None:
    """``primary_key: id`` is a shorthand for ``primary_key: [id]``."""
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)
