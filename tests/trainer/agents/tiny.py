"""Tiny SmoothTD3 / SmoothSAC models on a small synthetic market, shared by the agent tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.buffers import ReplayBuffer

from allocator.trainer.agents.icm import ICMSettings
from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.td3 import SmoothTD3
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from tests.markets import random_walk_market, tiny_model_options

CFG = EnvConfig(max_assets=3, window=5, episode_length=40)
BATCH = 32
SMALL_ICM = {"feature_dim": 8, "hidden_dim": 16}
MARKET = random_walk_market()
ALGORITHMS = ("td3", "sac")


def make_td3(seed: int = 0, **kwargs: Any) -> SmoothTD3:
    options = tiny_model_options(seed, BATCH, **kwargs)
    return SmoothTD3("MlpPolicy", PortfolioEnv(MARKET, CFG), **options)


def filled_td3(**kwargs: Any) -> SmoothTD3:
    """A model with a filled replay buffer and no training yet (learning_starts not reached)."""
    options: dict[str, Any] = {"learning_starts": 200, "policy_delay": 1, "max_grad_norm": None}
    options.update(kwargs)
    model = make_td3(**options)
    model.learn(150)
    assert model._n_updates == 0
    return model


def zero_critic(model: SmoothTD3) -> None:
    """All critic weights 0: Q is a constant, so its gradient w.r.t. the action is exactly 0.

    One critic step then only moves the last layer's bias (every other gradient is multiplied
    by a zero weight or a zero activation), so Q stays flat in the action during the actor step.
    """
    with torch.no_grad():
        for p in model.critic.parameters():
            p.zero_()


def make_sac(seed: int = 0, **kwargs: Any) -> SmoothSAC:
    options = tiny_model_options(seed, BATCH, **kwargs)
    return SmoothSAC("MlpPolicy", PortfolioEnv(MARKET, CFG), **options)


def make(algorithm: str, seed: int = 0, **kwargs: Any) -> BaseAlgorithm:
    """A tiny model of ``algorithm`` (``td3`` or ``sac``)."""
    return {"td3": make_td3, "sac": make_sac}[algorithm](seed, **kwargs)


def make_icm(algorithm: str, **icm: Any) -> BaseAlgorithm:
    """A tiny model with a small ICM (``icm`` overrides its settings)."""
    return make(algorithm, icm=ICMSettings(enabled=True, **{**SMALL_ICM, **icm}))


def probe_observations(n: int = 12) -> np.ndarray:
    """Real observations along a fixed path (fixed start, assets and actions)."""
    env = PortfolioEnv(MARKET, CFG)
    obs, _ = env.reset(seed=123, options={"start": 60, "assets": ["A0", "A1", "A2"]})
    rng = np.random.default_rng(7)
    out = [obs]
    for _ in range(n - 1):
        obs, *_ = env.step(rng.uniform(-1, 1, env.action_space.shape).astype(np.float32))
        out.append(obs)
    return np.stack(out)


def sampled_and_stored(model: BaseAlgorithm, seed: int, n: int = 64) -> tuple[Any, Any]:
    """The buffer's (mixed) sample and the same transitions as stored (base-class sample)."""
    buffer: Any = model.replay_buffer  # type: ignore[attr-defined]
    np.random.seed(seed)
    mixed = buffer.sample(n)
    np.random.seed(seed)
    stored = ReplayBuffer.sample(buffer, n)
    assert torch.equal(mixed.observations, stored.observations)  # same transitions
    return mixed, stored
