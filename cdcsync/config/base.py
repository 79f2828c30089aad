"""What every pipeline YAML model and its validation share: unknown keys refused, keys given as one name or a
list, suggestions for a misspelt name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys are refused: a typo in YAML must never be silently ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def as_key_list(value: str | list[str] | None) -> list[str] | None:
    """``primary_key: id`` is a shorthand for ``primary_key: [id]``."""
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to a misspelt ``word``, or nothing when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
