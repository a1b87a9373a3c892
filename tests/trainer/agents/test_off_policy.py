"""What SmoothTD3 and SmoothSAC share, checked on both: separate actor/critic learning rates,
the optional ICM (its own optimizer, its bonus mixed into sampled rewards, never pickled into
model.zip), and seeded determinism, on a tiny synthetic market."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from stable_baselines3.common.buffers import ReplayBuffer

from allocator.trainer.agents.algorithms import ALGORITHMS as CLASSES
from allocator.trainer.agents.curiosity import CuriosityReplayBuffer
from allocator.trainer.agents.icm import IntrinsicCuriosity
from allocator.trainer.agents.regularizer import SmoothnessSettings
from tests.trainer.agents.tiny import (
    ALGORITHMS,
    CFG,
    make,
    make_icm,
    probe_observations,
    sampled_and_stored,
)

# --- learning rates -------------------------------------------------------------------------


def rates(model: Any) -> tuple[float, ...]:
    """Actor, critic and (SAC with a learned entropy coefficient) entropy learning rates."""
    optimizers = [model.actor.optimizer, model.critic.optimizer]
    if getattr(model, "ent_coef_optimizer", None) is not None:
        optimizers.append(model.ent_coef_optimizer)
    return tuple(opt.param_groups[0]["lr"] for opt in optimizers)


@pytest.mark.parametrize(
    ("algorithm", "expected"), [("td3", (1e-4, 1e-3)), ("sac", (1e-4, 1e-3, 1e-4))]
)
def test_actor_and_critic_optimizers_carry_their_own_learning_rates(
    algorithm: str, expected: tuple[float, ...]
) -> None:
    """SAC's entropy coefficient follows the actor's rate."""
    model = make(algorithm, actor_learning_rate=1e-4, critic_learning_rate=1e-3)
    assert rates(model) == expected
    model.learn(100)
    assert model._n_updates > 0
    assert rates(model) == expected
    logged = model.logger.name_to_value
    assert logged["train/actor_learning_rate"] == 1e-4
    assert logged["train/critic_learning_rate"] == 1e-3


# --- ICM integration -------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_icm_model_has_curiosity_buffer_and_its_own_optimizer(algorithm: str) -> None:
    model: Any = make_icm(algorithm, warmup_steps=0, intrinsic_weight=0.5)
    assert isinstance(model.replay_buffer, CuriosityReplayBuffer)
    assert isinstance(model.icm, IntrinsicCuriosity)
    assert model.replay_buffer.curiosity is model.icm
    icm_params = {id(p) for group in model.icm.optimizer.param_groups for p in group["params"]}
    assert icm_params == {id(p) for p in model.icm.net.parameters()}
    policy_params = {id(p) for p in model.policy.parameters()}
    assert policy_params  # actor, critic and their targets
    assert icm_params.isdisjoint(policy_params)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_without_icm_the_buffer_is_plain_and_there_is_no_icm(algorithm: str) -> None:
    model: Any = make(algorithm)
    assert model.icm is None
    assert type(model.replay_buffer) is ReplayBuffer


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_sampled_rewards_add_weighted_intrinsic_bonus_after_warmup(algorithm: str) -> None:
    model: Any = make_icm(algorithm, warmup_steps=0, intrinsic_weight=0.5)
    model.learn(100)
    mixed, stored = sampled_and_stored(model, seed=1)
    assert torch.equal(mixed.actions, stored.actions)
    assert not torch.allclose(mixed.rewards, stored.rewards)
    # The bonus is the ICM's normalized error of these transitions, with the state the
    # sample left it in (one update step and these errors folded into the statistics).
    with torch.no_grad():
        bonus = model.icm.net(stored.observations, stored.actions, stored.next_observations)
    torch.testing.assert_close(mixed.rewards, stored.rewards + 0.5 * bonus, rtol=1e-5, atol=1e-6)
    assert (mixed.rewards - stored.rewards).abs().max().item() <= 0.5 * model.icm.settings.clip


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    "icm", [{"warmup_steps": 0, "intrinsic_weight": 0.0}, {"warmup_steps": 10**6}]
)
def test_sampled_rewards_are_the_stored_ones_with_zero_weight_or_during_warmup(
    algorithm: str, icm: dict[str, Any]
) -> None:
    model: Any = make_icm(algorithm, **icm)
    model.learn(100)
    mixed, stored = sampled_and_stored(model, seed=2)
    assert torch.equal(mixed.rewards, stored.rewards)
    assert model.icm.last_stats  # the ICM still trained and measured novelty


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_icm_is_not_pickled_into_model_zip(tmp_path: Path, algorithm: str) -> None:
    model: Any = make_icm(algorithm, warmup_steps=0, intrinsic_weight=0.5)
    model.learn(100)
    path = tmp_path / "model.zip"
    model.save(path)
    with zipfile.ZipFile(path) as z:
        data = json.loads(z.read("data"))
        assert not any("icm" in name and name != "data" for name in z.namelist())
    assert "icm" not in data
    assert "icm_settings" in data  # the settings travel, the module does not
    loaded = CLASSES[algorithm].load(path, device="cpu")
    assert loaded.icm_settings == model.icm_settings
    assert isinstance(loaded.replay_buffer, CuriosityReplayBuffer)


# --- determinism ---------------------------------------------------------------------------

TRAINING = {
    "td3": ({"smoothness": SmoothnessSettings(mode="adaptive", lam=0.1)}, 300),
    "sac": ({}, 250),
}
"""Per algorithm: model options and timesteps of the determinism check."""


def trained_actions(algorithm: str, seed: int, obs: np.ndarray) -> np.ndarray:
    options, steps = TRAINING[algorithm]
    model = make(algorithm, seed=seed, **options)
    model.learn(steps)
    actions, _ = model.predict(obs, deterministic=True)
    return actions


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_same_seed_gives_identical_deterministic_actions_and_another_seed_differs(
    algorithm: str,
) -> None:
    obs = probe_observations()
    a = trained_actions(algorithm, 0, obs)
    b = trained_actions(algorithm, 0, obs)
    c = trained_actions(algorithm, 1, obs)
    assert a.shape == (len(obs), CFG.max_assets + 1)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
