"""Parity: the exported graphs match torch on random and real observations, or nothing is
published."""

from __future__ import annotations

import numpy as np
import pytest

from allocator.artifacts.manifest import (
    read_manifest,
)
from allocator.portfolio import (
    FeatureSpec,
    NormalizationStats,
    is_distribution,
    normalize_observation,
)
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.parity import check_parity, random_raw_observations
from allocator.trainer.export.run import export_run
from tests.trainer.export import TOL


def diffs(parity: dict) -> dict[str, float]:
    out = {}
    for key, value in parity.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in diffs(value).items()})
        elif key.startswith("max_abs_"):
            out[key] = value
    return out


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_export_matches_torch_on_random_and_real_observations(exported, algo):
    parity = read_manifest(exported[algo]).export["parity"]
    assert parity["random"]["n"] == 1000
    assert parity["real"]["n"] == 1000
    figures = diffs(parity)
    for key in ("random.max_abs_action_diff", "real.max_abs_weight_diff"):
        assert key in figures
    # Raw observations rebuilt from real price windows are what the environment showed.
    assert figures["real.max_abs_observation_diff"] <= 1e-6
    assert all(0.0 <= v <= TOL for v in figures.values()), figures
    if algo == "sac":
        assert figures["icm.random.max_abs_reward_diff"] <= TOL
        assert figures["icm.real.max_abs_reward_diff"] <= TOL
        assert parity["icm"]["real"]["n"] == 1000
    else:
        assert "icm" not in parity


def test_random_parity_set_covers_cash_only_masks_and_clipped_features():
    spec = FeatureSpec(max_assets=5, window=8, clip=3.0)
    obs, mask = random_raw_observations(spec, 200, np.random.default_rng(0))
    assert obs.shape == (200, spec.obs_size)
    assert np.all(mask[:, 0] == 1.0)
    assert np.any(mask[:, 1:].sum(axis=1) == 0)
    assert is_distribution(obs[:, 40:46], mask > 0, atol=1e-6)
    normalized = normalize_observation(obs, spec, NormalizationStats(mean=0.0, std=0.01))
    assert np.any(np.abs(normalized[:, :40]) == 3.0)


def test_check_parity_names_every_difference_above_the_tolerance():
    check_parity({"random": {"max_abs_action_diff": 5e-6, "n": 10}}, tolerance=TOL)
    with pytest.raises(ExportError, match=r"real\.max_abs_action_diff = 2e-05"):
        check_parity(
            {
                "random": {"max_abs_action_diff": 1e-7},
                "real": {"max_abs_action_diff": 2e-5},
            },
            tolerance=TOL,
        )
    with pytest.raises(ExportError, match=r"icm\.real\.max_abs_reward_diff = nan"):
        check_parity({"icm": {"real": {"max_abs_reward_diff": float("nan")}}})


def test_failed_parity_writes_nothing_to_the_registry(runs, tmp_path):
    registry = tmp_path / "registry"
    # No float32 weight equals its float64 reference everywhere, so tolerance 0 must fail.
    with pytest.raises(ExportError, match="parity"):
        export_run(runs["td3"], registry, tolerance=0.0, n_parity=50)
    assert not registry.exists()
