"""The shared recording server of a test module (one per module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving.server.helpers import Conn, connect, start_server


@pytest.fixture(scope="module")
def shared(tiny_registry: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Conn]:
    """One recording server for the tests that do not need a configuration of their own."""
    server = start_server(tmp_path_factory.mktemp("shared-server"), tiny_registry, metrics_port=0)
    conn = connect(server)
    yield conn
    conn.channel.close()
    server.stop()
