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
it listens on 127.0.0.1 only; ``--user`` and ``--host`` change both for the container image of
``containers/clickhouse``, which clients reach through Docker's port mapping), TLS, the native TCP protocol,
external data tables, ClickHouse's own ``compress=1``/``decompress=1`` block format, progress headers, streaming
(request bodies and results are held in memory whole), ``client_protocol_version`` block info (clients detect its
absence and fall back), readonly users.

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
import json
import logging
import signal
import socket
import sys
import threading
import time
import uuid
from base64 import b64decode
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from cdcsync.devstack.clickhouse_engine import (
    Engine,
)
from cdcsync.devstack.clickhouse_protocol import (
    AUTHENTICATION_FAILED,
    LOG,
    LOOPBACK,
    NOT_IMPLEMENTED,
    STD_EXCEPTION,
    SYNTAX_ERROR,
    USER,
    ClickHouseError,
    compress,
    content_type,
    decompress,
    response_encoding,
)

# -------------------------------------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: Engine, user: str) -> None:
        self.engine = engine
        self.user = user
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
        """No authentication, but no silent surprises either: only one user (``default`` unless told) exists."""
        user = params.get("user") or self.headers.get("X-ClickHouse-User")
        authorization = self.headers.get("Authorization", "")
        if not user and authorization.lower().startswith("basic "):
            with contextlib.suppress(ValueError):
                user = b64decode(authorization[6:].strip()).decode().split(":", 1)[0]
        if user and user != self.server.user:
            raise ClickHouseError(
                AUTHENTICATION_FAILED,
                f"{user}: Authentication failed: the cdcsync dev server only has the user '{self.server.user}' "
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


def serve(port: int, data_dir: Path, host: str = LOOPBACK, user: str = USER) -> int:
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
        server = _Server((host, port), engine, user)
    except OSError as exc:
        LOG.error("cannot listen on %s:%d: %s", host, port, exc)
        engine.close()
        return 1
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    LOG.info(
        "ClickHouse %s (chDB) ready at http://%s:%d, data in %s, timezone %s, started in %.2f s",
        engine.version,
        host,
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
        description="ClickHouse HTTP interface over the chDB engine (cdcsync dev stack; no auth, loopback by default).",
    )
    parser.add_argument("--port", type=int, required=True, help="TCP port")
    parser.add_argument("--host", default=LOOPBACK, help="address to listen on (0.0.0.0 only inside a container)")
    parser.add_argument("--user", default=USER, help="the one user name accepted (any password)")
    parser.add_argument("--data-dir", type=Path, required=True, help="where the engine keeps its databases")
    parser.add_argument("--log-level", default="INFO", help="DEBUG logs every request")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a crash inside the engine then leaves its stack in the log, not just a missing process
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    return serve(args.port, args.data_dir.absolute(), args.host, args.user)


if __name__ == "__main__":
    sys.exit(main())
