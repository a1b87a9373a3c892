"""SmoothTD3 and its parts: critic loss, target noise, gradient clipping, smoothness, two LRs, ICM
(what it shares with SmoothSAC is checked on both in test_off_policy.py).

The unit checks use fixed tensors and hand formulas. The training checks build tiny models on a
small synthetic market (seeded geometric random walks) and compare what one ``train`` call did
with the same batch recomputed by hand: the batch is drawn again by re-seeding numpy's global
generator (SB3's replay buffer samples with it) and the target noise by re-seeding torch's.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from stable_baselines3.common.logger import configure
from stable_baselines3.common.utils import LinearSchedule
from torch import nn

from allocator.trainer.agents.curiosity import CuriosityReplayBuffer
from allocator.trainer.agents.icm import ICMSettings
from allocator.trainer.agents.regularizer import (
    SmoothMode,
    SmoothnessLambda,
    SmoothnessSettings,
    split_change,
)
from allocator.trainer.agents.td3 import SmoothTD3, clip_and_step, critic_loss, target_policy_noise
from tests.trainer.agents.tiny import (
    BATCH,
    SMALL_ICM,
    filled_td3,
    make_icm,
    make_td3,
    probe_observations,
    zero_critic,
)


def params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def hand_mean_change(actor: nn.Module, obs: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """E_batch sum_j (pi(s')_j - pi(s)_j)^2, written out independently of ``split_change``."""
    diff = actor(next_obs) - actor(obs)
    return (diff * diff).sum(dim=1).mean()


# --- critic_loss ----------------------------------------------------------------------------


def hand_huber(q: torch.Tensor, target: torch.Tensor, delta: float) -> float:
    d = (q - target).double().flatten().tolist()
    vals = [0.5 * x * x if abs(x) <= delta else delta * (abs(x) - 0.5 * delta) for x in d]
    return sum(vals) / len(vals)


def hand_mse(q: torch.Tensor, target: torch.Tensor) -> float:
    d = (q - target).double().flatten().tolist()
    return sum(x * x for x in d) / len(d)


Q1 = torch.tensor([[0.0], [1.0], [-2.0], [3.5], [0.2]])
Q2 = torch.tensor([[0.5], [-1.0], [0.1], [2.0], [-4.0]])
TARGET = torch.tensor([[0.1], [0.3], [0.0], [-1.0], [0.2]])


@pytest.mark.parametrize("delta", [1.0, 0.5, 2.0])
def test_huber_critic_loss_matches_hand_formula_summed_over_twins(delta: float) -> None:
    loss = critic_loss((Q1, Q2), TARGET, "huber", delta)
    expected = hand_huber(Q1, TARGET, delta) + hand_huber(Q2, TARGET, delta)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_mse_critic_loss_matches_hand_formula_summed_over_twins() -> None:
    loss = critic_loss((Q1, Q2), TARGET, "mse")
    assert loss.item() == pytest.approx(hand_mse(Q1, TARGET) + hand_mse(Q2, TARGET), rel=1e-6)


def test_huber_is_half_mse_when_every_error_is_inside_delta() -> None:
    q = torch.tensor([[0.1], [-0.2], [0.3]])
    target = torch.zeros(3, 1)
    huber = critic_loss((q, q), target, "huber", delta=1.0).item()
    mse = critic_loss((q, q), target, "mse").item()
    assert huber == pytest.approx(0.5 * mse, rel=1e-6)
    # ...but grows only linearly past delta: an outlier of 100 costs 99.5, not 5000.
    spike = torch.tensor([[100.0]])
    assert critic_loss((spike,), torch.zeros(1, 1), "huber").item() == pytest.approx(99.5)
    assert critic_loss((spike,), torch.zeros(1, 1), "mse").item() == pytest.approx(1e4)


def test_critic_loss_differentiates_into_every_critic() -> None:
    q1, q2 = Q1.clone().requires_grad_(), Q2.clone().requires_grad_()
    critic_loss((q1, q2), TARGET, "mse").backward()
    # d/dq mean((q - t)^2) = 2 (q - t) / n
    assert torch.allclose(q1.grad, 2 * (Q1 - TARGET) / 5)
    assert torch.allclose(q2.grad, 2 * (Q2 - TARGET) / 5)


def test_unknown_critic_loss_kind_raises() -> None:
    with pytest.raises(ValueError, match="huber"):
        critic_loss((Q1, Q2), TARGET, "l1")


# --- target policy noise -------------------------------------------------------------------


def test_target_noise_has_actions_shape_and_is_fresh_per_call() -> None:
    actions = torch.zeros(64, 4)
    a = target_policy_noise(actions, 0.2, 0.5)
    b = target_policy_noise(actions, 0.2, 0.5)
    assert a.shape == b.shape == actions.shape
    assert not torch.equal(a, b)
    # Not one value broadcast over the batch (the bug of the earlier port).
    assert a.unique().numel() > 200
    assert torch.equal(actions, torch.zeros(64, 4))  # the actions are not modified


def test_target_noise_is_clipped() -> None:
    noise = target_policy_noise(torch.zeros(2000, 3), sigma=5.0, clip=0.3)
    clip = torch.tensor(0.3, dtype=noise.dtype)  # 0.3 as float32
    assert torch.all(noise.abs() <= clip)
    # With sigma >> clip nearly every entry sits on a bound: P(|N(0, 25)| < 0.3) ~ 4.8%.
    at_bound = (noise.abs() == clip).float().mean().item()
    assert at_bound > 0.9


def test_target_noise_std_is_sigma_when_clip_does_not_bind() -> None:
    torch.manual_seed(0)
    noise = target_policy_noise(torch.zeros(200_000), sigma=0.01, clip=0.5)
    assert noise.std().item() == pytest.approx(0.01, rel=0.02)
    assert abs(noise.mean().item()) < 1e-4


# --- clip_and_step -------------------------------------------------------------------------


def sgd_net(lr: float) -> tuple[nn.Module, nn.Parameter]:
    """A one-parameter net with the ``optimizer`` SB3's networks carry, its gradient (3, 4)."""
    net = nn.Module()
    net.p = nn.Parameter(torch.tensor([1.0, 2.0]))
    net.p.grad = torch.tensor([3.0, 4.0])  # norm 5
    net.optimizer = torch.optim.SGD([net.p], lr=lr)
    return net, net.p


def test_clip_and_step_returns_pre_clip_norm_and_steps_with_clipped_gradient() -> None:
    net, p = sgd_net(lr=1.0)
    norms: list[torch.Tensor] = []
    clip_and_step(net, max_norm=1.0, norms=norms)
    assert norms == [pytest.approx(5.0)]
    # SGD with lr 1 moves by the clipped gradient (3, 4) / 5.
    assert torch.allclose(p.detach(), torch.tensor([1.0 - 0.6, 2.0 - 0.8]), atol=1e-6)


@pytest.mark.parametrize("max_norm", [None, 10.0])
def test_clip_and_step_leaves_small_or_unclipped_gradients_alone(max_norm: float | None) -> None:
    net, p = sgd_net(lr=0.5)
    norms: list[torch.Tensor] = []
    clip_and_step(net, max_norm=max_norm, norms=norms)
    if max_norm is None:
        assert norms == []  # clipping off: no norm computed at all
    else:
        assert norms == [pytest.approx(5.0)]
    assert torch.allclose(p.detach(), torch.tensor([1.0 - 1.5, 2.0 - 2.0]), atol=1e-6)


# --- split_change ---------------------------------------------------------------------------


def linear_tanh_actor() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(3, 2), nn.Tanh())


def test_action_change_is_squared_distance_between_consecutive_actions() -> None:
    actor = linear_tanh_actor()
    lin = actor[0]
    obs = torch.tensor([[0.1, -0.3, 0.5], [1.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    next_obs = torch.tensor([[0.2, -0.1, 0.4], [-1.0, 0.5, 0.3], [0.0, 0.0, 0.0]])
    w, b = lin.weight.detach().double(), lin.bias.detach().double()
    a = np.tanh(obs.double().numpy() @ w.numpy().T + b.numpy())
    a_next = np.tanh(next_obs.double().numpy() @ w.numpy().T + b.numpy())
    expected = ((a_next - a) ** 2).sum(axis=1)
    change = split_change(actor(torch.cat([obs, next_obs])))[1]
    assert change.shape == (3,)
    np.testing.assert_allclose(change.detach().numpy(), expected, rtol=1e-5, atol=1e-7)
    assert change[2].item() == 0.0  # identical states: no change


def test_action_change_gradient_flows_into_actor_as_derived_by_hand() -> None:
    actor = linear_tanh_actor()
    lin = actor[0]
    obs = torch.tensor([[0.1, -0.3, 0.5], [1.0, 0.0, -1.0]])
    next_obs = torch.tensor([[0.2, -0.1, 0.4], [-1.0, 0.5, 0.3]])
    split_change(actor(torch.cat([obs, next_obs])))[1].mean().backward()
    # C = sum_j (a'_j - a_j)^2 with a = tanh(W x + b):
    # dC/dW_jk = 2 (a'_j - a_j) ((1 - a'_j^2) x'_k - (1 - a_j^2) x_k), dC/db_j likewise with x = 1.
    w, b = lin.weight.detach().double().numpy(), lin.bias.detach().double().numpy()
    x, xn = obs.double().numpy(), next_obs.double().numpy()
    a, an = np.tanh(x @ w.T + b), np.tanh(xn @ w.T + b)
    g = 2 * (an - a)  # (B, out)
    grad_w = (
        (g * (1 - an**2))[:, :, None] * xn[:, None, :]
        - (g * (1 - a**2))[:, :, None] * x[:, None, :]
    ).mean(axis=0)
    grad_b = (g * ((1 - an**2) - (1 - a**2))).mean(axis=0)
    np.testing.assert_allclose(lin.weight.grad.numpy(), grad_w, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(lin.bias.grad.numpy(), grad_b, rtol=1e-4, atol=1e-7)
    assert lin.weight.grad.abs().sum().item() > 0


# --- SmoothnessLambda -----------------------------------------------------------------------


def test_adaptive_lambda_follows_dual_ascent_arithmetic() -> None:
    s = SmoothnessSettings(mode="adaptive", lam=0.2, alpha=0.5, budget=0.1, lam_max=100.0)
    lam = SmoothnessLambda(s)
    assert lam.active
    assert lam.value == 0.2
    expected = 0.2
    for change in [0.5, 0.3, 0.1, 0.0, 0.02, 0.9]:
        expected = min(100.0, max(0.0, expected + 0.5 * (change - 0.1)))
        assert lam.update(change) == pytest.approx(expected, abs=1e-12)
        assert lam.value == pytest.approx(expected, abs=1e-12)


def test_adaptive_lambda_rises_while_over_budget_and_decays_to_zero_never_negative() -> None:
    lam = SmoothnessLambda(SmoothnessSettings(mode="adaptive", lam=0.0, alpha=0.1, budget=0.05))
    values = [lam.update(0.25) for _ in range(5)]  # E[C] > d: +0.1 * 0.2 = +0.02 per step
    assert values == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.10])
    values = [lam.update(0.0) for _ in range(5)]  # E[C] < d: -0.005 per step
    assert values == pytest.approx([0.095, 0.09, 0.085, 0.08, 0.075])
    for _ in range(100):
        lam.update(0.0)
    assert lam.value == 0.0
    assert lam.update(0.05) == 0.0  # exactly on budget: stays put


def test_adaptive_lambda_is_capped_at_lam_max() -> None:
    lam = SmoothnessLambda(
        SmoothnessSettings(mode="adaptive", lam=0.9, alpha=1.0, budget=0.0, lam_max=1.5)
    )
    assert lam.update(0.4) == pytest.approx(1.3)
    assert lam.update(0.4) == 1.5
    assert lam.update(10.0) == 1.5


def test_fixed_lambda_never_changes() -> None:
    lam = SmoothnessLambda(SmoothnessSettings(mode="fixed", lam=0.7, alpha=1.0, budget=0.0))
    assert lam.active
    for change in [10.0, 0.0, 3.0]:
        assert lam.update(change) == 0.7
    assert lam.value == 0.7


def test_none_mode_lambda_is_zero_and_inactive_even_with_lam_set() -> None:
    lam = SmoothnessLambda(SmoothnessSettings(mode="none", lam=5.0))
    assert not lam.active
    assert lam.value == 0.0
    assert lam.update(100.0) == 0.0
    assert SmoothnessSettings().mode == SmoothMode.NONE


# --- one SmoothTD3.train step, recomputed by hand --------------------------------------------


@pytest.mark.parametrize(("kind", "delta"), [("huber", 0.05), ("mse", 1.0)])
def test_train_step_logs_the_configured_critic_loss_of_the_td3_target(
    kind: str, delta: float
) -> None:
    model = filled_td3(
        critic_loss=kind, huber_delta=delta, target_policy_noise=0.3, target_noise_clip=0.4
    )
    critic, critic_target = copy.deepcopy(model.critic), copy.deepcopy(model.critic_target)
    actor_target = copy.deepcopy(model.actor_target)
    np.random.seed(11)
    batch = model.replay_buffer.sample(BATCH)
    torch.manual_seed(5)
    noise = (torch.randn_like(batch.actions) * 0.3).clamp(-0.4, 0.4)
    with torch.no_grad():
        next_actions = (actor_target(batch.next_observations) + noise).clamp(-1, 1)
        q1n, q2n = critic_target(batch.next_observations, next_actions)
        target = batch.rewards + (1 - batch.dones) * model.gamma * torch.minimum(q1n, q2n)
        q1, q2 = critic(batch.observations, batch.actions)
    if kind == "huber":
        expected = hand_huber(q1, target, delta) + hand_huber(q2, target, delta)
        assert expected != pytest.approx(hand_mse(q1, target) + hand_mse(q2, target), rel=0.01)
    else:
        expected = hand_mse(q1, target) + hand_mse(q2, target)

    np.random.seed(11)
    torch.manual_seed(5)
    model.train(gradient_steps=1, batch_size=BATCH)
    assert model.logger.name_to_value["train/critic_loss"] == pytest.approx(expected, rel=1e-4)


def test_actor_gradient_is_lambda_times_grad_of_mean_action_change_when_q_is_flat() -> None:
    lam = 0.8
    model = filled_td3(smoothness=SmoothnessSettings(mode="fixed", lam=lam))
    zero_critic(model)
    before = copy.deepcopy(model.actor)
    np.random.seed(4)
    batch = model.replay_buffer.sample(BATCH)
    mean_change = hand_mean_change(before, batch.observations, batch.next_observations)
    (lam * mean_change).backward()

    np.random.seed(4)
    model.train(gradient_steps=1, batch_size=BATCH)

    expected = dict(before.named_parameters())
    for name, p in model.actor.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, expected[name].grad, rtol=1e-4, atol=1e-8)
    logged = model.logger.name_to_value
    assert logged["train/action_change"] == pytest.approx(mean_change.item(), rel=1e-5)
    assert logged["train/smooth_penalty"] == pytest.approx(lam * mean_change.item(), rel=1e-5)
    assert logged["train/smooth_lambda"] == lam
    # The step moved the actor toward smaller action changes on that batch.
    after = hand_mean_change(model.actor, batch.observations, batch.next_observations)
    assert after.item() < mean_change.item()


def test_actor_does_not_move_without_smoothness_when_q_is_flat() -> None:
    model = filled_td3(smoothness=SmoothnessSettings(mode="none", lam=5.0))
    zero_critic(model)
    before = params(model.actor)
    np.random.seed(4)
    model.train(gradient_steps=1, batch_size=BATCH)
    assert model._n_updates == 1
    assert "train/actor_loss" in model.logger.name_to_value  # the actor step did happen
    assert "train/smooth_penalty" not in model.logger.name_to_value
    for name, p in model.actor.named_parameters():
        assert torch.equal(p.grad, torch.zeros_like(p))
        assert torch.equal(p.detach(), before[name]), name


def test_adaptive_lambda_in_train_takes_the_batch_dual_ascent_step() -> None:
    settings = SmoothnessSettings(mode="adaptive", lam=0.3, alpha=2.0, budget=0.0)
    model = filled_td3(smoothness=settings)
    np.random.seed(9)
    batch = model.replay_buffer.sample(BATCH)
    with torch.no_grad():
        mean_change = hand_mean_change(model.actor, batch.observations, batch.next_observations)
    expected = max(0.0, 0.3 + 2.0 * (mean_change.item() - 0.0))
    assert expected > 0.3
    np.random.seed(9)
    model.train(gradient_steps=1, batch_size=BATCH)
    assert model.smooth_lambda == pytest.approx(expected, rel=1e-5)
    assert model.logger.name_to_value["train/smooth_lambda"] == model.smooth_lambda


def test_policy_delay_skips_actor_and_lambda_on_off_steps() -> None:
    settings = SmoothnessSettings(mode="adaptive", lam=0.3, alpha=2.0, budget=0.0)
    model = filled_td3(smoothness=settings, policy_delay=2)
    before = params(model.actor)
    model.train(gradient_steps=1, batch_size=BATCH)  # update 1: 1 % 2 != 0, critic only
    assert model.smooth_lambda == 0.3
    for name, p in model.actor.named_parameters():
        assert torch.equal(p.detach(), before[name])
    model.train(gradient_steps=1, batch_size=BATCH)  # update 2: the actor steps
    assert model.smooth_lambda != 0.3
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.actor.named_parameters())


def test_gradient_clipping_in_train_bounds_the_applied_critic_gradient() -> None:
    # policy_delay 2: the first update is critic-only, so the critic's .grad afterwards is
    # what its optimizer applied (an actor step would add the actor loss's gradient to it).
    model = filled_td3(max_grad_norm=1e-3, policy_delay=2)
    model.train(gradient_steps=1, batch_size=BATCH)
    logged_norm = model.logger.name_to_value["train/critic_grad_norm"]
    assert logged_norm > 1e-3  # the pre-clip norm is logged
    clipped = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.critic.parameters()))
    assert clipped.item() == pytest.approx(1e-3, rel=1e-3)


# --- learning rates -------------------------------------------------------------------------


def lrs(model: SmoothTD3) -> tuple[float, float]:
    return (
        model.actor.optimizer.param_groups[0]["lr"],
        model.critic.optimizer.param_groups[0]["lr"],
    )


def test_actor_learning_rate_schedule_moves_while_critic_rate_stays() -> None:
    start, end, fraction = 1e-3, 1e-5, 0.5
    model = make_td3(
        actor_learning_rate=LinearSchedule(start, end, fraction), critic_learning_rate=3e-4
    )
    assert lrs(model) == (start, 3e-4)
    model.learn(200)
    # The last update ran with progress_remaining 0, past end_fraction: the end value.
    assert lrs(model) == (end, 3e-4)
    # Midway through the schedule: start + (1 - p) (end - start) / end_fraction.
    model._current_progress_remaining = 0.8
    model.train(gradient_steps=1, batch_size=BATCH)
    actor_lr, critic_lr = lrs(model)
    assert actor_lr == pytest.approx(start + 0.2 * (end - start) / fraction, rel=1e-9)
    assert critic_lr == 3e-4


def test_critic_learning_rate_schedule_is_applied_to_critic_only() -> None:
    model = make_td3(actor_learning_rate=2e-4, critic_learning_rate=LinearSchedule(1e-3, 1e-4, 1))
    assert lrs(model) == (2e-4, 1e-3)
    model.learn(100)
    model._current_progress_remaining = 0.5
    model.train(gradient_steps=1, batch_size=BATCH)
    assert lrs(model)[0] == 2e-4
    assert lrs(model)[1] == pytest.approx(1e-3 + 0.5 * (1e-4 - 1e-3), rel=1e-9)


# --- ICM integration -----------------------------------------------------------------------


def test_icm_trains_and_is_logged_during_learn(tmp_path: Path) -> None:
    model = make_icm("td3", warmup_steps=0, intrinsic_weight=0.5)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    before = params(model.icm.net)
    model.learn(200, log_interval=1)
    after = params(model.icm.net)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    progress = pd.read_csv(tmp_path / "progress.csv")
    for key in (
        "icm/forward_loss",
        "icm/inverse_loss",
        "icm/total_loss",
        "icm/intrinsic_reward_mean",
        "icm/intrinsic_reward_std",
    ):
        assert key in progress.columns, key
        assert progress[key].notna().any(), key


# --- determinism and persistence --------------------------------------------------------------


def test_adaptive_lambda_is_saved_and_loaded(tmp_path: Path) -> None:
    settings = SmoothnessSettings(mode="adaptive", lam=0.5, alpha=0.3, budget=0.01)
    model = make_td3(smoothness=settings)
    model.learn(200)
    assert model.smooth_lambda != 0.5  # dual ascent moved it
    model.save(tmp_path / "model.zip")
    loaded = SmoothTD3.load(tmp_path / "model.zip", device="cpu")
    assert loaded.smooth_lambda == model.smooth_lambda
    assert loaded.smoothness == settings
    assert lrs(loaded) == lrs(model)
    obs = probe_observations(4)
    np.testing.assert_array_equal(
        loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0]
    )


def test_icm_trains_on_every_kth_batch_only() -> None:
    model = make_td3(icm=ICMSettings(enabled=True, update_every=3, warmup_steps=0, **SMALL_ICM))
    model.learn(60)  # fills the buffer without training (learning_starts=50)
    icm = model.icm
    assert icm is not None
    before = copy.deepcopy(icm.net.state_dict())
    buffer = model.replay_buffer
    assert isinstance(buffer, CuriosityReplayBuffer)
    buffer.batches = 0  # learn() already sampled a few batches; count from here
    changed = []
    for _ in range(6):
        state = copy.deepcopy(icm.net.state_dict())
        buffer.sample(BATCH)
        after = icm.net.state_dict()
        changed.append(any(not torch.equal(state[k], after[k]) for k in state if "reward" not in k))
    assert changed == [True, False, False, True, False, False]
    assert any(not torch.equal(before[k], icm.net.state_dict()[k]) for k in before)
