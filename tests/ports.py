"""Ports for servers the tests start themselves.

Asking the kernel for port 0 hands out a port from the ephemeral range, the same range every outgoing connection
takes its local port from: between the probe and the server's bind (seconds, for a JVM), a client of another test
can take it, and the server fails with "Address already in use" (seen in CI with a stand-alone Kafka broker).
These ports are drawn below the ephemeral range instead, where only a listening server takes a port.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 30000
"""Above the fixed ports of the tests' own stacks (25000-29999: the test session's, the fault suite's, the Spark
cluster's), so that a drawn port never takes one of theirs while its service is down for a fault."""


def _below_ephemeral() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default lower bound


def free_ports(count: int) -> list[int]:
    """`count` distinct ports nobody listens on now, none of which an outgoing connection will be given (on a
    host whose ephemeral range reaches below them, any free ports: the kernel's picks, as before)."""
    highest = _below_ephemeral() - 1
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randint(_LOWEST, highest) if highest - _LOWEST > 100 else 0
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(probe.getsockname()[1])
        if port not in chosen:
            chosen.append(port)
    return chosen


def free_port() -> int:
    return free_ports(1)[0]
