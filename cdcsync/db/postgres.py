"""Postgres connections from the settings, for the commands that talk to Postgres from the driver (``migrate``,
``run``'s start-up checks): one way to connect, one message when the server cannot be reached."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdcsync.core.errors import ServiceError

if TYPE_CHECKING:
    import psycopg

    from cdcsync.config.settings import Settings


def connect_from_settings(settings: Settings) -> psycopg.Connection[Any]:
    """A connection to ``CDCSYNC__POSTGRES__DSN``; an unreachable server is a retriable ServiceError (DSN
    redacted)."""
    import psycopg

    from cdcsync.config.settings import redact_dsn

    try:
        return psycopg.connect(settings.postgres_dsn, connect_timeout=10)
    except psycopg.OperationalError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "connection failed"
        raise ServiceError(
            f"connecting to Postgres at {redact_dsn(settings.postgres_dsn)}: {first_line}",
            hint="start the dev stack with `cdcsync dev up`, or set CDCSYNC__POSTGRES__DSN",
            retriable=True,
        ) from None
