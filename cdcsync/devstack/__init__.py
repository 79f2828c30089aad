"""Local services for ``cdcsync dev`` and the tests: real Postgres and Kafka, started without Docker."""

from cdcsync.devstack.common import DevStackConfig, ServiceStatus
from cdcsync.devstack.stack import down, env_lines, status, up

__all__ = ["DevStackConfig", "ServiceStatus", "down", "env_lines", "status", "up"]
