"""A retry lands on another replica: it gets the first answer, with no second step or row.

Two ``allocator serve`` processes share one Redis and one Postgres. Every request goes to
replica A and is then retried, with the same request id, on replica B, which never saw it: B
answers from the portfolio's state in Redis (its last answer travels with it), so the answers
are identical, each portfolio steps once per request, and the database holds one row per
request, the one A answered. Then the same with A killed (SIGKILL) between a call and its
retry, and a new A taking over afterwards.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import sqlalchemy as sa

from allocator.recording.migrations import upgrade
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.state import RedisStateStore
from tests.postgres import reset_schema
from tests.serving.conftest import delete_prefixed
from tests.serving.load import ServeProcess, wait_until
from tests.serving.server.helpers import make_request

N_PORTFOLIOS = 50
STEPS = 20  # 50 x 20 = 1,000 requests
KILL_AT = (333, 667)
"""Request indexes after which replica A is killed, before the retry on B."""
PREFIX = "allocator:state:"
"""The servers' default Redis prefix; the portfolio ids are the test's own."""


def requests_for(tag: str) -> list[pb.AllocateRequest]:
    """Step t of every portfolio, then step t + 1; a universe change halfway."""
    out = []
    for t in range(STEPS):
        assets = ("A", "B", "C") if t < STEPS // 2 else ("B", "D", "C", "E")
        for k in range(N_PORTFOLIOS):
            pid = f"{tag}-{k}"
            out.append(make_request(pid, assets, seed=1000 * k + t, request_id=f"{pid}-{t}"))
    return out


class Replica:
    """One ``allocator serve`` process and a channel to it."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        cwd.mkdir(exist_ok=True)
        self.process = ServeProcess([*args, "--spool-dir", str(cwd / "spool")], cwd=cwd)
        self.channel = grpc.insecure_channel(self.process.wait_ready())
        self.stub = pb_grpc.AllocatorStub(self.channel)

    def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        return self.stub.Allocate(request, timeout=30)

    def stop(self) -> int:
        self.channel.close()
        self.process.terminate()
        return self.process.wait(60)


@pytest.fixture
def database(postgres_url: str) -> str:
    reset_schema(postgres_url)
    upgrade(postgres_url)
    return postgres_url


@pytest.fixture
def tag(redis_url: str) -> Iterator[str]:
    """Portfolio ids of this test only; their Redis state and lock keys go afterwards."""
    import redis

    tag = f"retry-{secrets.token_hex(4)}"
    yield tag
    client = redis.Redis.from_url(redis_url)
    try:
        delete_prefixed(client, f"{PREFIX}{tag}-", f"lock:{PREFIX}{tag}-")
    finally:
        client.close()


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.channel.close()
        replica.process.kill()


def rows(url: str) -> dict[str, list[float]]:
    """request id -> recorded smoothed weights."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            result = conn.execute(sa.text("SELECT request_id, smoothed_weights FROM decisions"))
            return {request_id: list(weights) for request_id, weights in result}
    finally:
        engine.dispose()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers-2"])
@pytest.mark.parametrize("kill", [False, True], ids=["retry", "sigkill-before-retry"])
def test_every_request_retried_on_the_other_replica_steps_and_records_once(
    kill: bool,
    workers: int,
    tiny_registry: Path,
    redis_url: str,
    database: str,
    tag: str,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    args = [
        "--registry",
        str(tiny_registry),
        "--model",
        "tiny",
        "--redis-url",
        redis_url,
        "--database-url",
        database,
        "--metrics-port",
        "0",
        "--cpu",
        *("--workers", str(workers)),  # 2: a SIGKILLed supervisor takes its workers with it
    ]
    a = Replica(args, tmp_path / "a")
    b = Replica(args, tmp_path / "b")
    replicas += [a, b]
    requests = requests_for(tag)
    first: list[pb.AllocateResponse] = []
    retried: list[pb.AllocateResponse] = []
    for i, request in enumerate(requests):
        first.append(a.allocate(request))
        if kill and i in KILL_AT:
            # A SIGKILL loses what its recorder had not made durable yet: wait for the row
            # (what an OK promises about recording is not this test's subject), then kill.
            wait_until(lambda n=i + 1: len(rows(database)) == n, 30, f"{i + 1} rows")
            a.channel.close()
            a.process.proc.kill()
            a.process.wait(30)
        retried.append(b.allocate(request))
        if kill and i in KILL_AT:
            a = Replica(args, tmp_path / f"a-{i}")
            replicas.append(a)
    assert a.stop() == 0, a.process.stderr
    assert b.stop() == 0, b.process.stderr

    assert retried == first
    # One EMA step per request, whichever replica answered it and however often.
    store = RedisStateStore(redis_url, prefix=PREFIX)
    try:
        pids = [f"{tag}-{k}" for k in range(N_PORTFOLIOS)]
        with store.locked(pids) as session:
            states = session.get()
    finally:
        store.close()
    assert [s.steps for s in states if s is not None] == [STEPS] * N_PORTFOLIOS
    assert sum(s.steps for s in states if s is not None) == len(requests)
    # One row per request, holding the answer the client got.
    recorded = rows(database)
    assert len(recorded) == len(requests)
    for answer in first:
        np.testing.assert_array_equal(recorded[answer.request_id], answer.smoothed_weights)
    # The sequence depends on the state carried between replicas: smoothing is on throughout.
    assert not np.allclose(first[-1].smoothed_weights, first[-1].raw_weights, atol=1e-6)
