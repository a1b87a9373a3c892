"""The reward measured against the tilt's anchor (``env.reward.relative_to: anchor``).

The anchor's one-step return is rebuilt from the anchor the environment announced before the
step and the closes the episode recorded, never read from the environment's growth arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from tests.markets import random_walk_market

M = 5
ASSETS = ["A2", "A0", "A3", "A1"]


def config(relative: bool, **changes: Any) -> EnvConfig:
    base: dict[str, Any] = {
        "max_assets": M,
        "window": 8,
        "episode_length": 30,
        "features": "asset_v1",
        "horizons": [3, 10],
        "vol_window": 6,
        "action": {"mapping": "tilt", "k": 1.5, "anchor": {"kind": "inverse_volatility"}},
        # No long-horizon bonus: the reward is then the net one-step return alone.
        "reward": {
            "scale": 10.0,
            "relative_to": "anchor" if relative else "none",
            "transaction_cost": {"long_weight": 0.0},
        },
    }
    return EnvConfig(**(base | changes))


@pytest.fixture(scope="module")
def data() -> MarketData:
    return random_walk_market(n_dates=200, n_assets=4, seed=5)


def anchor_return(env: PortfolioEnv, anchor: np.ndarray) -> float:
    """The anchor's gross one-step return over the step just recorded, from recorded closes."""
    h = env.history
    k = h.steps
    growth = h.prices[k] / h.prices[k - 1]
    return float(anchor @ growth) - 1.0


def test_the_anchor_itself_earns_zero_every_step_without_costs_or_smoothing(data) -> None:
    """A zero action holds the anchor: measured against it, nothing is gained or lost."""
    env = PortfolioEnv(data, config(True, cost_bps=0.0, beta=0.0))
    env.reset(seed=0, options={"assets": ASSETS})
    zero = np.zeros(M + 1, dtype=np.float32)
    rewards, plain = [], []
    done = False
    while not done:
        _, reward, terminated, truncated, _ = env.step(zero)
        rewards.append(reward)
        plain.append(env.history.returns[env.history.steps - 1])
        done = terminated or truncated
    np.testing.assert_allclose(rewards, 0.0, atol=1e-12)
    assert np.abs(plain).max() > 1e-3  # the book itself did move: the zero is the subtraction


def test_the_reward_is_the_plain_one_minus_the_anchors_return(data) -> None:
    """Same actions, same episode: relative = plain - scale * anchor return, step by step, with
    costs and smoothing on."""
    envs = {rel: PortfolioEnv(data, config(rel, cost_bps=10.0, beta=0.3)) for rel in (False, True)}
    for env in envs.values():
        env.reset(seed=3, options={"assets": ASSETS})
    rng = np.random.default_rng(0)
    for _ in range(20):
        action = rng.uniform(-1, 1, M + 1).astype(np.float32)
        anchor = envs[True].anchor.copy()
        np.testing.assert_array_equal(anchor, envs[False].anchor)
        _, plain, *_ = envs[False].step(action)
        _, relative, *_ = envs[True].step(action)
        expected = plain - 10.0 * anchor_return(envs[True], anchor)
        assert relative == pytest.approx(expected, abs=1e-10)
        assert relative != pytest.approx(plain, abs=1e-6)


def test_the_affine_mapping_has_no_anchor_to_measure_against() -> None:
    with pytest.raises(ValidationError, match=r"relative_to=anchor needs action.mapping=tilt"):
        EnvConfig(reward={"relative_to": "anchor"})
    with pytest.raises(ValidationError, match="relative_to"):
        EnvConfig(reward={"relative_to": "equal-weight"})
