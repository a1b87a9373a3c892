"""A migrated trade database on SQLite and Postgres, prices in it, and a real allocation server.

The server is the real one (in process, on a free port) serving the tiny exported test model of
``tests/serving`` and recording its decisions into the same trade database, so a cycle's
decision, orders, fills, positions and NAV can be joined in SQL.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from allocator.recording.migrations import upgrade
from allocator.recording.schema import Price
from allocator.serving.client import AllocatorClient
from allocator.serving.server import AllocationServer, ServerConfig, build_server
from tests.recording.conftest import database_url  # noqa: F401 - the fixture, per backend
from tests.serving.conftest import write_tiny_model

ASSETS = ("AAA", "BBB", "CCC")
FIRST_BAR = dt.date(2024, 1, 1)
N_BARS = 30


def bar(k: int) -> dt.date:
    return FIRST_BAR + dt.timedelta(days=k)


def synthetic_closes(n: int = N_BARS, seed: int = 7) -> np.ndarray:
    """Geometric random walks from 100, one column per asset."""
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0005, 0.02, size=(n, len(ASSETS)))
    return 100.0 * np.exp(np.cumsum(steps, axis=0))


def insert_prices(engine: Engine, closes: np.ndarray, assets: tuple[str, ...] = ASSETS) -> None:
    with Session(engine) as session, session.begin():
        for k, row in enumerate(closes):
            for asset, close in zip(assets, row, strict=True):
                session.add(Price(asset=asset, date=bar(k), close=float(close), source="test"))


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:  # noqa: F811 - the imported fixture
    """The migrated trade database with ``N_BARS`` bars of prices."""
    upgrade(database_url)
    engine = create_engine(database_url, poolclass=NullPool)
    insert_prices(engine, synthetic_closes())
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def server(engine: Engine, tmp_path: Path) -> Iterator[AllocationServer]:
    """The real server on the tiny model (4 slots, window 5), recording into ``engine``."""
    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1")
    config = ServerConfig(
        registry=registry,
        port=0,
        metrics_port=None,
        database_url=engine.url.render_as_string(hide_password=False),
        spool_dir=tmp_path / "spool",
        prefer_cuda=False,
        default_model="tiny",
        reload_interval=60.0,
        grace_seconds=2.0,
    )
    running = build_server(config).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def client(server: AllocationServer) -> Iterator[AllocatorClient]:
    with AllocatorClient(f"127.0.0.1:{server.port}", timeout=10.0) as connected:
        yield connected
