"""Acceptance: the server answers, request by request, exactly what the serving-path backtest
(``allocator.serving.replay`` on the exported ONNX policy) decided, through a changing universe.

The price history has five assets for a model with four slots: D stops trading for a stretch
(it leaves the requests, then comes back), C delists on the very step E lists (E inherits C's
slot, whose smoothed mass must not pass to it). Every request the replay made is sent to a real
gRPC server, single and as a one-item batch, for its own portfolio, with the current weights the
replay used; raw weights, smoothed weights and the ICM reward must agree to 1e-6 at every step.
The smoothing is also checked on its own, by asset name, from the server's answers alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from allocator.portfolio import renormalize
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.replay import ReplayResult, live_assets, replay
from allocator.serving.server import AllocationServer
from tests.serving.conftest import TINY, start_sqlite_server

ASSETS = ("A", "B", "C", "D", "E")
ROWS = 60
BETA = 0.5  # tests.serving.make_manifest's
TOL = 1e-6


def price_history() -> np.ndarray:
    """``(ROWS, 5)`` closes with NaN where an asset does not trade."""
    rng = np.random.default_rng(11)
    prices = 100.0 * np.exp(rng.normal(0.0003, 0.02, (ROWS, len(ASSETS))).cumsum(axis=0))
    prices[20:28, 3] = np.nan  # D halted: out of the requests for t in 19..32
    prices[45:, 2] = np.nan  # C delisted: out from t = 44
    prices[:39, 4] = np.nan  # E listed: in from t = 44, in C's freed slot
    return prices


@pytest.fixture(scope="module")
def history() -> np.ndarray:
    prices = price_history()
    live = live_assets(prices, TINY.window)[TINY.window : ROWS - 1]
    assert live.sum(axis=1).max() <= TINY.max_assets  # the model's slots suffice
    return prices


def _server(
    registry: Path, tmp: Path, model: str, redis_url: str | None
) -> Iterator[AllocationServer]:
    server = start_sqlite_server(registry, tmp, model, redis_url)
    try:
        yield server
    finally:
        server.stop()


def _request(result: ReplayResult, k: int, portfolio_id: str) -> pb.AllocateRequest:
    inp = result.inputs[k]
    return pb.AllocateRequest(
        portfolio_id=portfolio_id,
        request_id=f"{portfolio_id}-{k}",
        asset_ids=list(inp.asset_ids),
        prices=np.asarray(inp.prices, dtype=np.float64).ravel().tolist(),
        current_weights=np.asarray(inp.current_weights, dtype=np.float64).tolist(),
    )


def _check_ema(answers: list[pb.AllocateResponse]) -> None:
    """``smoothed = renorm(beta * previous + (1 - beta) * raw)`` by asset name, where an asset
    new to the request (or back after a gap) starts from 0 and cash always carries over."""
    previous: dict[str, float] | None = None
    for k, a in enumerate(answers):
        raw = np.asarray(a.raw_weights)
        if previous is None:
            expected = raw
        else:
            prev = np.array([previous.get(asset, 0.0) for asset in a.asset_ids])
            expected = renormalize(BETA * prev + (1 - BETA) * raw, np.ones(raw.size, bool))
        np.testing.assert_allclose(a.smoothed_weights, expected, rtol=0, atol=1e-12, err_msg=k)
        previous = dict(zip(a.asset_ids, a.smoothed_weights, strict=True))


@pytest.mark.parametrize(
    ("model", "store"),
    [("tiny", "memory"), ("tiny", "redis"), ("plain", "memory")],
    ids=["icm-memory", "icm-redis", "no-icm-memory"],
)
def test_server_matches_the_serving_backtest(
    request: pytest.FixtureRequest,
    tiny_registry: Path,
    tmp_path: Path,
    history: np.ndarray,
    model: str,
    store: str,
) -> None:
    redis_url = request.getfixturevalue("redis_url") if store == "redis" else None
    single = f"parity-{uuid.uuid4().hex[:12]}"  # unique: a shared Redis may hold other runs
    batched = single + "-batch"
    result = replay(tiny_registry / model / "1", history, assets=ASSETS, portfolio_id=single)
    n = len(result.outputs)
    assert n == ROWS - 1 - TINY.window
    universes = [tuple(inp.asset_ids) for inp in result.inputs]
    # The mask really changes midway: D leaves and returns, then C and E swap on one step.
    changes = [universes[k] for k in range(1, n) if universes[k] != universes[k - 1]]
    assert changes == [("A", "B", "C"), ("A", "B", "C", "D"), ("A", "B", "D", "E")]

    for server in _server(tiny_registry, tmp_path, model, redis_url):
        channel = grpc.insecure_channel(server.target)
        stub = pb_grpc.AllocatorStub(channel)
        singles: list[pb.AllocateResponse] = []
        try:
            for k, expected in enumerate(result.outputs):
                one = stub.Allocate(_request(result, k, single), timeout=10)
                batch = stub.AllocateBatch(
                    pb.AllocateBatchRequest(requests=[_request(result, k, batched)]), timeout=10
                )
                (item,) = batch.responses
                for got in (one, item):
                    assert tuple(got.asset_ids) == expected.asset_ids, k
                    np.testing.assert_allclose(
                        got.raw_weights, expected.raw_weights, rtol=0, atol=TOL, err_msg=k
                    )
                    np.testing.assert_allclose(
                        got.smoothed_weights, expected.smoothed_weights, rtol=0, atol=TOL,
                        err_msg=k,
                    )  # fmt: skip
                    assert got.turnover == pytest.approx(expected.turnover, abs=TOL)
                    assert (got.model.name, got.model.version) == (model, "1")
                    if expected.icm_reward is None:
                        assert not got.HasField("icm_reward"), k
                    else:
                        assert got.icm_reward == pytest.approx(expected.icm_reward, abs=TOL), k
                singles.append(one)
        finally:
            for pid in (single, batched):  # leave nothing behind in a shared Redis
                stub.ResetPortfolio(pb.ResetPortfolioRequest(portfolio_id=pid), timeout=10)
            channel.close()

    _check_ema(singles)
    icm = [a.HasField("icm_reward") for a in singles]
    if model == "plain":
        assert not any(icm)
    else:
        # Absent on the first step and across a universe change (the ICM saw one mask per
        # transition), present on every other step.
        changed = [k == 0 or universes[k] != universes[k - 1] for k in range(n)]
        assert icm == [not c for c in changed]
