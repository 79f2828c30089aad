"""The chDB engine behind the ClickHouse dev server, with ClickHouse's per-session and per-query state on top.

One engine serves the process (chDB allows one per process, bound to one data directory, which it locks); see
:mod:`cdcsync.devstack.clickhouse_server` for how sessions map to chDB connections.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdcsync.devstack.clickhouse_protocol import (
    BAD_ARGUMENTS,
    DEFAULT_FORMAT,
    DEFAULT_SESSION_TIMEOUT_S,
    LOG,
    MAX_SESSION_TIMEOUT_S,
    READONLY,
    SESSION_IS_LOCKED,
    SESSION_NOT_FOUND,
    SETTING_NAME_RE,
    SYNTAX_ERROR,
    TRANSPORT_PARAMS,
    UNKNOWN_SETTING,
    ClickHouseError,
    InsertWithData,
    output_format,
    quote_literal,
    split_insert,
    utf8,
)

# ------------------------------------------------------------------------------------------------ engine


@dataclass
class Outcome:
    """What a statement produced: the response body, its format (None: no result set) and the summary."""

    body: bytes
    fmt: str | None
    summary: dict[str, str]


@dataclass
class _Lease:
    """A connection lent to one request.

    ``sticky``: the session's own connection, whose state must survive the request; ``broken`` when that state
    could not be put back afterwards.
    """

    conn: Any
    sticky: bool
    broken: bool = False


@dataclass
class _Session:
    timeout_s: float
    conn: Any = None
    """Created on the first statement that leaves state behind (SET, USE, a temporary table); until then the
    session has nothing to remember and its requests run on fresh connections, which is cheaper than putting
    a long-lived connection's settings back after every query."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)


class Engine:
    """The chDB engine over one data directory, with ClickHouse's per-session and per-query state on top."""

    def __init__(self, data_dir: Path) -> None:
        import chdb  # noqa: F401  (bootstraps the engine library before its extension module is used)

        # The extension's connection API (query, send_insert, classify_query ...); its type stub lacks it.
        _chdb: Any = importlib.import_module("chdb._chdb")

        self._data_dir = str(data_dir)
        self._new_connection: Callable[[], Any] = lambda: _chdb.connect(self._data_dir)
        # The engine shuts down when its last connection closes; this one keeps it up for the process lifetime.
        self._anchor = self._new_connection()
        probe = "SELECT version(), timezone(), toString(getSetting('enable_http_compression'))"
        version, timezone, compression = json.loads(self._anchor.query(probe, "JSONCompactEachRow").bytes())
        self.version: str = version
        self.timezone: str = timezone
        # chDB's default is on, and clients read it from system.settings: they then send Accept-Encoding alone.
        self.http_compression_default: bool = compression in ("1", "true")
        self._sessions: dict[str, _Session] = {}
        self._sessions_lock = threading.Lock()
        self._running = 0
        self._idle = threading.Condition()

    def close(self, grace_s: float = 20.0) -> None:
        """Let statements in flight finish (up to ``grace_s``), then close every connection, the engine last."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._running == 0, timeout=grace_s):
                LOG.warning("closing the engine with %d statement(s) still running", self._running)
        with self._sessions_lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            _close_quietly(session.conn)
        _close_quietly(self._anchor)

    # -- connections and sessions

    @contextlib.contextmanager
    def _connection(self, params: Mapping[str, str], statement: str) -> Iterator[_Lease]:
        """A connection for one request: the session's own (locked) when it has state, else a fresh one."""
        session_id = params.get("session_id")
        if not session_id:
            fresh = _Lease(self._new_connection(), sticky=False)
            try:
                yield fresh
            finally:
                _close_quietly(fresh.conn)
            return
        session = self._session(session_id, params)
        if not session.lock.acquire(blocking=False):
            raise ClickHouseError(SESSION_IS_LOCKED, f"Session {session_id} is locked by a concurrent client")
        lease: _Lease | None = None
        try:
            if session.conn is None and _leaves_session_state(statement):
                session.conn = self._new_connection()
            lease = _Lease(session.conn or self._new_connection(), sticky=session.conn is not None)
            yield lease
        finally:
            if lease is not None and not lease.sticky:
                _close_quietly(lease.conn)
            session.last_used = time.monotonic()
            session.lock.release()
            broken = lease is not None and lease.broken
            if broken:
                LOG.warning("session %s: its own settings could not be put back; starting it afresh", session_id)
            if broken or params.get("close_session") in ("1", "true"):
                self._drop_session(session_id, session)

    def _session(self, session_id: str, params: Mapping[str, str]) -> _Session:
        try:
            timeout = float(params.get("session_timeout") or DEFAULT_SESSION_TIMEOUT_S)
        except ValueError as exc:
            raise ClickHouseError(BAD_ARGUMENTS, f"Invalid session timeout: '{params['session_timeout']}'") from exc
        if not 0 <= timeout <= MAX_SESSION_TIMEOUT_S:
            raise ClickHouseError(BAD_ARGUMENTS, f"Session timeout {timeout:g} is not in [0, {MAX_SESSION_TIMEOUT_S}]")
        now = time.monotonic()
        expired: list[_Session] = []
        with self._sessions_lock:
            for key, candidate in list(self._sessions.items()):
                if now - candidate.last_used > candidate.timeout_s and not candidate.lock.locked():
                    expired.append(self._sessions.pop(key))
            session = self._sessions.get(session_id)
            if session is None:
                if params.get("session_check") in ("1", "true"):
                    raise ClickHouseError(SESSION_NOT_FOUND, f"Session {session_id} not found")
                session = self._sessions[session_id] = _Session(timeout)
            else:
                session.timeout_s = timeout
            session.last_used = now  # in use from here on: no concurrent sweep may close it under this request
        for old in expired:
            _close_quietly(old.conn)
        return session

    def _drop_session(self, session_id: str, session: _Session) -> None:
        with self._sessions_lock:
            if self._sessions.get(session_id) is session:
                del self._sessions[session_id]
        _close_quietly(session.conn)

    # -- statements

    def execute(self, sql: bytes, params: Mapping[str, str], *, readonly: bool) -> Outcome:
        """Run one request's statement with its URL settings, database and bound parameters."""
        with self._idle:
            self._running += 1
        try:
            return self._execute(sql, params, readonly=readonly)
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def _execute(self, sql: bytes, params: Mapping[str, str], *, readonly: bool) -> Outcome:
        settings: dict[str, str] = {}
        bound: dict[str, str] = {}
        for name, value in params.items():
            if name.startswith("param_"):
                bound[name[len("param_") :]] = value
            elif name not in TRANSPORT_PARAMS:
                if not SETTING_NAME_RE.match(name):
                    raise ClickHouseError(UNKNOWN_SETTING, f"Unknown setting '{name}'")
                settings[name] = value
        database = params.get("database") or None
        insert = split_insert(sql)
        statement = insert.statement if insert else utf8(sql)
        with self._connection(params, statement) as lease:
            query_class = self._check_statement(lease.conn, statement, readonly)
            restore = self._apply(lease.conn, settings, database, statement if lease.sticky else None)
            try:
                if insert is not None:
                    return self._insert(lease.conn, insert)
                default_format = params.get("default_format") or DEFAULT_FORMAT
                return self._query(lease.conn, statement, default_format, bound, query_class)
            finally:
                if restore is not None and not restore():
                    lease.broken = True

    @staticmethod
    def _check_statement(conn: Any, statement: str, readonly: bool) -> str:
        info = conn.classify_query(statement)
        if info["statement_count"] > 1:
            raise ClickHouseError(SYNTAX_ERROR, "Syntax error (Multi-statements are not allowed)")
        query_class: str = info["query_class"].name
        if (
            readonly
            and query_class not in ("READ_ONLY", "UNKNOWN")
            and _leading_words(statement, 1) not in ("SET", "USE")
        ):
            raise ClickHouseError(
                READONLY,
                "Cannot execute query in readonly mode. For queries over HTTP, method GET implies readonly. "
                "You should use method POST for modifying queries",
            )
        return query_class

    def _apply(
        self, conn: Any, settings: Mapping[str, str], database: str | None, sticky_statement: str | None
    ) -> Callable[[], bool] | None:
        """Apply a request's settings and database; on a session's own connection, return how to undo that.

        URL settings belong to one query on a real server. A session's connection outlives the query, so the
        session's values are read first and put back afterwards; otherwise, say, one insert's
        ``insert_deduplication_token`` would silently deduplicate the session's next insert.
        """
        if not settings and not database:
            return None
        previous: list[str] = []
        if sticky_statement is not None:
            columns = ["currentDatabase()"] + [f"toString(getSetting({quote_literal(name)}))" for name in settings]
            previous = json.loads(self._run(conn, f"SELECT {', '.join(columns)}", "JSONCompactEachRow").bytes())
        if settings:
            assignments = ", ".join(f"{name} = {quote_literal(value)}" for name, value in settings.items())
            self._run(conn, f"SET {assignments}", DEFAULT_FORMAT)
        if database:
            self._run(conn, f"USE {_quote_identifier(database)}", DEFAULT_FORMAT)
        if sticky_statement is None:
            return None
        verb = _leading_words(sticky_statement, 1)

        def restore() -> bool:
            # A SET or USE statement is the session changing itself: keep what the statement set.
            values = dict(zip(settings, previous[1:], strict=True))
            names = [n for n in settings if not (verb == "SET" and re.search(rf"\b{n}\b", sticky_statement))]
            try:
                if names:
                    self._run(
                        conn, "SET " + ", ".join(f"{n} = {quote_literal(values[n])}" for n in names), DEFAULT_FORMAT
                    )
                if database and verb != "USE":
                    self._run(conn, f"USE {_quote_identifier(previous[0])}", DEFAULT_FORMAT)
            except ClickHouseError as exc:
                LOG.warning("putting session settings back: %s", exc.text)
                return False
            return True

        return restore

    @staticmethod
    def _run(conn: Any, sql: str, fmt: str, bound: Mapping[str, str] | None = None) -> Any:
        try:
            result = conn.query(sql, fmt, params=dict(bound or {}))
        except RuntimeError as exc:
            raise ClickHouseError.from_engine(exc) from None
        if result.has_error():
            raise ClickHouseError.from_engine(RuntimeError(result.error_message()))
        return result

    def _query(
        self, conn: Any, statement: str, default_format: str, bound: Mapping[str, str], query_class: str
    ) -> Outcome:
        result = self._run(conn, statement, default_format, bound)
        body = bytes(result.bytes())
        produces_result = query_class == "READ_ONLY" or bool(body)
        summary = _summary(
            read=(result.rows_read(), result.bytes_read()),
            written=(result.rows_written(), result.bytes_written()),
            elapsed_s=result.elapsed(),
        )
        if produces_result:
            summary["result_bytes"] = str(len(body))
        return Outcome(body, (output_format(statement) or default_format) if produces_result else None, summary)

    @staticmethod
    def _insert(conn: Any, insert: InsertWithData) -> Outcome:
        try:
            handle = conn.send_insert(insert.statement, insert.fmt)
        except RuntimeError as exc:
            raise ClickHouseError.from_engine(exc) from None
        try:
            if insert.data:
                conn.insert_append(handle, insert.data)
            result = conn.insert_done(handle)
        except RuntimeError as exc:
            with contextlib.suppress(Exception):
                conn.insert_cancel(handle)
            raise ClickHouseError.from_engine(exc) from None
        summary = _summary(
            read=(0, 0), written=(result.rows_written(), result.bytes_written()), elapsed_s=result.elapsed()
        )
        return Outcome(b"", None, summary)


_LEADING_NOISE_RE = re.compile(r"(?:\s+|--[^\n]*|/\*.*?\*/|\()*", re.DOTALL)
_SESSION_STATE_RE = re.compile(r"(SET|USE)\b|CREATE\s+(OR\s+REPLACE\s+)?TEMPORARY\b", re.IGNORECASE)


def _leading_words(statement: str, count: int) -> str:
    """The statement's first words, upper-cased, after comments and opening parentheses."""
    start = _LEADING_NOISE_RE.match(statement)
    rest = statement[start.end() if start else 0 :]
    return " ".join(rest.split(None, count)[:count]).upper()


def _leaves_session_state(statement: str) -> bool:
    start = _LEADING_NOISE_RE.match(statement)
    return _SESSION_STATE_RE.match(statement, start.end() if start else 0) is not None


def _close_quietly(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


def _quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _summary(*, read: tuple[int, int], written: tuple[int, int], elapsed_s: float) -> dict[str, str]:
    """ClickHouse's X-ClickHouse-Summary fields (numbers as strings, as the server sends them)."""
    return {
        "read_rows": str(read[0]),
        "read_bytes": str(read[1]),
        "written_rows": str(written[0]),
        "written_bytes": str(written[1]),
        "total_rows_to_read": str(read[0]),
        "elapsed_ns": str(int(elapsed_s * 1e9)),
    }
