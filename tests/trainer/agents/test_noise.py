"""Exploration noise: SB3 noise objects from the settings, the sigma schedules, and the callback
that anneals a model's noise while it learns. Expected sigmas are the schedules' closed forms.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

from allocator.trainer.agents.noise import (
    NoiseAnnealingCallback,
    NoiseSettings,
    annealed_sigma,
    make_action_noise,
)
from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.td3 import SmoothTD3
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from tests.markets import random_walk_market

CFG = EnvConfig(max_assets=3, window=5, episode_length=40)


MARKET = random_walk_market()
SMALL: dict[str, Any] = {
    "policy_kwargs": {"net_arch": [16, 16]},
    "batch_size": 16,
    "buffer_size": 1000,
    "learning_starts": 50,
    "seed": 0,
    "device": "cpu",
}


def noise(**changes: Any) -> NoiseSettings:
    return NoiseSettings(**changes)


# --- make_action_noise ----------------------------------------------------------------------


def test_gaussian_kind_gives_normal_noise_with_sigma_per_dimension() -> None:
    made = make_action_noise(noise(kind="gaussian", sigma=0.25), action_dim=4)
    assert isinstance(made, NormalActionNoise)
    np.testing.assert_array_equal(made._mu, np.zeros(4))
    np.testing.assert_array_equal(made._sigma, np.full(4, 0.25))
    np.random.seed(0)
    draws = np.stack([made() for _ in range(20_000)])
    assert draws.shape == (20_000, 4)
    np.testing.assert_allclose(draws.std(axis=0), 0.25, rtol=0.03)
    np.testing.assert_allclose(draws.mean(axis=0), 0.0, atol=0.01)


def test_ou_kind_gives_ornstein_uhlenbeck_noise_with_theta_and_dt() -> None:
    made = make_action_noise(noise(kind="ou", sigma=0.4, ou_theta=0.3, ou_dt=0.05), 3)
    assert isinstance(made, OrnsteinUhlenbeckActionNoise)
    np.testing.assert_array_equal(made._sigma, np.full(3, 0.4))
    np.testing.assert_array_equal(made._mu, np.zeros(3))
    assert made._theta == 0.3
    assert made._dt == 0.05
    # One OU step from 0: theta (mu - 0) dt + sigma sqrt(dt) N(0, 1) has std sigma sqrt(dt).
    np.random.seed(1)
    first = []
    for _ in range(5000):
        made.reset()
        first.append(made())
    assert np.std(first) == pytest.approx(0.4 * math.sqrt(0.05), rel=0.05)


def test_none_kind_gives_no_noise() -> None:
    assert make_action_noise(noise(kind="none", sigma=0.3), 4) is None


def test_noise_settings_reject_bad_values() -> None:
    with pytest.raises(ValidationError):
        noise(kind="pink")
    with pytest.raises(ValidationError):
        noise(sigma=-0.1)
    with pytest.raises(ValidationError):
        noise(anneal_fraction=0.0)
    with pytest.raises(ValidationError):
        noise(anneal_fraction=1.5)


# --- annealed_sigma -------------------------------------------------------------------------


def test_linear_anneal_hits_start_mid_end_and_stays_after_the_fraction() -> None:
    s = noise(sigma=0.4, final_sigma=0.1, anneal="linear", anneal_fraction=0.5)
    assert annealed_sigma(s, 0.0) == pytest.approx(0.4)
    assert annealed_sigma(s, 0.1) == pytest.approx(0.4 + (0.1 - 0.4) * 0.2)
    assert annealed_sigma(s, 0.25) == pytest.approx(0.25)  # halfway: the average
    assert annealed_sigma(s, 0.5) == pytest.approx(0.1)
    assert annealed_sigma(s, 0.75) == pytest.approx(0.1)
    assert annealed_sigma(s, 1.0) == pytest.approx(0.1)
    assert annealed_sigma(s, 3.0) == pytest.approx(0.1)
    assert annealed_sigma(s, -1.0) == pytest.approx(0.4)  # before the start: the start


def test_exponential_anneal_is_geometric() -> None:
    s = noise(sigma=0.4, final_sigma=0.01, anneal="exponential", anneal_fraction=0.8)
    assert annealed_sigma(s, 0.0) == pytest.approx(0.4)
    assert annealed_sigma(s, 0.4) == pytest.approx(math.sqrt(0.4 * 0.01))  # geometric mean
    assert annealed_sigma(s, 0.2) == pytest.approx(0.4 * (0.01 / 0.4) ** 0.25)
    assert annealed_sigma(s, 0.8) == pytest.approx(0.01)
    assert annealed_sigma(s, 0.95) == pytest.approx(0.01)
    # Below the straight line in between (decays fast, then slowly).
    assert annealed_sigma(s, 0.4) < 0.5 * (0.4 + 0.01)


def test_exponential_anneal_to_zero_falls_back_to_linear() -> None:
    s = noise(sigma=0.3, final_sigma=0.0, anneal="exponential", anneal_fraction=1.0)
    assert annealed_sigma(s, 0.5) == pytest.approx(0.15)
    assert annealed_sigma(s, 1.0) == 0.0


def test_constant_anneal_keeps_the_start_sigma() -> None:
    s = noise(sigma=0.2, final_sigma=0.01, anneal="constant", anneal_fraction=0.5)
    for elapsed in (0.0, 0.25, 0.5, 1.0):
        assert annealed_sigma(s, elapsed) == 0.2


def test_annealing_can_raise_sigma_too() -> None:
    s = noise(sigma=0.1, final_sigma=0.3, anneal="linear", anneal_fraction=1.0)
    assert annealed_sigma(s, 0.5) == pytest.approx(0.2)


# --- NoiseAnnealingCallback ------------------------------------------------------------------


class SigmaRecorder(BaseCallback):
    """Records (num_timesteps, sigma) after the annealing callback has run on each step."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, np.ndarray]] = []

    def _on_step(self) -> bool:
        self.seen.append((self.num_timesteps, self.model.action_noise._sigma.copy()))
        return True


@pytest.mark.parametrize("anneal", ["linear", "exponential"])
def test_callback_anneals_the_models_noise_during_learn(anneal: str) -> None:
    settings = noise(sigma=0.4, final_sigma=0.02, anneal=anneal, anneal_fraction=0.25)
    total = 120
    model = SmoothTD3(
        "MlpPolicy",
        PortfolioEnv(MARKET, CFG),
        action_noise=make_action_noise(settings, 4),
        **SMALL,
    )
    recorder = SigmaRecorder()
    model.learn(total, callback=[NoiseAnnealingCallback(settings, total), recorder])
    assert len(recorder.seen) == total
    for step, sigma in recorder.seen:
        x = min(1.0, step / total / 0.25)
        linear, geometric = 0.4 + (0.02 - 0.4) * x, 0.4 * (0.02 / 0.4) ** x
        expected = linear if anneal == "linear" else geometric
        np.testing.assert_allclose(sigma, np.full(4, expected), rtol=1e-9)
    assert recorder.seen[0][1][0] > 0.3  # first step: barely annealed
    np.testing.assert_allclose(model.action_noise._sigma, np.full(4, 0.02), rtol=1e-12)
    assert model.logger.name_to_value["rollout/noise_sigma"] == pytest.approx(0.02)


def test_callback_on_a_model_without_action_noise_changes_nothing() -> None:
    settings = noise(sigma=0.4, final_sigma=0.02)
    model = SmoothSAC("MlpPolicy", PortfolioEnv(MARKET, CFG), **SMALL)
    assert model.action_noise is None
    model.learn(60, callback=NoiseAnnealingCallback(settings, 60))
    assert model.num_timesteps == 60
    assert model.action_noise is None
    assert "rollout/noise_sigma" not in model.logger.name_to_value
