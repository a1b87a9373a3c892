"""After a Postgres outage, the spool's replay does not hold live calls.

A real ``allocator serve`` records into Postgres through a proxy the test cuts: batch calls
spool a backlog of tens of thousands of decisions while the path is cut, then the path comes
back and the server replays the backlog while a live client keeps calling ``Allocate`` with a
short deadline. Every live call must be answered, well inside its deadline, and at the end the
database holds every decision answered OK.
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

import grpc
from sqlalchemy.engine import make_url

from allocator.recording.migrations import upgrade
from allocator.serving.client import AllocatorClient, AllocatorError
from tests.postgres import reset_schema
from tests.recording.proxy import TcpProxy
from tests.serving.conftest import TINY, write_tiny_model
from tests.serving.load import OWN_CONNECTION, LoadThread, ServeProcess, price_path, wait_until
from tests.serving.test_server_kill import postgres_rows

BACKLOG = 20_000
LIVE_TIMEOUT = 2.0


class LiveClient(threading.Thread):
    """``Allocate`` calls one after the other, every ``interval``, each timed and logged."""

    def __init__(self, target: str, portfolio: str, interval: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.portfolio = portfolio
        self.interval = interval
        self.calls: list[tuple[float, float, grpc.StatusCode, str]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        path = price_path(3, 512, 11)
        with AllocatorClient(self.target, retry=None, options=OWN_CONNECTION) as client:
            i = 0
            while not self.halt.wait(self.interval):
                start = i % (path.shape[1] - TINY.window - 1)
                prices = path[:, start : start + TINY.window + 1]
                request_id = f"{self.portfolio}-{i}"
                sent = time.monotonic()
                try:
                    client.allocate(
                        self.portfolio,
                        ["A0", "A1", "A2"],
                        prices,
                        request_id=request_id,
                        timeout=LIVE_TIMEOUT,
                    )
                    code = grpc.StatusCode.OK
                except AllocatorError as error:
                    code = error.code
                self.calls.append((sent, time.monotonic() - sent, code, request_id))
                i += 1


def test_live_calls_are_answered_while_a_large_spool_replays(
    tmp_path: Path, postgres_url: str
) -> None:
    reset_schema(postgres_url)
    upgrade(postgres_url)
    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1", TINY)
    spool = tmp_path / "spool"
    tag = f"outage-{secrets.token_hex(4)}"
    pg = make_url(postgres_url)
    with TcpProxy(pg.host or "127.0.0.1", pg.port or 5432) as proxy:
        url = pg.set(port=proxy.port).render_as_string(False)
        args = [
            *("--registry", str(registry), "--database-url", url, "--spool-dir", str(spool)),
            *("--metrics-port", "0", "--cpu"),
        ]
        server = ServeProcess(args, cwd=tmp_path)
        try:
            target = server.wait_ready()
            proxy.cut()
            backlog = [
                LoadThread(target, f"{tag}-b{k}", window=TINY.window, batch=100, retry=None)
                for k in range(2)
            ]
            for loader in backlog:
                loader.start()
            try:
                wait_until(
                    lambda: sum(100 * len(x.ok) for x in backlog) >= BACKLOG,
                    300,
                    f"{BACKLOG} spooled decisions",
                )
            finally:
                for loader in backlog:
                    loader.stop()
                for loader in backlog:
                    loader.join(30)
            live = LiveClient(target, f"{tag}-live")
            live.start()
            wait_until(lambda: len(live.calls) >= 20, 60, "live calls during the outage")
            restored = time.monotonic()
            proxy.restore()
            try:
                wait_until(lambda: not any(spool.rglob("*.spool")), 300, "the spool to replay")
                replayed = time.monotonic()
                time.sleep(0.5)
            finally:
                live.halt.set()
                live.join(30)
            server.terminate()
            assert server.wait(90) == 0, server.stderr
        finally:
            server.kill()
    during = [c for c in live.calls if restored <= c[0] <= replayed]
    assert len(during) >= 10, (len(during), replayed - restored)  # the replay took a while
    failed = [c for c in live.calls if c[2] is not grpc.StatusCode.OK]
    assert not failed, failed[:5]
    slowest = max(c[1] for c in during)
    assert slowest < LIVE_TIMEOUT / 2, slowest
    answered = {rid for x in backlog for o in x.ok for rid in o.request_ids}
    answered |= {c[3] for c in live.calls}
    rows = postgres_rows(postgres_url)()
    assert len(rows) == len(set(rows))
    missing = sorted(answered - set(rows))
    assert not missing, missing[:10]
    assert not (spool / "quarantine.frames").exists(), "a record was refused"
