"""A local HTTP server that answers POSTed JSON, for tests of code that calls a user's service (the handler
transform): each body is recorded and the test's ``answer`` decides the status and the JSON reply."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Answer = Callable[[Any], tuple[int, Any]]
"""Request body (parsed JSON) -> (HTTP status, JSON document to answer)."""


class JsonServer:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.bodies: list[Any] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.bodies.append(body)
                    answer = owner.answer
                status, document = answer(body)
                raw = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/enrich"


@contextmanager
def serving(answer: Answer) -> Iterator[JsonServer]:
    server = JsonServer(answer)
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()
