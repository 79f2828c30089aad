"""A development stand-in for clickhouse-server: the real ClickHouse engine (chDB) behind the ClickHouse HTTP API.

No clickhouse-server that today's clients can talk to installs without Docker, but the ClickHouse engine itself
ships on PyPI as chDB (``chdb-core``: ClickHouse 26.x compiled into a Python extension). This module serves that
engine over the part of the ClickHouse HTTP interface that clickhouse-connect uses, so cdcsync's ClickHouse code
and tests run against real ClickHouse semantics (ReplacingMergeTree, ``FINAL``, ``OPTIMIZE``, insert
deduplication tokens, ``system.*`` tables) with nothing but ``pip install``.

What it implements, as clickhouse-server does:

* ``GET /ping`` (and ``/replicas_status``, ``GET /`` without a query): ``Ok.``
* queries from the ``query`` URL parameter, the body, or both (the parameter, a newline, then the body), and from
  ``multipart/form-data`` fields (clickhouse-connect's form encoding of large bound parameters);
* ``INSERT ... FORMAT <any input format>`` with the data after the format name, handed to the engine's insert API;
  ``INSERT ... VALUES`` / ``INSERT ... SELECT`` as ordinary statements;
* URL parameters: ``database``, ``default_format``, ``query_id``, ``session_id`` / ``session_timeout`` /
  ``session_check`` / ``close_session``, ``param_<name>`` bound parameters, ``enable_http_compression``, and
  every other parameter as a ClickHouse setting for that query only;
* request bodies in ``Content-Encoding`` gzip, deflate, lz4 or zstd (clickhouse-connect's ``compress`` choices);
  responses compressed the same way when ``enable_http_compression`` is on (chDB's default, which clients read from
  ``system.settings``) and ``Accept-Encoding`` asks for it;
* response headers ``X-ClickHouse-Query-Id``, ``-Summary``, ``-Timezone``, ``-Format``,
  ``-Server-Display-Name``; errors with ClickHouse's HTTP status, ``X-ClickHouse-Exception-Code`` and a
  ``Code: N. DB::Exception: ...`` body, so clients raise the same error codes as against a real server.

What it does not do: authentication (user ``default`` with any password is accepted, any other user is refused;
it listens on 127.0.0.1 only), TLS, the native TCP protocol, external data tables, ClickHouse's own
``compress=1``/``decompress=1`` block format, progress headers, streaming (request bodies and results are held in
memory whole), ``client_protocol_version`` block info (clients detect its absence and fall back), readonly users.

One engine serves the process (chDB allows one per process, bound to one data directory, which it locks). A
ClickHouse session (``session_id``) gets a chDB connection of its own once it runs a statement that leaves state
behind (``SET``, ``USE``, a temporary table), so that state lives as long as the session, as on a server; other
requests run on a fresh connection each (cheap: well under a millisecond). chDB runs statements of different
connections concurrently, so the HTTP server uses a thread per request and only a session's own statements are
serialised (a second concurrent request in a session fails with ``SESSION_IS_LOCKED``, as on a server).
"""

from __future__ import annotations

import argparse
import contextlib
import email.parser
import email.policy
import faulthandler
import gzip
import importlib
import json
import logging
import re
import signal
import socket
import sys
import threading
import time
import uuid
import zlib
from base64 import b64decode
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

LOG = logging.getLogger("cdcsync.devstack.clickhouse")

LOOPBACK = "127.0.0.1"
USER = "default"
DEFAULT_FORMAT = "TabSeparated"
DEFAULT_SESSION_TIMEOUT_S = 60
MAX_SESSION_TIMEOUT_S = 3600
# How far into a request to look for an INSERT's FORMAT clause before treating the whole request as SQL text.
MAX_INSERT_HEAD = 1 << 20

# URL parameters of the HTTP interface itself; every other parameter (except param_*) is a ClickHouse setting.
TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "close_session",
        "user",
        "password",
        "quota_key",
        "role",
        "buffer_size",
        "wait_end_of_query",
        "client_protocol_version",
        "stacktrace",
        "compress",
        "decompress",
    }
)
_SETTING_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# ClickHouse error codes this module raises itself (the engine's own errors keep the engine's codes).
SYNTAX_ERROR = (62, "SYNTAX_ERROR")
BAD_ARGUMENTS = (36, "BAD_ARGUMENTS")
NOT_IMPLEMENTED = (48, "NOT_IMPLEMENTED")
UNKNOWN_SETTING = (115, "UNKNOWN_SETTING")
READONLY = (164, "READONLY")
CANNOT_DECOMPRESS = (271, "CANNOT_DECOMPRESS")
SESSION_NOT_FOUND = (372, "SESSION_NOT_FOUND")
SESSION_IS_LOCKED = (373, "SESSION_IS_LOCKED")
AUTHENTICATION_FAILED = (516, "AUTHENTICATION_FAILED")
STD_EXCEPTION = (1001, "STD_EXCEPTION")

# HTTP status per ClickHouse error code, following clickhouse-server: bad input 400, unknown objects 404,
# access 403, not implemented 501, everything else 500. (503/504 are avoided: clients retry those.)
_HTTP_STATUS: dict[int, int] = {
    **dict.fromkeys((6, 26, 27, 36, 38, 41, 53, 62, 72, 117, 271, 321), 400),
    **dict.fromkeys((164, 192, 193, 516), 403),
    **dict.fromkeys((46, 47, 50, 56, 60, 63, 73, 81, 115, 372), 404),
    48: 501,
}

_ENGINE_ERROR_RE = re.compile(r"Code: (\d+)\. ")
_ERROR_NAME_RE = re.compile(r"\(([A-Z][A-Z0-9_]+)\)\s*$")
_FORMAT_CLAUSE_RE = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)(?:\s+SETTINGS\b[^;]*)?\s*;?\s*$", re.IGNORECASE)
# One SQL token at a time, enough to find an INSERT's FORMAT clause without being fooled by quoted names.
_TOKEN_RE = re.compile(
    rb"""
    (?P<space>\s+)
    |(?P<comment>--[^\n]*|/\*.*?\*/)
    |(?P<quoted>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*"|`(?:[^`\\]|\\.|``)*`)
    |(?P<word>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)

_CONTENT_TYPES = (
    (re.compile(r"^(TabSeparated|TSV)", re.I), "text/tab-separated-values; charset=UTF-8"),
    (re.compile(r"^CSV", re.I), "text/csv; charset=UTF-8; header=absent"),
    (re.compile(r"^(JSON|NDJSON)", re.I), "application/json; charset=UTF-8"),
    (
        re.compile(r"^(Native|RowBinary|Arrow|Parquet|ORC|Avro|MsgPack|Protobuf|CapnProto|BSON)", re.I),
        "application/octet-stream",
    ),
)


class ClickHouseError(Exception):
    """An error to report the way clickhouse-server does: a code, its name, and ``Code: N. DB::Exception: ...``."""

    def __init__(self, error: tuple[int, str], message: str, *, text: str | None = None) -> None:
        self.code, self.name = error
        self.text = text or f"Code: {self.code}. DB::Exception: {message}. ({self.name})"
        super().__init__(self.text)

    @classmethod
    def from_engine(cls, exc: BaseException) -> ClickHouseError:
        """chDB raises RuntimeError with ClickHouse's own message (sometimes behind a prefix); keep code and text."""
        message = str(exc)
        match = _ENGINE_ERROR_RE.search(message)
        if match is None:
            return cls(STD_EXCEPTION, message.strip() or type(exc).__name__)
        text = message[match.start() :].strip()
        name = _ERROR_NAME_RE.search(text)
        return cls((int(match.group(1)), name.group(1) if name else "UNKNOWN"), "", text=text)

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS.get(self.code, 500)


# ------------------------------------------------------------------------------------------ wire formats


def decompress(data: bytes, encoding: str) -> bytes:
    """Undo a request's ``Content-Encoding``.

    clickhouse-connect compresses every insert block on its own, so an lz4 or zstd body is a sequence of frames,
    and all of them are read.
    """
    method = encoding.strip().lower()
    try:
        if method in ("", "identity", "none"):
            return data
        if method == "gzip":
            return gzip.decompress(data)
        if method == "deflate":
            try:
                return zlib.decompress(data)
            except zlib.error:
                return zlib.decompress(data, -zlib.MAX_WBITS)  # raw deflate, as some clients send it
        if method == "zstd":
            return _zstd().decompress(data)
        if method == "lz4":
            import lz4.frame

            parts: list[bytes] = []
            rest = data
            while rest:
                decompressor = lz4.frame.LZ4FrameDecompressor()
                parts.append(decompressor.decompress(rest))
                if not decompressor.eof:
                    raise ValueError("truncated lz4 frame")
                rest = decompressor.unused_data
            return b"".join(parts)
    except ClickHouseError:
        raise
    except Exception as exc:
        raise ClickHouseError(CANNOT_DECOMPRESS, f"Cannot decompress the {method} request body: {exc}") from exc
    raise ClickHouseError(
        NOT_IMPLEMENTED,
        f"Content-Encoding '{encoding}' is not supported by the cdcsync dev server; use gzip, deflate, lz4 or zstd",
    )


def compress(data: bytes, method: str) -> bytes:
    if method == "gzip":
        return gzip.compress(data, compresslevel=3)
    if method == "deflate":
        return zlib.compress(data, 3)
    if method == "zstd":
        return bytes(_zstd().compress(data))
    if method == "lz4":
        import lz4.frame

        return bytes(lz4.frame.compress(data))
    raise ValueError(method)


def response_encoding(accept_encoding: str | None) -> str | None:
    """The first method of the client's ``Accept-Encoding`` list that we can produce, in the client's order."""
    for item in (accept_encoding or "").split(","):
        method = item.split(";", 1)[0].strip().lower()
        if method in ("gzip", "deflate", "zstd", "lz4") and _available(method):
            return method
    return None


def _available(method: str) -> bool:
    try:
        if method == "zstd":
            _zstd()
        elif method == "lz4":
            import lz4.frame  # noqa: F401
    except ImportError:
        return False
    return True


def _zstd() -> Any:
    """Python 3.14 has zstd in the standard library; before that clickhouse-connect depends on its backport."""
    if sys.version_info >= (3, 14):
        from compression import zstd
    else:
        from backports import zstd
    return zstd


def content_type(fmt: str | None) -> str:
    if fmt:
        for pattern, value in _CONTENT_TYPES:
            if pattern.match(fmt):
                return value
    return "text/plain; charset=UTF-8"


# --------------------------------------------------------------------------------------------- SQL text


@dataclass(frozen=True)
class InsertWithData:
    """``INSERT ... FORMAT <fmt>`` followed by data: the statement without its FORMAT clause, and the raw data."""

    statement: str
    fmt: str
    data: bytes


def split_insert(raw: bytes) -> InsertWithData | None:
    """Find where an INSERT's data starts, as clickhouse-server's parser does; None for any other request.

    The data follows the format name: after spaces and tabs, and after one line break if there is one (so a
    binary block whose first byte happens to be whitespace is left intact after the usual newline). INSERTs with
    ``VALUES`` or ``SELECT`` carry no separate data and are run as plain SQL.
    """
    pos, depth, format_at, first = 0, 0, -1, True
    limit = min(len(raw), MAX_INSERT_HEAD)
    while pos < limit:
        match = _TOKEN_RE.match(raw, pos)
        if match is None:  # cannot happen: `other` matches any byte
            return None
        kind, text, pos = match.lastgroup, match.group(), match.end()
        if kind in ("space", "comment"):
            continue
        if first:
            if kind != "word" or text.upper() != b"INSERT":
                return None
            first = False
        elif format_at >= 0:
            if kind != "word":
                return None  # FORMAT without a name: let the engine report the syntax error
            return InsertWithData(_utf8(raw[:format_at]).rstrip(), text.decode(), raw[_data_start(raw, pos) :])
        elif kind == "other":
            depth += {b"(": 1, b")": -1}.get(text, 0)
        elif kind == "word" and depth == 0:
            upper = text.upper()
            if upper == b"FORMAT":
                format_at = match.start()
            elif upper in (b"VALUES", b"SELECT", b"WITH"):
                return None
    return None


def _data_start(raw: bytes, pos: int) -> int:
    while pos < len(raw) and raw[pos] in b" \t\f":
        pos += 1
    if raw.startswith(b"\r", pos):
        pos += 1
    if raw.startswith(b"\n", pos):
        pos += 1
    return pos


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClickHouseError(
            BAD_ARGUMENTS, f"the query text is not valid UTF-8 at byte {exc.start}; the dev server cannot run it"
        ) from exc


def output_format(statement: str) -> str | None:
    match = _FORMAT_CLAUSE_RE.search(statement)
    return match.group(1) if match else None


def quote_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
                if not _SETTING_NAME_RE.match(name):
                    raise ClickHouseError(UNKNOWN_SETTING, f"Unknown setting '{name}'")
                settings[name] = value
        database = params.get("database") or None
        insert = split_insert(sql)
        statement = insert.statement if insert else _utf8(sql)
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


# -------------------------------------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        self.engine = engine
        self.display_name = socket.gethostname()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client dropping its pooled connection is routine, not a traceback in the log."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            LOG.debug("connection from %s ended: %s", client_address, error)
            return
        LOG.exception("error while serving %s", client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clickhouse-connect pools its connections
    server_version = "cdcsync-clickhouse-devserver"
    timeout = 600  # an idle pooled connection frees its thread after this long
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without this, Nagle's algorithm meets the client's delayed
        # ACK and every response waits ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._handle(readonly=True)

    def do_POST(self) -> None:
        self._handle(readonly=False)

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("%s " + format, self.address_string(), *args)

    def _handle(self, *, readonly: bool) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        try:
            body = self._read_body()
        except (OSError, ValueError) as exc:
            self.close_connection = True
            LOG.warning("unreadable request body: %s", exc)
            return
        if url.path in ("/ping", "/replicas_status"):
            self._send(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        if url.path != "/":
            self._send(404, f"There is no handle {url.path}\n".encode(), {"Content-Type": "text/plain; charset=UTF-8"})
            return
        engine = self.server.engine
        try:
            self._authenticate(params)
            sql = self._request_sql(params, body)
            if not sql.strip():
                if readonly:
                    self._send(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
                    return
                raise ClickHouseError(SYNTAX_ERROR, "Empty query")
            if params.get("compress") in ("1", "true") or params.get("decompress") in ("1", "true"):
                raise ClickHouseError(NOT_IMPLEMENTED, "compress=1/decompress=1 are not supported by the dev server")
            outcome = engine.execute(sql, params, readonly=readonly)
        except ClickHouseError as error:
            self._send_error(error, query_id)
            return
        except Exception as exc:  # a bug here must still answer the client, and leave a trace in the log
            LOG.exception("query %s failed unexpectedly", query_id)
            self._send_error(ClickHouseError(STD_EXCEPTION, f"{type(exc).__name__}: {exc}"), query_id)
            return
        headers = {
            "Content-Type": content_type(outcome.fmt),
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": params.get("session_timezone") or engine.timezone,
            "X-ClickHouse-Summary": json.dumps(outcome.summary, separators=(",", ":")),
        }
        if outcome.fmt:
            headers["X-ClickHouse-Format"] = outcome.fmt
        payload = outcome.body
        compression = params.get("enable_http_compression")
        if compression in ("1", "true") or (compression is None and engine.http_compression_default):
            method = response_encoding(self.headers.get("Accept-Encoding"))
            if method:
                payload = compress(payload, method)
                headers["Content-Encoding"] = method
        self._send(200, payload, headers)

    def _read_body(self) -> bytes:
        """The whole request body, also when chunked (urllib3 streams generator bodies, e.g. inserts, that way)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline(3)  # CRLF after each chunk
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _authenticate(self, params: dict[str, str]) -> None:
        """No authentication, but no silent surprises either: only the ``default`` user exists here."""
        user = params.get("user") or self.headers.get("X-ClickHouse-User")
        authorization = self.headers.get("Authorization", "")
        if not user and authorization.lower().startswith("basic "):
            with contextlib.suppress(ValueError):
                user = b64decode(authorization[6:].strip()).decode().split(":", 1)[0]
        if user and user != USER:
            raise ClickHouseError(
                AUTHENTICATION_FAILED,
                f"{user}: Authentication failed: the cdcsync dev server only has the user '{USER}' "
                "(any password is accepted)",
            )

    def _request_sql(self, params: dict[str, str], body: bytes) -> bytes:
        """The statement, and any INSERT data: query parameter, a newline, then the (decompressed) body."""
        content_type_header = self.headers.get("Content-Type", "")
        if content_type_header.lower().startswith("multipart/form-data"):
            self._read_form(params, content_type_header, body)
            return params.get("query", "").encode()
        body = decompress(body, self.headers.get("Content-Encoding", ""))
        query = params.get("query", "")
        return (query.encode() + b"\n" + body) if query else body

    @staticmethod
    def _read_form(params: dict[str, str], content_type_header: str, body: bytes) -> None:
        """Form fields are parameters like those of the URL; file fields would be external tables."""
        head = f"Content-Type: {content_type_header}\r\nMIME-Version: 1.0\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if part.get_filename() is not None:
                raise ClickHouseError(NOT_IMPLEMENTED, "external data tables are not supported by the dev server")
            if isinstance(name, str):
                payload = part.get_payload(decode=True)
                params[name] = payload.decode() if isinstance(payload, bytes) else str(payload or "")

    def _send_error(self, error: ClickHouseError, query_id: str) -> None:
        if error.code in (STD_EXCEPTION[0],):
            LOG.warning("query %s: %s", query_id, error.text)
        body = f"{error.text} (version {self.server.engine.version})\n".encode()
        headers = {
            "Content-Type": "text/plain; charset=UTF-8",
            "X-ClickHouse-Exception-Code": str(error.code),
            "X-ClickHouse-Query-Id": query_id,
        }
        self._send(error.http_status, body, headers)

    def _send(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("X-ClickHouse-Server-Display-Name", self.server.display_name)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


# ------------------------------------------------------------------------------------------------- main


def serve(port: int, data_dir: Path) -> int:
    """Open the engine, then bind: an open port means a ready server, which is what ``wait_ready`` relies on."""
    started = time.monotonic()
    stop = threading.Event()  # first: a SIGTERM while the engine opens must still end in a clean close
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        engine = Engine(data_dir)
    except Exception as exc:
        LOG.error("cannot open the ClickHouse engine on %s: %s", data_dir, exc)
        return 1
    try:
        server = _Server((LOOPBACK, port), engine)
    except OSError as exc:
        LOG.error("cannot listen on %s:%d: %s", LOOPBACK, port, exc)
        engine.close()
        return 1
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    LOG.info(
        "ClickHouse %s (chDB) ready at http://%s:%d, data in %s, timezone %s, started in %.2f s",
        engine.version,
        LOOPBACK,
        port,
        data_dir,
        engine.timezone,
        time.monotonic() - started,
    )
    # Poll, never block for good: the kernel may deliver SIGTERM to one of the engine's threads, and then Python
    # runs the handler only when the main thread next wakes up.
    while not stop.wait(0.2):
        pass
    LOG.info("stopping")
    server.shutdown()
    server.server_close()
    engine.close()
    LOG.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cdcsync.devstack.clickhouse_server",
        description="ClickHouse HTTP interface over the chDB engine (cdcsync dev stack; no auth, loopback only).",
    )
    parser.add_argument("--port", type=int, required=True, help=f"TCP port on {LOOPBACK}")
    parser.add_argument("--data-dir", type=Path, required=True, help="where the engine keeps its databases")
    parser.add_argument("--log-level", default="INFO", help="DEBUG logs every request")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a crash inside the engine then leaves its stack in the log, not just a missing process
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    return serve(args.port, args.data_dir.absolute())


if __name__ == "__main__":
    sys.exit(main())
