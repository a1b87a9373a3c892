"""The server closes client connections after ``max_connection_age_seconds`` (GOAWAY), and a
client keeps working through the reconnects: that is how replicas added later get a share of
clients that are already connected.

Connections are read from the kernel (``/proc/net/tcp*``): the client's local port changes with
each new TCP connection, so the set of local ports connected to the server's port counts them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from allocator.serving.client import AllocatorClient
from tests.serving.server.helpers import price_window, start_server

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads the connections from /proc/net/tcp"
)
ESTABLISHED = "01"


def client_ports(server_port: int) -> set[int]:
    """Local ports of the established connections to ``server_port`` on this host (gRPC opens
    IPv6 sockets, IPv4 addresses mapped into them: both tables are read)."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == ESTABLISHED and int(remote.rsplit(":", 1)[1], 16) == server_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def connections_during_calls(target: str, port: int, seconds: float, enough: int) -> set[int]:
    """Call the server for ``seconds`` (or until ``enough`` connections were seen); every call
    must succeed. Returns the client ports seen."""
    seen: set[int] = set()
    prices = price_window(3)
    with AllocatorClient(target, timeout=10.0) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(seen) < enough:
            allocation = client.allocate("fund", ["A", "B", "C"], prices)
            assert allocation.smoothed_weights.sum() > 0.99
            seen |= client_ports(port)
            time.sleep(0.01)
    return seen


def test_connections_are_closed_after_their_age_and_clients_reconnect(
    tiny_registry: Path, tmp_path: Path
) -> None:
    server = start_server(
        tmp_path,
        tiny_registry,
        max_connection_age_seconds=0.2,
        max_connection_age_grace_seconds=0.5,
    )
    try:
        seen = connections_during_calls(server.target, server.port, seconds=20.0, enough=3)
    finally:
        server.stop()
    assert len(seen) >= 3, f"one connection per 0.2 s expected, saw ports {sorted(seen)}"


def test_by_default_a_connection_lives_on(tiny_registry: Path, tmp_path: Path) -> None:
    server = start_server(tmp_path, tiny_registry)
    assert server.config.max_connection_age_seconds == 300.0
    assert server.config.max_connection_age_grace_seconds == 30.0
    try:
        seen = connections_during_calls(server.target, server.port, seconds=1.0, enough=2)
    finally:
        server.stop()
    assert len(seen) == 1, sorted(seen)
