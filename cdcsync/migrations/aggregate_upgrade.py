"""Upgrading an aggregation table whose running state changed layout (not its meaning) between cdcsync versions.

``postgres_aggregate`` sinks once kept a declared-type ``sum`` in its declared type (rounding every row) and an
``avg`` declared ``double precision`` over exact columns in ``double precision``; ``avg`` of an unconstrained
``numeric`` did not know its rows' largest scale. The readable columns mean the same as before, so ``cdcsync init``
writes an upgrade migration instead of refusing the change: it adds the new state columns, rebuilds the running
state of the changed aggregates from the landing table (with the landing table locked, so no change slips
between), re-creates the generated ``avg`` columns whose expression changed and replaces the trigger functions.
Anything else that differs is a real change of the aggregation, which stays destructive.

The trigger functions themselves change between versions too (the SQL gets cheaper, the results stay the same).
The state records their ``revision`` (a state without one is revision 1): a newer revision is an upgrade that only
replaces the functions, ``CREATE OR REPLACE`` from the same template as a new sink's.
"""

from __future__ import annotations

from typing import Any

_STATE_KEYS = frozenset({"accumulator_type", "scale_index"})
"""Keys of an aggregate's state entry that only describe how its running state is kept."""
TRIGGER_REVISION = 2
"""The revision of the trigger functions ``aggregate.sql.j2`` renders. 2: one statement per event, step 2 folded into
step 1, step 3 only when a group emptied, each shared value aggregated once."""


def changed_state(before: dict[str, Any] | None, after: dict[str, Any] | None) -> tuple[str, ...] | None:
    """Names of the aggregates whose running state must be rebuilt (none: only the trigger functions are replaced),
    or None when the change is not an upgrade."""
    if before is None or after is None or before == after:
        return None
    kept = ("aggregates", "revision")
    if {k: v for k, v in before.items() if k not in kept} != {k: v for k, v in after.items() if k not in kept}:
        return None
    old, new = before["aggregates"], after["aggregates"]
    if len(old) != len(new):
        return None
    changed = []
    for was, now in zip(old, new, strict=True):
        if {k: v for k, v in was.items() if k not in _STATE_KEYS} != {
            k: v for k, v in now.items() if k not in _STATE_KEYS
        }:
            return None
        if any(was.get(key) != now.get(key) for key in _STATE_KEYS):
            changed.append(now["name"])
    return tuple(changed)


def describe(sink: dict[str, Any], changed: tuple[str, ...]) -> list[str]:
    """The header lines of an upgrade migration."""
    from cdcsync.sql.render import quote_ident, quote_qualified

    target = quote_qualified(sink["schema"], sink["aggregate"]["table"])
    if not changed:
        landing = quote_qualified(sink["schema"], sink["table"])
        return [
            f"the trigger functions on {landing} that keep {target}, replaced by revision "
            f"{sink['aggregate'].get('revision', 1)} (same results, cheaper SQL; the tables are unchanged)"
        ]
    return [
        f"the running state of {', '.join(quote_ident(name) for name in changed)} in {target}, kept at full "
        f"precision from now on and rebuilt from the landing table {quote_qualified(sink['schema'], sink['table'])}",
        "  (the landing table is locked while this runs; generated avg columns are re-created, last in the table)",
    ]
