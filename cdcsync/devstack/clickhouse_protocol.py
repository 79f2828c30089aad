"""The ClickHouse HTTP interface as the dev server speaks it: error codes, compression, formats, INSERT data.

Shared by :mod:`cdcsync.devstack.clickhouse_engine` (which raises ClickHouse's errors) and
:mod:`cdcsync.devstack.clickhouse_server` (which reads requests and writes responses); see the latter for what
the dev server implements and what not.
"""

from __future__ import annotations

import gzip
import logging
import re
import sys
import zlib
from dataclasses import dataclass
from typing import Any

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
SETTING_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

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
            return InsertWithData(utf8(raw[:format_at]).rstrip(), text.decode(), raw[_data_start(raw, pos) :])
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


def utf8(raw: bytes) -> str:
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
