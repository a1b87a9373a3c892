"""The Intrinsic Curiosity Module on a synthetic, learnable transition.

Transitions follow linear dynamics ``s' = s + W a`` with ``s ~ N(0, I)`` and ``a ~ U[-1, 1]``:
``a`` is recoverable from ``(s, s')`` and ``s'`` predictable from ``(s, a)``, so both ICM losses
can fall. A second matrix ``W_SHIFTED`` gives unfamiliar dynamics for the novelty checks.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from allocator.trainer.agents.icm import CuriosityNet, ICMSettings, IntrinsicCuriosity

OBS_DIM, ACT_DIM = 6, 3
SMALL = {"feature_dim": 16, "hidden_dim": 64}
TRAIN_STEPS = 300


def _matrix(seed: int) -> torch.Tensor:
    return 0.5 * torch.randn(OBS_DIM, ACT_DIM, generator=torch.Generator().manual_seed(seed))


W_FAMILIAR = _matrix(1)
W_SHIFTED = _matrix(2)


def transitions(
    n: int, seed: int, w: torch.Tensor = W_FAMILIAR
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, OBS_DIM, generator=g)
    actions = torch.rand(n, ACT_DIM, generator=g) * 2 - 1
    return obs, actions, obs + actions @ w.T


def make_icm(**overrides: object) -> IntrinsicCuriosity:
    torch.manual_seed(0)
    return IntrinsicCuriosity(OBS_DIM, ACT_DIM, ICMSettings(**{**SMALL, **overrides}))


def params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


@pytest.fixture(scope="module")
def trained() -> tuple[IntrinsicCuriosity, list[dict[str, float]]]:
    icm = make_icm()
    history = [icm.update(*transitions(64, seed=step)) for step in range(TRAIN_STEPS)]
    return icm, history


def test_losses_fall_on_learnable_dynamics(trained):
    _, history = trained
    first, last = history[0], history[-10:]
    for key in ("forward_loss", "inverse_loss", "total_loss"):
        late = np.mean([h[key] for h in last])
        assert late < 0.3 * first[key], key


def test_total_loss_weights_inverse_and_forward_by_beta(trained):
    _, history = trained
    for h in (history[0], history[-1]):
        expected = 0.8 * h["inverse_loss"] + 0.2 * h["forward_loss"]  # default beta = 0.2
        assert h["total_loss"] == pytest.approx(expected, rel=1e-6)


def test_familiar_transitions_are_less_novel_than_shifted_dynamics(trained):
    icm, _ = trained
    obs, actions, familiar_next = transitions(512, seed=10_000)
    shifted_next = obs + actions @ W_SHIFTED.T
    familiar = icm.raw_error(obs, actions, familiar_next)
    shifted = icm.raw_error(obs, actions, shifted_next)
    assert familiar.mean() < 0.25 * shifted.mean()
    # Per transition too, not only on average.
    assert (familiar < shifted).float().mean() > 0.9


def test_raw_error_is_half_squared_feature_error_scaled_by_eta():
    icm = make_icm(eta=3.0)
    obs, actions, next_obs = transitions(8, seed=0)
    net = icm.net
    with torch.no_grad():
        diff = net.forward_model(torch.cat([net.encoder(obs), actions], 1)) - net.encoder(next_obs)
    expected = 3.0 * 0.5 * (diff.numpy().astype(np.float64) ** 2).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(icm.raw_error(obs, actions, next_obs).numpy(), expected, rtol=1e-5)


def test_running_stats_match_numpy_over_all_batches():
    icm = make_icm()
    seen = []
    for step, size in enumerate([1, 7, 64, 3, 128, 32, 64, 5, 256, 17] * 3):
        batch = transitions(size, seed=step)
        icm.update(*batch)  # the raw error drifts as the ICM learns, as in training
        seen.append(icm.raw_error(*batch).numpy().ravel().astype(np.float64))
        icm.intrinsic_reward(*batch)
    everything = np.concatenate(seen)
    net = icm.net
    assert net.reward_count.item() == everything.size
    assert net.reward_mean.item() == pytest.approx(everything.mean(), rel=1e-5)
    assert net.reward_var.item() == pytest.approx(everything.var(), rel=1e-5)


def test_first_reward_is_standardized_by_its_own_batch():
    icm = make_icm()
    batch = transitions(64, seed=3)
    raw = icm.raw_error(*batch).numpy().astype(np.float64)
    expected = np.clip((raw - raw.mean()) / np.sqrt(raw.var() + 1e-8), -5.0, 5.0)
    reward = icm.intrinsic_reward(*batch)
    assert reward.shape == (64, 1)
    np.testing.assert_allclose(reward.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_outlier_reward_is_clipped_to_clip():
    icm = make_icm(clip=2.0)
    for step in range(20):
        icm.intrinsic_reward(*transitions(64, seed=step))
    obs, actions, next_obs = transitions(16, seed=99)
    next_obs[0] += 100.0  # a transition nothing like what the statistics have seen
    reward = icm.intrinsic_reward(obs, actions, next_obs)
    assert reward[0, 0].item() == 2.0
    assert reward[1:].abs().max() < 2.0
    assert reward.abs().max() <= 2.0


def test_reward_far_below_the_running_mean_is_clipped_to_minus_clip():
    icm = make_icm(clip=3.0)
    icm.net.reward_mean.fill_(1e6)  # statistics of a history of enormous errors
    icm.net.reward_count.fill_(1e9)
    with torch.no_grad():
        reward = icm.net(*transitions(16, seed=0))  # reads the statistics, never updates them
    assert torch.equal(reward, torch.full((16, 1), -3.0))


def test_net_forward_equals_intrinsic_reward_and_leaves_stats_alone():
    icm = make_icm()
    for step in range(5):
        icm.intrinsic_reward(*transitions(32, seed=step))
    batch = transitions(32, seed=50)
    reward = icm.intrinsic_reward(*batch)
    buffers = {name: b.clone() for name, b in icm.net.named_buffers()}
    with torch.no_grad():
        first, second = icm.net(*batch), icm.net(*batch)
    torch.testing.assert_close(first, reward)
    torch.testing.assert_close(second, reward)
    for name, b in icm.net.named_buffers():
        assert torch.equal(b, buffers[name]), name


def test_reading_the_reward_through_the_net_leaves_stats_alone():
    icm = make_icm()
    icm.intrinsic_reward(*transitions(32, seed=0))
    buffers = {name: b.clone() for name, b in icm.net.named_buffers()}
    with torch.no_grad():
        icm.net(*transitions(32, seed=1))
    for name, b in icm.net.named_buffers():
        assert torch.equal(b, buffers[name]), name


def test_net_forward_exports_as_a_graph_with_the_stats_inside():
    icm = make_icm()
    icm.intrinsic_reward(*transitions(32, seed=0))
    batch = transitions(8, seed=1)
    exported = torch.export.export(icm.net.eval(), batch)
    buffer_names = set(exported.graph_signature.inputs_to_buffers.values())
    assert {"reward_mean", "reward_var", "reward_count"} <= buffer_names
    torch.testing.assert_close(exported.module()(*batch), icm.net(*batch))


def test_intrinsic_reward_carries_no_gradient():
    icm = make_icm()
    obs, actions, next_obs = transitions(16, seed=0)
    obs.requires_grad_(True)
    actions.requires_grad_(True)
    reward = icm.intrinsic_reward(obs, actions, next_obs)
    assert not reward.requires_grad
    assert reward.grad_fn is None


def test_update_trains_only_the_icm_not_the_actor():
    icm = make_icm()
    torch.manual_seed(1)
    actor = nn.Linear(OBS_DIM, ACT_DIM)
    actor_before, icm_before = params(actor), params(icm.net)
    obs, _, _ = transitions(32, seed=0)
    actions = torch.tanh(actor(obs))
    icm.update(obs, actions, obs + actions @ W_FAMILIAR.T)
    assert actor.weight.grad is None
    assert actor.bias.grad is None
    for name, p in actor.named_parameters():
        assert torch.equal(p, actor_before[name])
    for part in ("encoder", "inverse_model", "forward_model"):
        changed = [
            not torch.equal(p, icm_before[f"{part}.{name}"])
            for name, p in getattr(icm.net, part).named_parameters()
        ]
        assert any(changed), part
    optimized = {id(p) for group in icm.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in icm.net.parameters()}
    assert optimized.isdisjoint(id(p) for p in actor.parameters())


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e3])
def test_update_is_one_adam_step_on_the_pathak_loss(max_grad_norm):
    # Reference written from the paper: the phi(s') target of the forward loss is detached.
    icm = make_icm(beta=0.3, max_grad_norm=max_grad_norm)
    reference = copy.deepcopy(icm.net)
    optimizer = torch.optim.Adam(reference.parameters(), lr=icm.settings.learning_rate)
    obs, actions, next_obs = transitions(32, seed=0)

    phi, phi_next = reference.encoder(obs), reference.encoder(next_obs)
    predicted_action = reference.inverse_model(torch.cat([phi, phi_next], 1))
    inverse = ((predicted_action - actions) ** 2).mean()
    predicted_phi = reference.forward_model(torch.cat([phi, actions], 1))
    forward = 0.5 * ((predicted_phi - phi_next.detach()) ** 2).sum(1).mean()
    (0.7 * inverse + 0.3 * forward).backward()
    nn.utils.clip_grad_norm_(reference.parameters(), max_grad_norm)
    optimizer.step()

    stats = icm.update(obs, actions, next_obs)
    assert stats["inverse_loss"] == pytest.approx(inverse.item(), rel=1e-6)
    assert stats["forward_loss"] == pytest.approx(forward.item(), rel=1e-6)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(dict(icm.net.named_parameters())[name], p, msg=name)


@pytest.mark.parametrize(("beta", "frozen_part"), [(0.0, "forward_model"), (1.0, "inverse_model")])
def test_beta_extremes_train_only_one_model(beta, frozen_part):
    icm = make_icm(beta=beta)
    before = params(icm.net)
    for step in range(3):
        icm.update(*transitions(32, seed=step))
    for name, p in icm.net.named_parameters():
        if name.startswith(frozen_part):
            assert torch.equal(p, before[name]), name
    assert any(
        not torch.equal(p, before[name])
        for name, p in icm.net.named_parameters()
        if name.startswith("encoder")
    )


def test_mix_uses_no_bonus_before_warmup_and_the_weights_after():
    icm = make_icm(extrinsic_weight=0.5, intrinsic_weight=0.25, warmup_steps=100)
    extrinsic = torch.tensor([[1.0], [-2.0]])
    intrinsic = torch.tensor([[0.5], [4.0]])
    before = icm.mix(extrinsic, intrinsic, num_timesteps=99)
    assert torch.equal(before, torch.tensor([[0.5], [-1.0]]))
    for t in (100, 10_000):
        after = icm.mix(extrinsic, intrinsic, num_timesteps=t)
        torch.testing.assert_close(after, torch.tensor([[0.625], [0.0]]))


def test_monitor_mode_leaves_rewards_unchanged_but_still_trains():
    icm = make_icm(intrinsic_weight=0.0, warmup_steps=0)
    before = params(icm.net)
    rewards = torch.randn(64, 1, generator=torch.Generator().manual_seed(0))
    for step in range(5):
        batch = transitions(64, seed=step)
        stats = icm.update(*batch)
        mixed = icm.mix(rewards, icm.intrinsic_reward(*batch), num_timesteps=10_000)
        assert torch.equal(mixed, rewards)
    assert stats["total_loss"] > 0
    assert icm.net.reward_count.item() == 5 * 64
    assert any(not torch.equal(p, before[n]) for n, p in icm.net.named_parameters())


def test_last_stats_reports_latest_losses_and_reward_moments():
    icm = make_icm()
    batch = transitions(64, seed=0)
    icm.update(*transitions(64, seed=1))
    stats = icm.update(*batch)
    reward = icm.intrinsic_reward(*batch).numpy()
    assert icm.last_stats == pytest.approx(
        {
            "icm/forward_loss": stats["forward_loss"],
            "icm/inverse_loss": stats["inverse_loss"],
            "icm/total_loss": stats["total_loss"],
            "icm/intrinsic_reward_mean": float(reward.mean()),
            "icm/intrinsic_reward_std": float(reward.std()),
        },
        rel=1e-5,
        abs=1e-6,
    )


def test_settings_defaults_leave_curiosity_off():
    settings = ICMSettings()
    assert settings.enabled is False
    assert 0 <= settings.beta <= 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("beta", 1.5),
        ("beta", -0.1),
        ("clip", 0.0),
        ("feature_dim", 0),
        ("learning_rate", 0.0),
        ("warmup_steps", -1),
        ("intrinsic_weight", -0.5),
    ],
)
def test_settings_reject_bad_values_naming_the_field(field, value):
    with pytest.raises(ValidationError) as info:
        ICMSettings(**{field: value})
    assert [e["loc"] for e in info.value.errors()] == [(field,)]


def test_settings_reject_unknown_keys_and_assignment():
    with pytest.raises(ValidationError) as info:
        ICMSettings(gamma=0.99)
    assert [e["loc"] for e in info.value.errors()] == [("gamma",)]
    settings = ICMSettings()
    with pytest.raises(ValidationError, match="beta"):
        settings.beta = 0.5


def test_save_load_round_trip_restores_net_stats_and_optimizer(tmp_path: Path):
    icm = make_icm()
    for step in range(10):
        batch = transitions(32, seed=step)
        icm.update(*batch)
        icm.intrinsic_reward(*batch)
    path = tmp_path / "icm.pt"
    icm.save(path)
    loaded = IntrinsicCuriosity.load(path, OBS_DIM, ACT_DIM, icm.settings)

    probe = transitions(32, seed=500)
    with torch.no_grad():
        assert torch.equal(loaded.net(*probe), icm.net(*probe))
    for name, b in icm.net.named_buffers():
        assert torch.equal(dict(loaded.net.named_buffers())[name], b), name
    # Identical Adam moments make the next step identical too.
    icm.update(*probe)
    loaded.update(*probe)
    for name, p in icm.net.named_parameters():
        assert torch.equal(dict(loaded.net.named_parameters())[name], p), name


def test_load_rejects_mismatched_dimensions(tmp_path: Path):
    path = tmp_path / "icm.pt"
    make_icm().save(path)
    with pytest.raises(ValueError, match="obs_dim"):
        IntrinsicCuriosity.load(path, OBS_DIM + 1, ACT_DIM, ICMSettings(**SMALL))


def test_curiosity_net_starts_with_identity_normalization():
    net = CuriosityNet(OBS_DIM, ACT_DIM, feature_dim=4, hidden_dim=8, clip=1e9)
    batch = transitions(8, seed=0)
    with torch.no_grad():
        torch.testing.assert_close(net(*batch), net.raw_error(*batch))
