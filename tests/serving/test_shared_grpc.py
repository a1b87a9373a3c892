"""A shared (per-asset) policy served by the real gRPC server, end to end.

The registry holds the exported shared model of ``tests.serving.shared_models`` (6 training
slots, at most 20 served assets) next to a flat one. Every call goes through the generated
stub, the server's validation, decision step, state store and a migrated SQLite recorder.
Expected weights are rebuilt from the policy contract (``allocator.portfolio``) and the torch
actor, never from the serving code under test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch as th

from allocator.portfolio import (
    CASH_ID,
    anchor_weights,
    asset_features,
    ema_smooth,
    normalize_features,
    renormalize,
    tilt_weights,
)
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.server import AllocationServer
from tests.serving.conftest import TINY, start_sqlite_server, write_tiny_model
from tests.serving.shared_models import (
    BETA,
    MAX_SERVED,
    SLOTS,
    SharedFixture,
    build_fixture,
    reference_action,
    write_shared_model,
)

th.set_num_threads(1)

NAME = "shared-test"
CLOSES = 9
"""Closes per asset a request carries: the features look back 6 days (the longest horizon),
the inverse-volatility anchor 8 (its vol_window); each needs one close more than returns."""
TOL = 1e-6


@pytest.fixture(scope="module")
def fixture() -> SharedFixture:
    return build_fixture()


@pytest.fixture(scope="module")
def registry(fixture: SharedFixture, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared model (default) and a flat one, so ListModels shows both kinds."""
    root = tmp_path_factory.mktemp("shared-grpc-registry")
    write_shared_model(root / NAME / "1", fixture)
    write_tiny_model(root / "tiny" / "1", icm=False)
    return root


def start(registry: Path, tmp: Path, redis_url: str | None = None) -> AllocationServer:
    return start_sqlite_server(registry, tmp, NAME, redis_url)


@pytest.fixture(scope="module")
def server(registry: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AllocationServer]:
    running = start(registry, tmp_path_factory.mktemp("shared-grpc-server"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server: AllocationServer) -> Iterator[pb_grpc.AllocatorStub]:
    channel = grpc.insecure_channel(server.target)
    yield pb_grpc.AllocatorStub(channel)
    channel.close()


def closes(n: int, seed: int) -> np.ndarray:
    """``(n, CLOSES)`` positive closes with a common market move and distinct volatilities."""
    rng = np.random.default_rng(seed)
    vol = rng.uniform(0.005, 0.04, (n, 1))
    steps = vol * rng.normal(0.0, 1.0, (n, CLOSES)) + rng.normal(0.0, 0.01, (1, CLOSES))
    return 30.0 * rng.uniform(1, 3, (n, 1)) * np.exp(np.cumsum(steps, axis=1))


def ids(n: int, prefix: str = "X") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def message(
    portfolio_id: str,
    asset_ids: list[str],
    prices: np.ndarray,
    current: np.ndarray | None = None,
) -> pb.AllocateRequest:
    request = pb.AllocateRequest(
        portfolio_id=portfolio_id,
        request_id=uuid.uuid4().hex,
        asset_ids=asset_ids,
        prices=prices.ravel().tolist(),
    )
    if current is not None:
        request.current_weights.extend(current.tolist())
    return request


def reference(fixture: SharedFixture, prices: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Raw weights of one all-live portfolio, as training maps its closes and weights."""
    config = fixture.config
    mask = np.ones(prices.shape[0] + 1, dtype=bool)
    raw_features = asset_features(prices, mask, config.asset_feature_spec)
    z = normalize_features(raw_features, fixture.norm, config.obs_clip, mask)
    action = reference_action(fixture, z[None], current[None], mask[None])[0]
    assert np.abs(action).max() > 0.3  # the tilt really moves away from the anchor
    anchor = anchor_weights(prices, mask, config.action.anchor.spec)
    return tilt_weights(action, anchor, mask, config.action.k)


def as_array(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def test_list_models_describes_the_served_limit_and_the_history_needed(
    stub: pb_grpc.AllocatorStub, fixture: SharedFixture
) -> None:
    models = {m.name: m for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models}
    assert set(models) == {NAME, "tiny"}
    shared = models[NAME]
    assert shared.version == "1"
    assert shared.algorithm == "td3"
    # A shared model takes up to max_served_assets, not its 6 training slots ...
    assert shared.max_assets == MAX_SERVED != SLOTS
    # ... and window + 1 closes per asset: the longest lookback of features and anchor.
    assert fixture.config.action.anchor.vol_window == 8 > max(fixture.config.horizons)
    assert shared.window + 1 == CLOSES
    assert shared.beta == BETA
    assert not shared.has_icm
    assert shared.is_default
    assert shared.provider == "CPUExecutionProvider"
    flat = models["tiny"]
    assert (flat.max_assets, flat.window) == (TINY.max_assets, TINY.window)
    assert not flat.is_default


@pytest.mark.parametrize("n", [5, SLOTS, 12])
def test_allocates_for_fewer_as_many_and_more_assets_than_the_training_slots(
    stub: pb_grpc.AllocatorStub, fixture: SharedFixture, n: int
) -> None:
    prices = closes(n, seed=n)
    current = np.random.default_rng(n).dirichlet(np.ones(n + 1))
    portfolio = f"size-{n}-{uuid.uuid4().hex[:8]}"
    got = stub.Allocate(message(portfolio, ids(n), prices, current), timeout=10)
    want = reference(fixture, prices, current)
    assert list(got.asset_ids) == [CASH_ID, *ids(n)]
    assert (got.model.name, got.model.version) == (NAME, "1")
    raw, smoothed = as_array(got.raw_weights), as_array(got.smoothed_weights)
    np.testing.assert_allclose(raw, want, rtol=0, atol=TOL)
    np.testing.assert_allclose(smoothed, raw, rtol=0, atol=1e-15)  # a new portfolio: s_0 = w_0
    assert smoothed.sum() == pytest.approx(1.0, abs=1e-12)
    assert got.turnover == pytest.approx(np.abs(smoothed[1:] - current[1:]).sum(), abs=1e-12)
    assert not got.HasField("icm_reward")


def test_a_batch_of_mixed_sizes_matches_the_reference_item_by_item(
    stub: pb_grpc.AllocatorStub, fixture: SharedFixture
) -> None:
    sizes = (5, 12, SLOTS, 1)
    tag = uuid.uuid4().hex[:8]
    items = []
    for k, n in enumerate(sizes):
        prices = closes(n, seed=40 + k)
        current = np.random.default_rng(40 + k).dirichlet(np.ones(n + 1))
        items.append(
            (prices, current, message(f"batch-{tag}-{k}", ids(n, f"B{k}_"), prices, current))
        )
    batch = stub.AllocateBatch(pb.AllocateBatchRequest(requests=[m for *_, m in items]), timeout=10)
    assert len(batch.responses) == len(sizes)
    for (prices, current, sent), got in zip(items, batch.responses, strict=True):
        assert got.portfolio_id == sent.portfolio_id
        assert list(got.asset_ids) == [CASH_ID, *sent.asset_ids]
        want = reference(fixture, prices, current)
        np.testing.assert_allclose(as_array(got.raw_weights), want, rtol=0, atol=TOL)


def test_permuting_the_requests_assets_permutes_the_answer(stub: pb_grpc.AllocatorStub) -> None:
    n = 12
    prices = closes(n, seed=7)
    current = np.random.default_rng(7).dirichlet(np.ones(n + 1))
    names = ids(n)
    perm = np.random.default_rng(3).permutation(n)
    order = np.r_[0, perm + 1]  # cash stays first
    tag = uuid.uuid4().hex[:8]
    first = stub.Allocate(message(f"perm-a-{tag}", names, prices, current), timeout=10)
    second = stub.Allocate(
        message(f"perm-b-{tag}", [names[j] for j in perm], prices[perm], current[order]),
        timeout=10,
    )
    assert list(second.asset_ids) == [first.asset_ids[j] for j in order]
    for field in ("raw_weights", "smoothed_weights"):
        a, b = as_array(getattr(first, field)), as_array(getattr(second, field))
        # sorted pooling and sorted sums: the same bits, not merely close
        np.testing.assert_array_equal(b, a[order])
    assert second.turnover == pytest.approx(first.turnover, abs=n * 1e-7)


def test_more_assets_than_max_served_assets_is_invalid_argument_naming_the_limit(
    server: AllocationServer, stub: pb_grpc.AllocatorStub
) -> None:
    portfolio = f"limit-{uuid.uuid4().hex[:8]}"
    at_limit = stub.Allocate(message(portfolio, ids(MAX_SERVED), closes(MAX_SERVED, 1)), timeout=10)
    assert len(at_limit.asset_ids) == MAX_SERVED + 1

    over = MAX_SERVED + 1
    too_many = message(portfolio, ids(over), closes(over, 1))
    with pytest.raises(grpc.RpcError) as info:
        stub.Allocate(too_many, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        f"asset_ids: {over} assets, but the model takes at most {MAX_SERVED} (max_served_assets)"
    )
    fine = message(f"{portfolio}-other", ids(3), closes(3, 2))
    with pytest.raises(grpc.RpcError) as info:
        stub.AllocateBatch(pb.AllocateBatchRequest(requests=[fine, too_many]), timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("requests[1].asset_ids: ")
    assert f"at most {MAX_SERVED} (max_served_assets)" in info.value.details()
    # Nothing advanced: the refused calls left the portfolio at its one decision.
    with server.store.locked([portfolio, f"{portfolio}-other"]) as session:
        state, other = session.get()
    assert state is not None
    assert state.steps == 1
    assert other is None


def test_short_price_history_names_the_closes_a_shared_model_needs(
    stub: pb_grpc.AllocatorStub,
) -> None:
    short = message(f"short-{uuid.uuid4().hex[:8]}", ids(3), closes(3, 3)[:, 1:])
    with pytest.raises(grpc.RpcError) as info:
        stub.Allocate(short, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("prices: ")
    assert f"expected {3 * CLOSES} values" in info.value.details()


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_the_state_follows_the_assets_across_a_universe_change(
    request: pytest.FixtureRequest,
    registry: Path,
    server: AllocationServer,
    tmp_path: Path,
    fixture: SharedFixture,
    store: str,
) -> None:
    """Seven assets (one past the training slots), then X3 leaves and Y joins in its slot.

    The second call sends no weights: the server stands in the previous smoothed weights by
    asset id (X3's mass dropped, Y's 0), and smooths with ``ema_smooth`` and the model's beta.
    """
    own = None
    if store == "redis":
        own = start(registry, tmp_path, redis_url=request.getfixturevalue("redis_url"))
    target = (own or server).target
    portfolio = f"universe-{uuid.uuid4().hex[:12]}"  # unique: a shared Redis may hold others
    channel = grpc.insecure_channel(target)
    stub = pb_grpc.AllocatorStub(channel)
    try:
        first_ids = ids(7)
        prices = closes(8, seed=21)
        current = np.random.default_rng(21).dirichlet(np.ones(8))
        first = stub.Allocate(message(portfolio, first_ids, prices[:7], current), timeout=10)
        raw1 = reference(fixture, prices[:7], current)
        np.testing.assert_allclose(as_array(first.smoothed_weights), raw1, rtol=0, atol=TOL)

        second_ids = ["Y", "X0", "X1", "X2", "X4", "X5", "X6"]
        second_prices = np.vstack([prices[7], prices[[0, 1, 2, 4, 5, 6]]])
        second = stub.Allocate(message(portfolio, second_ids, second_prices), timeout=10)
        assert list(second.asset_ids) == [CASH_ID, *second_ids]
        held = dict(zip(first.asset_ids, first.smoothed_weights, strict=True))
        before = np.array([held.get(a, 0.0) for a in second.asset_ids])
        live = np.ones(before.size, dtype=bool)
        implied = renormalize(before, live)  # what the portfolio holds, X3 sold
        raw2 = reference(fixture, second_prices, implied)
        np.testing.assert_allclose(as_array(second.raw_weights), raw2, rtol=0, atol=TOL)
        smoothed2 = ema_smooth(before, raw2, live, BETA)
        np.testing.assert_allclose(as_array(second.smoothed_weights), smoothed2, rtol=0, atol=TOL)
        assert second.turnover == pytest.approx(np.abs(smoothed2[1:] - implied[1:]).sum(), abs=TOL)
        # Smoothing really mixed the two steps, and Y started from nothing.
        assert np.abs(smoothed2 - raw2).max() > 1e-3
        assert smoothed2[1] == pytest.approx(
            (1 - BETA) * raw2[1] / ((1 - BETA) + BETA * before.sum())
        )

        reset = stub.ResetPortfolio(pb.ResetPortfolioRequest(portfolio_id=portfolio), timeout=10)
        assert reset.existed
        third = stub.Allocate(message(portfolio, second_ids, second_prices, implied), timeout=10)
        np.testing.assert_allclose(as_array(third.smoothed_weights), raw2, rtol=0, atol=TOL)
    finally:
        stub.ResetPortfolio(pb.ResetPortfolioRequest(portfolio_id=portfolio), timeout=10)
        channel.close()
        if own is not None:
            own.stop()
