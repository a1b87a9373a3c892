"""The bound penalty: pre-tanh scores past ``atanh(limit)`` are pulled back, even from a
saturated actor, and nothing changes when it is off."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from allocator.trainer.agents.regularizer import ActionBoundSettings, bound_penalty
from allocator.trainer.agents.shared_policies import SharedTD3Policy
from allocator.trainer.agents.td3 import SmoothTD3, actor_scores
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from allocator.trainer.training.config import TD3Settings
from tests.markets import random_walk_market, tiny_model_options
from tests.trainer.agents.tiny import BATCH, filled_td3, zero_critic


def shared_td3(**kwargs: Any) -> SmoothTD3:
    env = PortfolioEnv(random_walk_market(n_assets=4), EnvConfig(max_assets=4, window=5))
    options = tiny_model_options(0, BATCH, policy_kwargs={"n_features": 5, "hidden": 8})
    return SmoothTD3(SharedTD3Policy, env, **{**options, **kwargs})


def test_penalty_is_the_squared_excess_past_the_limit_summed_over_slots() -> None:
    settings = ActionBoundSettings(weight=2.0, limit=0.9)
    edge = math.atanh(0.9)
    scores = torch.tensor([[0.0, edge + 0.5, -(edge + 1.0)], [edge - 0.1, 0.3, -0.2]])
    expected = 2.0 * ((0.5**2 + 1.0**2) + 0.0) / 2
    assert bound_penalty(scores, settings).item() == pytest.approx(expected, rel=1e-6)
    assert bound_penalty(scores.clamp(-edge, edge), settings).item() == 0.0


def test_penalty_pulls_a_saturated_score_back_where_a_penalty_on_the_action_cannot() -> None:
    u = torch.tensor([[12.0]], requires_grad=True)
    bound_penalty(u, ActionBoundSettings(weight=1.0)).backward()
    assert u.grad is not None
    assert u.grad.item() == pytest.approx(2 * (12.0 - math.atanh(0.9)))
    v = torch.tensor([[12.0]], requires_grad=True)
    torch.tanh(v).pow(2).sum().backward()
    assert v.grad is not None
    assert v.grad.item() == 0.0


def test_settings_refuse_a_limit_outside_the_open_unit_interval() -> None:
    for limit in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="limit"):
            ActionBoundSettings(limit=limit)
    assert not TD3Settings().action_bound.active


@pytest.mark.parametrize("make", [filled_td3, shared_td3], ids=["flat", "shared"])
def test_actor_scores_are_what_the_actor_squashes(make: Any) -> None:
    model = make()
    obs = torch.as_tensor(
        np.stack([model.observation_space.sample() for _ in range(8)]), dtype=torch.float32
    )
    with torch.no_grad():
        torch.testing.assert_close(torch.tanh(actor_scores(model.actor, obs)), model.actor(obs))


def saturate(model: SmoothTD3) -> None:
    """The flat actor's last layer biased so every action sits at tanh(8), 1 to 7 digits."""
    last = model.actor.mu[-2]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(8.0)


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_a_saturated_actor_moves_back_only_under_the_penalty(weight: float) -> None:
    model = filled_td3(action_bound=ActionBoundSettings(weight=weight))
    zero_critic(model)  # Q is flat: the only actor gradient is the penalty's
    saturate(model)
    before = model.actor.mu[-2].bias.detach().clone()
    np.random.seed(4)
    model.train(gradient_steps=1, batch_size=BATCH)
    after = model.actor.mu[-2].bias.detach()
    logged = model.logger.name_to_value
    if weight:
        assert torch.all(after < before)
        assert logged["train/bound_penalty"] > 0
    else:
        assert torch.equal(after, before)
        assert "train/bound_penalty" not in logged
