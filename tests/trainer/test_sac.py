"""SmoothSAC: separate actor/critic learning rates (the entropy coefficient follows the actor),
curiosity through the replay buffer, and seeded determinism, on a tiny synthetic market.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.utils import LinearSchedule

from allocator.trainer.agents.curiosity import CuriosityReplayBuffer
from allocator.trainer.agents.icm import ICMSettings, IntrinsicCuriosity
from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from tests.markets import random_walk_market, tiny_model_options

CFG = EnvConfig(max_assets=3, window=5, episode_length=40)
BATCH = 32


MARKET = random_walk_market()


def make_sac(seed: int = 0, **kwargs: Any) -> SmoothSAC:
    options = tiny_model_options(seed, BATCH, **kwargs)
    return SmoothSAC("MlpPolicy", PortfolioEnv(MARKET, CFG), **options)


def lrs(model: SmoothSAC) -> tuple[float, float, float]:
    assert model.ent_coef_optimizer is not None
    return (
        model.actor.optimizer.param_groups[0]["lr"],
        model.critic.optimizer.param_groups[0]["lr"],
        model.ent_coef_optimizer.param_groups[0]["lr"],
    )


# --- learning rates -------------------------------------------------------------------------


def test_actor_critic_and_entropy_optimizers_carry_their_rates() -> None:
    model = make_sac(actor_learning_rate=1e-4, critic_learning_rate=1e-3)
    assert lrs(model) == (1e-4, 1e-3, 1e-4)
    model.learn(100)
    assert model._n_updates > 0
    assert lrs(model) == (1e-4, 1e-3, 1e-4)
    logged = model.logger.name_to_value
    assert logged["train/actor_learning_rate"] == 1e-4
    assert logged["train/critic_learning_rate"] == 1e-3


def test_actor_schedule_moves_actor_and_entropy_rates_while_critic_stays() -> None:
    start, end, fraction = 1e-3, 1e-5, 0.5
    model = make_sac(
        actor_learning_rate=LinearSchedule(start, end, fraction), critic_learning_rate=3e-4
    )
    assert lrs(model) == (start, 3e-4, start)
    model.learn(200)
    assert lrs(model) == (end, 3e-4, end)  # last update: progress_remaining 0
    model._current_progress_remaining = 0.9
    model.train(gradient_steps=1, batch_size=BATCH)
    expected = start + 0.1 * (end - start) / fraction
    actor, critic, entropy = lrs(model)
    assert actor == pytest.approx(expected, rel=1e-9)
    assert entropy == actor
    assert critic == 3e-4


def test_fixed_entropy_coefficient_has_no_optimizer_and_rates_still_split() -> None:
    model = make_sac(actor_learning_rate=2e-4, critic_learning_rate=7e-4, ent_coef=0.1)
    assert model.ent_coef_optimizer is None
    model.learn(80)
    assert model.actor.optimizer.param_groups[0]["lr"] == 2e-4
    assert model.critic.optimizer.param_groups[0]["lr"] == 7e-4


# --- ICM integration -------------------------------------------------------------------------


def icm_sac(**icm: Any) -> SmoothSAC:
    settings = ICMSettings(enabled=True, feature_dim=8, hidden_dim=16, **icm)
    return make_sac(icm=settings)


def test_icm_sac_has_curiosity_buffer_and_logs_icm_losses() -> None:
    model = icm_sac(warmup_steps=0, intrinsic_weight=0.5)
    assert isinstance(model.replay_buffer, CuriosityReplayBuffer)
    assert isinstance(model.icm, IntrinsicCuriosity)
    icm_params = {id(p) for group in model.icm.optimizer.param_groups for p in group["params"]}
    assert icm_params.isdisjoint({id(p) for p in model.policy.parameters()})
    model.learn(100)
    model.train(gradient_steps=1, batch_size=BATCH)
    logged = model.logger.name_to_value
    for key in ("icm/forward_loss", "icm/inverse_loss", "icm/total_loss"):
        assert key in logged, key
        assert np.isfinite(logged[key])
    assert "train/ent_coef" in logged  # SAC's own train ran too


@pytest.mark.parametrize(("weight", "mixed"), [(0.5, True), (0.0, False)])
def test_icm_sac_sampled_rewards_mix_in_the_bonus_only_with_weight(
    weight: float, mixed: bool
) -> None:
    model = icm_sac(warmup_steps=0, intrinsic_weight=weight)
    model.learn(100)
    np.random.seed(3)
    sample = model.replay_buffer.sample(64)
    np.random.seed(3)
    stored = ReplayBuffer.sample(model.replay_buffer, 64)
    assert torch.equal(sample.actions, stored.actions)
    if mixed:
        with torch.no_grad():
            bonus = model.icm.net(stored.observations, stored.actions, stored.next_observations)
        assert not torch.allclose(sample.rewards, stored.rewards)
        torch.testing.assert_close(
            sample.rewards, stored.rewards + weight * bonus, rtol=1e-5, atol=1e-6
        )
    else:
        assert torch.equal(sample.rewards, stored.rewards)


def test_icm_sac_is_not_pickled_into_model_zip(tmp_path: Path) -> None:
    model = icm_sac(warmup_steps=0)
    model.learn(60)
    model.save(tmp_path / "model.zip")
    with zipfile.ZipFile(tmp_path / "model.zip") as z:
        data = json.loads(z.read("data"))
    assert "icm" not in data
    assert "icm_settings" in data


# --- determinism ---------------------------------------------------------------------------


def probe_observations(n: int = 12) -> np.ndarray:
    env = PortfolioEnv(MARKET, CFG)
    obs, _ = env.reset(seed=123, options={"start": 60, "assets": ["A0", "A1", "A2"]})
    rng = np.random.default_rng(7)
    out = [obs]
    for _ in range(n - 1):
        obs, *_ = env.step(rng.uniform(-1, 1, env.action_space.shape).astype(np.float32))
        out.append(obs)
    return np.stack(out)


def trained_actions(seed: int, obs: np.ndarray) -> np.ndarray:
    model = make_sac(seed=seed)
    model.learn(250)
    actions, _ = model.predict(obs, deterministic=True)
    return actions


def test_same_seed_gives_identical_deterministic_actions_and_another_seed_differs() -> None:
    obs = probe_observations()
    a = trained_actions(0, obs)
    b = trained_actions(0, obs)
    c = trained_actions(1, obs)
    assert a.shape == (len(obs), CFG.max_assets + 1)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_deterministic_predict_is_repeatable_and_stochastic_is_not() -> None:
    model = make_sac()
    model.learn(60)
    obs = probe_observations(6)
    d1, _ = model.predict(obs, deterministic=True)
    d2, _ = model.predict(obs, deterministic=True)
    s1, _ = model.predict(obs, deterministic=False)
    s2, _ = model.predict(obs, deterministic=False)
    np.testing.assert_array_equal(d1, d2)
    assert not np.array_equal(s1, s2)
    assert np.all(np.abs(s1) <= 1.0)
