"""HTTP requests to targets (the webhook sink, the handler transform), each failure classified where it happens.

Transient, so retried with backoff (:mod:`cdcsync.db.retry`): a connection refused or reset, a timeout, a 5xx,
``408 Request Timeout`` and ``429 Too Many Requests``. Any other 4xx means the receiver refuses what was sent,
which sending again cannot change: :class:`~cdcsync.core.errors.TargetRefused`, a user error. Messages name the
URL without its credentials and never a header's value.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from cdcsync.core.errors import SinkError, TargetRefused

RETRIABLE_STATUS = frozenset({408, 429})
"""4xx answers that mean "later", not "wrong"."""


def shown_url(url: str) -> str:
    """``url`` without user, password, query and fragment: what messages and logs may show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def post_json(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> int:
    """POST ``body`` (JSON) to ``url``; the status of a 2xx answer. Raises a retriable :class:`SinkError` for a
    transient failure and :class:`TargetRefused` for a refusal (see the module doc)."""
    return exchange_json(url, body, headers, timeout_s)[0]


def exchange_json(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
    """:func:`post_json`, also returning the answer's body (the handler transform reads it)."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    where = f"POST {shown_url(url)}"
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        status = error.code
        detail = _short(error.read())
        error.close()
        message = f"{where}: HTTP {status} {error.reason}{': ' + detail if detail else ''}"
        if status >= 500 or status in RETRIABLE_STATUS:
            raise SinkError(message, retriable=True) from None
        raise TargetRefused(message) from None
    except TimeoutError:
        raise SinkError(f"{where}: no answer within {timeout_s:g}s (timeout_s)", retriable=True) from None
    except (urllib.error.URLError, ConnectionError, http.client.HTTPException, OSError) as error:
        reason = getattr(error, "reason", None) or error
        raise SinkError(f"{where}: {reason}", retriable=True) from None


def _short(raw: bytes) -> str:
    """The start of an error answer's body, on one line."""
    text = raw[:300].decode("utf-8", "replace").strip()
    return " ".join(text.split())
