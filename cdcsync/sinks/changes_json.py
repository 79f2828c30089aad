"""Moved to :mod:`cdcsync.core.changes_json`, which the handler transform shares; this name stays importable for
the sinks written against it."""

from cdcsync.core.changes_json import OP_WORDS, dumps, rows

__all__ = ["OP_WORDS", "dumps", "rows"]
