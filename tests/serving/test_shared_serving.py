"""Serving a shared (per-asset) policy: any number of assets, the anchor tilt, its state and ICM.

The model is exported for 6 training slots (``tests.serving.shared_models``); expected values
are rebuilt from the policy contract (``allocator.portfolio``) and the torch actor, never from
the serving code under test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch as th

from allocator.artifacts.manifest import (
    AnchorInfo,
    FeatureNormalizationInfo,
    FeatureSpecInfo,
    TiltInfo,
    checksums,
    read_manifest,
    write_manifest,
)
from allocator.portfolio import (
    anchor_weights,
    asset_features,
    ema_smooth,
    normalize_features,
    tilt_weights,
)
from allocator.registry.errors import ModelLoadError
from allocator.serving import LoadedModel, load_model
from allocator.serving.decision import decide_many
from allocator.serving.portfolio_state import PortfolioState
from allocator.serving.step import model_shape
from allocator.serving.validation import InvalidRequest, ModelShape
from tests.serving import Spec, policy_model
from tests.serving.conftest import allocate_request, decide_one, reference_icm, request_for
from tests.serving.requests import validate_one
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


@pytest.fixture(scope="module")
def fixture() -> SharedFixture:
    return build_fixture()


@pytest.fixture(scope="module")
def shared_dir(fixture: SharedFixture, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shared_model(tmp_path_factory.mktemp("shared") / "shared" / "1", fixture, icm=True)


@pytest.fixture(scope="module")
def shared(shared_dir: Path) -> LoadedModel:
    return load_model(shared_dir, prefer_cuda=False)


def closes(model: LoadedModel, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0, 0.02, (n, model.prices_per_asset)) + rng.normal(0, 0.01, (n, 1))
    return 30.0 * rng.uniform(1, 3, (n, 1)) * np.exp(np.cumsum(steps, axis=1))


def ids(n: int, prefix: str = "X") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def reference(
    fixture: SharedFixture, prices: np.ndarray, current: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw weights, action and raw features of one all-live portfolio, as training maps them."""
    config = fixture.config
    mask = np.ones(prices.shape[0] + 1, dtype=bool)
    raw_features = asset_features(prices, mask, config.asset_feature_spec)
    z = normalize_features(raw_features, fixture.norm, config.obs_clip, mask)
    action = reference_action(fixture, z[None], current[None], mask[None])[0]
    anchor = anchor_weights(prices, mask, config.action.anchor.spec)
    return tilt_weights(action, anchor, mask, config.action.k), action, raw_features


def test_loads_with_the_manifests_representation(shared: LoadedModel) -> None:
    policy = shared.set_policy
    assert policy is not None
    assert policy.k == 1.5
    assert policy.anchor.vol_window == 8
    # features need lookback 6 + 1 closes, the inverse-vol anchor 8 + 1: the larger.
    assert shared.prices_per_asset == 9
    assert shared.max_request_assets == MAX_SERVED
    assert model_shape(shared) == ModelShape(MAX_SERVED, 8, "max_served_assets")
    with pytest.raises(TypeError, match="run_sets"):
        shared.run(np.zeros((1, shared.obs_dim)), np.ones((1, SLOTS + 1)))


@pytest.mark.parametrize("n", [3, SLOTS, 12])
def test_serves_fewer_and_more_assets_than_it_was_trained_with(
    shared: LoadedModel, fixture: SharedFixture, n: int
) -> None:
    prices = closes(shared, n, seed=n)
    current = np.random.default_rng(n).dirichlet(np.ones(n + 1))
    out, state = decide_one(shared, request_for(shared, ids(n), prices, current), None)
    want, action, _ = reference(fixture, prices, current)
    np.testing.assert_allclose(out.raw_weights, want, atol=1e-6)
    np.testing.assert_allclose(out.smoothed_weights, out.raw_weights, atol=1e-15)  # new
    assert out.raw_weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.abs(action).max() > 0.3  # the tilt really moved away from the anchor
    assert state.model.n_slots == max(SLOTS, n) + 1
    assert state.slots[:n] == tuple(ids(n))


@pytest.mark.parametrize("kind", ["min_variance", "hrp"])
def test_a_risk_anchor_in_the_manifest_is_the_anchor_served(
    fixture: SharedFixture, shared_dir: Path, tmp_path: Path, kind: str
) -> None:
    d = tmp_path / kind / "1"
    shutil.copytree(shared_dir, d)
    anchor = AnchorInfo(kind=kind, cash_share=0.1, vol_window=8)
    tilt = TiltInfo(k=fixture.config.action.k, anchor=anchor)
    write_manifest(d, read_manifest(d).model_copy(update={"tilt": tilt}))
    model = load_model(d, prefer_cuda=False)
    assert model.set_policy is not None
    assert model.set_policy.anchor == anchor.spec()
    n = 9
    prices = closes(model, n, seed=21)
    current = np.random.default_rng(21).dirichlet(np.ones(n + 1))
    out, _ = decide_one(model, request_for(model, ids(n), prices, current), None)
    inverse_vol, action, _ = reference(fixture, prices, current)
    mask = np.ones(n + 1, dtype=bool)
    want = tilt_weights(action, anchor_weights(prices, mask, anchor.spec()), mask, tilt.k)
    np.testing.assert_allclose(out.raw_weights, want, atol=1e-6)
    assert np.abs(out.raw_weights - inverse_vol).max() > 1e-3  # not the fixture's own anchor


def test_permuting_the_assets_permutes_the_answer(shared: LoadedModel) -> None:
    n = 12
    prices = closes(shared, n, seed=7)
    current = np.random.default_rng(7).dirichlet(np.ones(n + 1))
    names = ids(n)
    first, _ = decide_one(shared, request_for(shared, names, prices, current), None)
    perm = np.random.default_rng(3).permutation(n)
    second, _ = decide_one(
        shared,
        request_for(shared, [names[j] for j in perm], prices[perm], current[np.r_[0, perm + 1]]),
        None,
    )
    order = np.r_[0, perm + 1]
    assert second.asset_ids == tuple(np.array(first.asset_ids)[order])
    np.testing.assert_array_equal(second.raw_weights, first.raw_weights[order])
    np.testing.assert_array_equal(second.smoothed_weights, first.smoothed_weights[order])


def test_a_batch_of_mixed_sizes_answers_as_one_portfolio_at_a_time(shared: LoadedModel) -> None:
    sizes = (3, 12, SLOTS, 1)
    requests = [
        request_for(shared, ids(n, f"P{k}_"), closes(shared, n, 40 + k), portfolio_id=f"p{k}")
        for k, n in enumerate(sizes)
    ]
    together = decide_many(shared, requests, [None] * len(requests))
    for request, out, state in zip(requests, together.outputs, together.states, strict=True):
        alone, alone_state = decide_one(shared, request, None)
        np.testing.assert_allclose(out.raw_weights, alone.raw_weights, atol=1e-7)
        assert state.slots == alone_state.slots
        assert state.smoothed.size == max(SLOTS, request.n_assets) + 1


def test_the_state_follows_assets_as_the_universe_grows_and_shrinks(
    shared: LoadedModel, fixture: SharedFixture
) -> None:
    universe = ids(12)
    prices = closes(shared, 12, seed=21)
    steps = [list(range(3)), list(range(12)), [9, 1, 4, 11]]
    state: PortfolioState | None = None
    previous: dict[str, float] | None = None
    for k, cols in enumerate(steps):
        names = [universe[j] for j in cols]
        request = request_for(shared, names, prices[cols], request_id=f"r{k}")
        out, state = decide_one(shared, request, state)
        current = np.asarray(out.current_weights)
        raw, _, _ = reference(fixture, prices[cols], current)
        np.testing.assert_allclose(out.raw_weights, raw, atol=1e-6)
        before = None
        if previous is not None:
            before = np.array([previous.get(a, 0.0) for a in out.asset_ids])
        mask = np.ones(len(names) + 1, dtype=bool)
        np.testing.assert_allclose(
            out.smoothed_weights, ema_smooth(before, raw, mask, BETA), atol=1e-6
        )
        previous = dict(zip(out.asset_ids, out.smoothed_weights, strict=True))
        assert state.steps == k + 1
    assert state is not None
    # Assets 9 and 11 kept their slots 10 and 12: the state stays wide enough for them.
    assert state.model.n_slots == 13
    assert state.slots[9] == "X9"
    assert state.slots[11] == "X11"
    assert PortfolioState.from_bytes(state.to_bytes()) == state


def test_icm_is_reported_only_while_the_portfolio_fits_the_training_slots(
    shared: LoadedModel, fixture: SharedFixture
) -> None:
    n = 4
    prices = closes(shared, n, seed=5)
    current = np.random.default_rng(5).dirichlet(np.ones(n + 1))
    request = request_for(shared, ids(n), prices, current)
    first, state = decide_one(shared, request, None)
    assert first.icm_reward is None
    second, state2 = decide_one(shared, request, state)
    _, action, raw_features = reference(fixture, prices, current)
    flat = np.zeros((SLOTS, fixture.n_features), np.float32)
    flat[:n] = raw_features
    slots = np.zeros(SLOTS + 1)
    slots[: n + 1] = current
    live = np.zeros(SLOTS + 1)
    live[: n + 1] = 1.0
    observation = np.concatenate([flat.ravel(), slots, live]).astype(np.float32)
    padded_action = np.zeros(SLOTS + 1, np.float32)
    padded_action[: n + 1] = action
    assert state.observation is not None
    np.testing.assert_allclose(state.observation, observation, atol=1e-6)
    expected = reference_icm(observation, padded_action, observation, fixture.icm_spec())
    assert second.icm_reward == pytest.approx(expected, abs=1e-4)

    big = request_for(shared, ids(12), closes(shared, 12, seed=6))
    grown, wide_state = decide_one(shared, big, state2)
    assert grown.icm_reward is None
    assert wide_state.observation is None
    assert wide_state.action is None
    again, _ = decide_one(shared, big, wide_state)
    assert again.icm_reward is None  # 12 assets do not fit the ICM's 6 slots


def test_requests_are_checked_against_the_served_limits(shared: LoadedModel) -> None:
    shape = model_shape(shared)
    too_many = MAX_SERVED + 1
    message = allocate_request(ids(too_many), closes(shared, too_many, seed=1))
    with pytest.raises(InvalidRequest, match=rf"at most {MAX_SERVED} \(max_served_assets\)"):
        validate_one(message, shape)
    short = allocate_request(ids(2), closes(shared, 2, seed=1)[:, 1:])
    with pytest.raises(InvalidRequest, match="expected 18 values") as info:
        validate_one(short, shape)
    assert info.value.field == "prices"


def test_a_frozen_asset_axis_or_another_feature_set_is_refused(
    fixture: SharedFixture, tmp_path: Path
) -> None:
    frozen = write_shared_model(tmp_path / "frozen" / "1", fixture, fixed_assets=True)
    with pytest.raises(ModelLoadError, match="fixed asset axis 4") as info:
        load_model(frozen, prefer_cuda=False)
    assert str(frozen / "model.onnx") in str(info.value)

    spec = fixture.config.asset_feature_spec
    other = type(spec)(window=spec.window + 1, horizons=spec.horizons, vol_window=spec.vol_window)
    f = other.n_features
    d = write_shared_model(
        tmp_path / "other" / "1",
        fixture,
        feature_spec=FeatureSpecInfo.for_assets(SLOTS, other),
        feature_normalization=FeatureNormalizationInfo(mean=[0.0] * f, std=[1.0] * f),
    )
    with pytest.raises(ModelLoadError, match=rf"needs \[batch, assets, {f}\]"):
        load_model(d, prefer_cuda=False)


def test_a_flat_graph_under_a_shared_manifest_is_refused(
    fixture: SharedFixture, tmp_path: Path
) -> None:
    d = write_shared_model(tmp_path / "flat" / "1", fixture)
    (d / "model.onnx").write_bytes(policy_model(Spec()).SerializeToString())
    manifest = read_manifest(d)
    write_manifest(d, manifest.model_copy(update={"files": checksums(d, ["model.onnx"])}))
    with pytest.raises(ModelLoadError, match=r"graph inputs \['mask', 'observation'\]"):
        load_model(d, prefer_cuda=False)
