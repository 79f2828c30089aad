"""Fault injection: the real ``cdcsync`` command against the session's services while something goes wrong.

The end-to-end fixtures (a pipeline in a temporary project wired to the test's database, topic and state dir)
are the ones of ``tests/e2e``.
"""

from __future__ import annotations

from tests.e2e.conftest import make_project

__all__ = ["make_project"]
