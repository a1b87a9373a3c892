"""The exported graphs: the numpy contract in torch ops, dynamic batch, checker-clean."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from allocator.portfolio import (
    FeatureSpec,
    NormalizationStats,
    action_to_weights,
    is_distribution,
    normalize_observation,
)
from allocator.registry.layout import (
    ICM_FILE,
    ICM_INPUTS,
    MODEL_FILE,
    POLICY_INPUTS,
    POLICY_OUTPUTS,
)
from allocator.trainer.export.graphs import ActionToWeights, ObservationNormalizer, export_graph
from allocator.trainer.export.loaded_run import load_run
from allocator.trainer.export.parity import onnx_session, random_raw_observations
from tests.trainer.export import TOL


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_graphs_pass_the_full_checker_with_a_dynamic_batch(exported, algo):
    paths = [exported[algo] / MODEL_FILE] + ([exported[algo] / ICM_FILE] if algo == "sac" else [])
    for path in paths:
        onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(exported[algo] / MODEL_FILE))
    assert [i.name for i in model.graph.input] == list(POLICY_INPUTS)
    assert [o.name for o in model.graph.output] == list(POLICY_OUTPUTS)
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        assert dims[0].dim_param, f"{value.name}: batch axis is not dynamic"
    if algo == "sac":
        icm = onnx.load(str(exported[algo] / ICM_FILE))
        assert [i.name for i in icm.graph.input] == list(ICM_INPUTS)
        assert [o.name for o in icm.graph.output] == ["intrinsic_reward"]


@pytest.mark.parametrize("algo", ["td3", "sac"])
@pytest.mark.parametrize("batch", [1, 7])
def test_onnx_weights_are_the_numpy_mapping_of_the_onnx_action(exported, runs, algo, batch):
    spec = load_run(runs[algo]).spec
    session = onnx_session(exported[algo] / MODEL_FILE)
    rng = np.random.default_rng(batch)
    obs, mask = random_raw_observations(spec, batch, rng)
    mask[0, 1:] = 0.0  # only cash live
    obs, _ = random_raw_observations(spec, batch, rng, live=mask > 0)
    action, weights = session.run(None, {"observation": obs, "mask": mask})
    assert action.shape == weights.shape == (batch, spec.n_slots)
    np.testing.assert_allclose(weights, action_to_weights(action, mask), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(weights[0], np.eye(spec.n_slots, dtype=np.float32)[0])
    assert is_distribution(weights, mask > 0, atol=1e-6)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_graph_normalizes_raw_observations_itself(exported, runs, algo):
    loaded = load_run(runs[algo])
    session = onnx_session(exported[algo] / MODEL_FILE)
    obs, mask = random_raw_observations(loaded.spec, 64, np.random.default_rng(3))
    (action,) = session.run(["action"], {"observation": obs, "mask": mask})
    actor = loaded.reference_action
    on_normalized = actor(normalize_observation(obs, loaded.spec, loaded.stats))
    np.testing.assert_allclose(action, on_normalized, rtol=0, atol=TOL)
    # Feeding the raw features straight to the actor would give another policy.
    assert np.max(np.abs(action - actor(obs))) > 1e-4


def test_curiosity_graph_normalizes_both_observations(exported, runs):
    loaded = load_run(runs["sac"])
    assert loaded.icm is not None
    session = onnx_session(exported["sac"] / ICM_FILE)
    rng = np.random.default_rng(5)
    for batch in (1, 7):
        prev, mask = random_raw_observations(loaded.spec, batch, rng)
        cur, _ = random_raw_observations(loaded.spec, batch, rng, live=mask > 0)
        act = rng.uniform(-1, 1, size=(batch, loaded.spec.n_slots)).astype(np.float32)
        feeds = dict(zip(ICM_INPUTS, (prev, act, cur, mask), strict=True))
        (reward,) = session.run(None, feeds)
        with torch.no_grad():
            ref = loaded.icm.net(
                torch.as_tensor(normalize_observation(prev, loaded.spec, loaded.stats)),
                torch.as_tensor(act),
                torch.as_tensor(normalize_observation(cur, loaded.spec, loaded.stats)),
            ).numpy()
        assert reward.shape == (batch, 1)
        np.testing.assert_allclose(reward, ref, rtol=0, atol=TOL)


def test_mapping_graph_matches_numpy_on_degenerate_actions(tmp_path):
    n_slots = 4
    path = export_graph(
        ActionToWeights(n_slots),
        (torch.zeros(3, n_slots), torch.ones(3, n_slots)),
        ("action", "mask"),
        ("weights",),
        tmp_path / "mapping.onnx",
    )
    nan, inf = np.nan, np.inf
    action = np.array(
        [
            [0.2, -0.5, 0.9, 1.0],
            [-1.0, -1.0, -1.0, -1.0],  # nothing wanted -> cash
            [nan, nan, nan, nan],  # NaN is no preference -> cash
            [-inf, inf, 3.0, -7.0],  # saturation
            [-1.0, 0.5, nan, 0.5],
            [0.3, 0.9, 0.9, 0.9],  # only cash live
            [-1.0, 0.4, 0.2, -0.2],  # mask says cash masked: cash is live anyway
            [-1.0, -1.0, -1.0, 1.0],  # the only wanted slot is masked -> cash
        ],
        dtype=np.float32,
    )
    mask = np.array(
        [
            [1, 1, 1, 1],
            [1, 1, 1, 0],
            [1, 1, 1, 1],
            [1, 1, 1, 1],
            [1, 1, 0, 1],
            [1, 0, 0, 0],
            [0, 1, 1, 0],
            [1, 1, 1, 0],
        ],
        dtype=np.float32,
    )
    (weights,) = onnx_session(path).run(None, {"action": action, "mask": mask})
    np.testing.assert_allclose(weights, action_to_weights(action, mask), rtol=0, atol=1e-7)
    cash = np.eye(n_slots, dtype=np.float32)[0]
    for row in (1, 2, 5, 7):
        np.testing.assert_array_equal(weights[row], cash)
    assert is_distribution(weights, mask.astype(bool) | (np.arange(n_slots) == 0), atol=1e-6)


def test_normalizer_graph_is_bit_exact_with_normalize_observation(tmp_path):
    # An awkward clip and mean: the graph must carry them as float64, not float32 constants.
    spec = FeatureSpec(max_assets=5, window=8, clip=0.7)
    stats = NormalizationStats(mean=0.00031, std=0.0137)
    path = export_graph(
        ObservationNormalizer(spec, stats),
        (torch.zeros(3, spec.obs_size), torch.ones(3, spec.n_slots)),
        ("observation", "mask"),
        ("normalized",),
        tmp_path / "normalizer.onnx",
    )
    obs, mask = random_raw_observations(spec, 2000, np.random.default_rng(2))
    (out,) = onnx_session(path).run(None, {"observation": obs, "mask": mask})
    np.testing.assert_array_equal(out, normalize_observation(obs, spec, stats))
