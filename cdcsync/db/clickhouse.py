"""ClickHouse connections and the transient-or-terminal classification of their failures.

Shared by the ClickHouse sink, its migrations and ``cdcsync status``: one way to connect, one way to say whether
a failed call is worth a retry; and clients kept for the next task (:func:`reused_client`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cdcsync.core import errors
from cdcsync.core.errors import CdcsyncError, MigrationError, ServiceError, SinkError
from cdcsync.sql.render import render

if TYPE_CHECKING:
    from cdcsync.config.settings import Settings

# ClickHouse error codes worth a retry: timeouts, network trouble, overload, an insert of unknown outcome.
_RETRIABLE_CODES = frozenset({3, 159, 202, 209, 210, 236, 241, 242, 252, 285, 319, 394, 425, 999})


def connect(url: str, *, compression: str = "none", **kwargs: Any) -> Any:
    """A clickhouse-connect client for ``url`` without a server session, so concurrent tasks never share one."""
    import clickhouse_connect

    compress: str | bool = False if compression == "none" else compression
    return clickhouse_connect.get_client(dsn=url, compress=compress, autogenerate_session_id=False, **kwargs)


_KEPT = 4
"""Idle clients kept per process, whatever their URL (the oldest is dropped first): a worker runs one task at a
time, with room for a second server or sink compression."""
_idle: list[tuple[int, tuple[str, str], Any]] = []
_idle_lock = threading.Lock()


@contextlib.contextmanager
def reused_client(url: str, *, compression: str = "none") -> Iterator[Any]:
    """A client for ``url`` that sends bound parameters in the request body (``form_encode_query_params``), kept
    from an earlier caller in this process or new; kept for the next caller when this one is done, closed when it
    raised.

    Why keep them: a new clickhouse-connect client first asks the server for its version and settings, about 20 ms
    and 7 ms of the caller's CPU, and every task of a ClickHouse sink made one (3% of the Python workers' time in
    ``make bench-clickhouse``). A client holds no server session (:func:`connect`), only urllib3's pool of HTTP
    connections, which opens a new one where the server has closed the old: a kept client fails where a new one
    would. Never one made before a fork: the parent's sockets are not the child's."""
    key = (url, compression)
    client = _take(key)
    if client is None:
        client = connect(url, compression=compression, form_encode_query_params=True)
    try:
        yield client
    except BaseException:
        client.close()
        raise
    with _idle_lock:
        _idle.append((os.getpid(), key, client))
        oldest = _idle.pop(0) if len(_idle) > _KEPT else None
    if oldest is not None and oldest[0] == os.getpid():
        oldest[2].close()


def _take(key: tuple[str, str]) -> Any:
    with _idle_lock:
        found = next((i for i, (pid, k, _) in enumerate(_idle) if k == key and pid == os.getpid()), None)
        return None if found is None else _idle.pop(found)[2]


def is_retriable(error: BaseException) -> bool:
    """Connection trouble (clickhouse-connect's OperationalError) and the transient server codes above."""
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    if isinstance(error, OperationalError | ConnectionError | TimeoutError):
        return True
    if isinstance(error, DatabaseError):
        return getattr(error, "code", None) in _RETRIABLE_CODES
    return False


def first_line(error: BaseException) -> str:
    return errors.first_line(error)[:500]


def wrap_clickhouse_error(error: BaseException, doing: str, *, user_error: bool = False) -> CdcsyncError:
    """A CdcsyncError for a failed ClickHouse call: retriable when a retry may help, else a user or sink error."""
    if is_retriable(error):
        return ServiceError(first_line(error), retriable=True).add_context(doing)
    if user_error:
        return MigrationError(first_line(error)).add_context(doing)
    return SinkError(first_line(error)).add_context(doing)


def count_rows(client: Any, database: str, table: str) -> int:
    """Current (not deleted) rows, for ``cdcsync status``."""
    return int(client.command(render("clickhouse/runtime/count_rows.sql.j2", target=(database, table))))


def raw_rows(client: Any, database: str, table: str) -> int:
    """Every row the table holds, superseded and deleted ones too (from the parts' metadata, no scan)."""
    return int(client.command(render("clickhouse/runtime/raw_rows.sql.j2", target=(database, table))))


def connect_from_settings(settings: Settings) -> Any:
    """A client for ``CDCSYNC__CLICKHOUSE__URL``; an unreachable server is a retriable ServiceError (URL redacted)."""
    from cdcsync.config.settings import redact_dsn

    try:
        client = connect(settings.clickhouse_url, connect_timeout=10)
        client.ping()
    except Exception as error:
        raise ServiceError(
            f"connecting to ClickHouse at {redact_dsn(settings.clickhouse_url)}: {first_line(error)}",
            hint="start the dev stack with `cdcsync dev up`, or set CDCSYNC__CLICKHOUSE__URL",
            retriable=True,
        ) from None
    return client
