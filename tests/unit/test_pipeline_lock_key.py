"""The pipeline lock's key and the name its session carries: fixed, because runs of two cdcsync releases (a
rolling upgrade) must contend for the same lock."""

from __future__ import annotations

from datetime import UTC, datetime

from cdcsync.db.fence import fence_key, key_halves
from cdcsync.runtime.lock import LockHolder, _application_name, lock_key


def test_lock_key_is_fixed_per_pipeline_name() -> None:
    assert lock_key("shop") == 5365677549242646061
    assert lock_key("e2e") == 3984787897773536011
    assert lock_key("shop") != lock_key("shop2")
    assert all(-(2**63) <= lock_key(name) < 2**63 for name in ("a", "b", "é", ""))


def test_the_merge_fence_has_a_key_of_its_own() -> None:
    assert fence_key("shop") not in (lock_key("shop"), fence_key("shop2"))


def test_key_halves_are_what_pg_locks_shows() -> None:
    for key in (lock_key("shop"), -1, -(2**63), 2**63 - 1, 0):
        halves = key_halves(key)
        assert 0 <= halves["classid"] < 2**32 and 0 <= halves["objid"] < 2**32
        unsigned = (halves["classid"] << 32) | halves["objid"]
        assert unsigned - (2**64 if unsigned >= 2**63 else 0) == key


def test_application_name_fits_postgres_and_leads_with_pid_and_host() -> None:
    name = _application_name("p" * 100)
    assert len(name.encode()) == 63
    assert name.startswith("cdcsync ") and "@" in name.split()[1]
    assert _application_name("é").isascii()


def test_holder_description_names_pid_host_and_since() -> None:
    since = datetime(2026, 11, 26, 7, 46, 29, tzinfo=UTC)
    holder = LockHolder(backend_pid=77, pid=4242, host="runner-1", since=since, client_addr="10.0.0.5")
    assert holder.describe() == (
        "pid 4242 on host runner-1 since 2026-11-26 07:46:29 UTC (Postgres backend pid 77, client 10.0.0.5)"
    )
    stranger = LockHolder(backend_pid=78, pid=None, host=None, since=None, client_addr=None)
    assert stranger.describe() == "a session not opened by cdcsync (Postgres backend pid 78)"
