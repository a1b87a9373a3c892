"""SmoothSAC's own behaviour: the entropy coefficient follows the actor's schedule, the ICM's
losses are logged beside SAC's, and only stochastic predictions vary. What it shares with
SmoothTD3 (learning rates, curiosity, determinism) is checked on both in test_off_policy.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from stable_baselines3.common.utils import LinearSchedule

from allocator.trainer.agents.sac import SmoothSAC
from tests.trainer.agents.tiny import BATCH, make_icm, make_sac, probe_observations


def lrs(model: SmoothSAC) -> tuple[float, float, float]:
    assert model.ent_coef_optimizer is not None
    return (
        model.actor.optimizer.param_groups[0]["lr"],
        model.critic.optimizer.param_groups[0]["lr"],
        model.ent_coef_optimizer.param_groups[0]["lr"],
    )


# --- learning rates -------------------------------------------------------------------------


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


def test_icm_sac_logs_icm_losses_beside_its_own() -> None:
    model: Any = make_icm("sac", warmup_steps=0, intrinsic_weight=0.5)
    model.learn(100)
    model.train(gradient_steps=1, batch_size=BATCH)
    logged = model.logger.name_to_value
    for key in ("icm/forward_loss", "icm/inverse_loss", "icm/total_loss"):
        assert key in logged, key
        assert np.isfinite(logged[key])
    assert "train/ent_coef" in logged  # SAC's own train ran too


# --- determinism ---------------------------------------------------------------------------


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
