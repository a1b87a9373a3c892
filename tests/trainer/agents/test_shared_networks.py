"""The per-asset shared actor and critics: symmetry, masking, any set size, SB3 training, save/load.

Observations are random vectors of the flat layout ``[M*F asset block, M+1 weights, M+1 mask]``
(the networks must not care where the numbers come from); the training checks use the real
``PortfolioEnv`` whose default features (``F = window``) have the same layout.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.distributions import SquashedDiagGaussianDistribution

from allocator.trainer.agents.icm import ICMSettings
from allocator.trainer.agents.regularizer import SmoothMode, SmoothnessSettings
from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.shared_networks import (
    ObservationLayout,
    SharedQNet,
    masked_mean_max,
    slot_order_sums,
)
from allocator.trainer.agents.shared_policies import (
    SharedCritic,
    SharedSACActor,
    SharedSACPolicy,
    SharedTD3Actor,
    SharedTD3Policy,
)
from allocator.trainer.agents.td3 import SmoothTD3
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from tests.markets import random_walk_market, tiny_model_options

M, F, HIDDEN = 6, 7, 32
POLICIES = {"td3": SharedTD3Policy, "sac": SharedSACPolicy}
ALGORITHMS = {"td3": SmoothTD3, "sac": SmoothSAC}


def spaces_for(n_assets: int = M, n_features: int = F) -> tuple[spaces.Box, spaces.Box]:
    dim = n_assets * n_features + 2 * (n_assets + 1)
    obs_space = spaces.Box(-np.inf, np.inf, shape=(dim,), dtype=np.float32)
    return obs_space, spaces.Box(-1.0, 1.0, shape=(n_assets + 1,), dtype=np.float32)


def make_policy(
    kind: str, seed: int = 0, center: bool = False
) -> SharedTD3Policy | SharedSACPolicy:
    torch.manual_seed(seed)
    obs_space, act_space = spaces_for()
    return POLICIES[kind](
        obs_space, act_space, lambda _: 1e-3, n_features=F, hidden=HIDDEN, center_assets=center
    )


def random_parts(
    batch: int, seed: int, n_assets: int = M, n_features: int = F
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features, weights (a distribution over live slots) and a mask with >= 1 live asset."""
    gen = torch.Generator().manual_seed(seed)
    live = torch.rand(batch, n_assets, generator=gen) < 0.6
    live[:, 0] = True
    mask = torch.cat([torch.ones(batch, 1), live.float()], dim=1)
    features = torch.randn(batch, n_assets, n_features, generator=gen) * live.unsqueeze(-1)
    weights = torch.rand(batch, n_assets + 1, generator=gen) * mask
    return features, weights / weights.sum(dim=1, keepdim=True), mask


def flat(features: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.cat([features.flatten(1), weights, mask], dim=1)


def permute_slots(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Reorder the asset slots of a (B, M+1, ...) tensor; cash (slot 0) stays first."""
    return torch.cat([x[:, :1], x[:, 1:][:, perm]], dim=1)


def actor_action(policy: SharedTD3Policy | SharedSACPolicy, obs: torch.Tensor) -> torch.Tensor:
    if isinstance(policy.actor, SharedSACActor):
        return policy.actor(obs, deterministic=True)
    return policy.actor(obs)


# --- layout ---------------------------------------------------------------------------------


def test_layout_splits_slot_major_blocks() -> None:
    features, weights, mask = random_parts(3, seed=1)
    layout = ObservationLayout.from_spaces(*spaces_for(), n_features=F)
    got = layout.split(flat(features, weights, mask))
    for part, expected in zip(got, (features, weights, mask), strict=True):
        assert torch.equal(part, expected)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_wrong_n_features_is_refused(kind: str) -> None:
    obs_space, act_space = spaces_for()
    with pytest.raises(ValueError, match="n_features"):
        POLICIES[kind](obs_space, act_space, lambda _: 1e-3, n_features=F + 1)


def test_sde_and_shared_extractor_are_refused() -> None:
    obs_space, act_space = spaces_for()
    with pytest.raises(ValueError, match="gSDE"):
        SharedSACPolicy(obs_space, act_space, lambda _: 1e-3, n_features=F, use_sde=True)
    with pytest.raises(ValueError, match="features extractor"):
        SharedTD3Policy(
            obs_space, act_space, lambda _: 1e-3, n_features=F, share_features_extractor=True
        )


def test_masked_pooling_ignores_masked_rows_and_is_zero_when_none_live() -> None:
    h = torch.tensor([[[1.0, -2.0], [3.0, 5.0], [float("nan"), 100.0]]])
    live = torch.tensor([[True, True, False]])
    assert torch.equal(masked_mean_max(h, live), torch.tensor([[2.0, 1.5, 3.0, 5.0]]))
    none = masked_mean_max(h, torch.zeros_like(live))
    assert torch.equal(none, torch.zeros(1, 4))


# --- symmetry -------------------------------------------------------------------------------


@pytest.mark.parametrize("center", [False, True], ids=["raw", "centered"])
@pytest.mark.parametrize("kind", sorted(POLICIES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_permuting_assets_permutes_actions_and_keeps_q(kind: str, seed: int, center: bool) -> None:
    policy = make_policy(kind, seed, center)
    features, weights, mask = random_parts(16, seed)
    actions = torch.rand(16, M + 1, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    perm = torch.randperm(M, generator=torch.Generator().manual_seed(seed + 10))
    obs = flat(features, weights, mask)
    obs_p = flat(features[:, perm], permute_slots(weights, perm), permute_slots(mask, perm))
    with torch.no_grad():
        action, action_p = actor_action(policy, obs), actor_action(policy, obs_p)
        q = policy.critic(obs, actions)
        q_p = policy.critic(obs_p, permute_slots(actions, perm))
    assert not torch.allclose(action[:, 1:], action[:, 1:].mean(dim=1, keepdim=True))
    torch.testing.assert_close(action_p, permute_slots(action, perm), rtol=0, atol=0)
    assert isinstance(policy.critic, SharedCritic)
    assert isinstance(policy.critic_target, SharedCritic)
    assert len(q) == 2
    for one, one_p in zip(q, q_p, strict=True):
        torch.testing.assert_close(one_p, one, rtol=0, atol=0)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_slot_order_sums_agree_to_rounding_and_end_with_their_block(kind: str) -> None:
    """Gradient steps sum in slot order (no sort); the answer moves by rounding only, and the
    sorted, bit-exact sums are back once the block ends, even when it ends by an error."""
    policy = make_policy(kind, seed=4, center=True)
    features, weights, mask = random_parts(16, seed=4)
    obs = flat(features, weights, mask)
    actions = torch.rand(16, M + 1, generator=torch.Generator().manual_seed(4)) * 2 - 1
    fast: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = []

    def fail_inside() -> None:
        with slot_order_sums():
            fast.append((actor_action(policy, obs), policy.critic(obs, actions)))
            raise RuntimeError("inside")

    with torch.no_grad():
        exact_action, exact_q = actor_action(policy, obs), policy.critic(obs, actions)
        with pytest.raises(RuntimeError, match="inside"):
            fail_inside()
        after_action, after_q = actor_action(policy, obs), policy.critic(obs, actions)
    fast_action, fast_q = fast[0]
    torch.testing.assert_close(fast_action, exact_action, rtol=1e-5, atol=1e-6)
    for fast, exact, after in zip(fast_q, exact_q, after_q, strict=True):
        torch.testing.assert_close(fast, exact, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(after, exact, rtol=0, atol=0)
    torch.testing.assert_close(after_action, exact_action, rtol=0, atol=0)
    h = torch.randn(8, M, 5, generator=torch.Generator().manual_seed(5))
    live = torch.ones(8, M, dtype=torch.bool)
    with slot_order_sums():
        pooled = masked_mean_max(h, live)
    torch.testing.assert_close(pooled[:, :5], h.sum(dim=1) / M, rtol=0, atol=0)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_critic_depends_on_live_actions(kind: str) -> None:
    """Invariance must not come from ignoring the actions altogether."""
    policy = make_policy(kind)
    features, weights, mask = random_parts(8, seed=3)
    obs = flat(features, weights, mask)
    actions = torch.zeros(8, M + 1)
    moved = actions.clone()
    moved[:, 1] = 0.9  # slot 1 is live in every row
    with torch.no_grad():
        assert not torch.allclose(
            policy.critic.q1_forward(obs, actions), policy.critic.q1_forward(obs, moved)
        )


# --- masking --------------------------------------------------------------------------------


@pytest.mark.parametrize("center", [False, True], ids=["raw", "centered"])
@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_masked_slots_have_no_influence(kind: str, center: bool) -> None:
    policy = make_policy(kind, center=center)
    features, weights, mask = random_parts(32, seed=4)
    actions = torch.rand(32, M + 1, generator=torch.Generator().manual_seed(4)) * 2 - 1
    dead = mask == 0
    assert dead.any()
    noisy_features = features.clone()
    noisy_features[dead[:, 1:]] = torch.randn(int(dead.sum()), F) * 50
    noisy_features[:, -1][dead[:, -1]] = float("nan")
    noisy_weights = torch.where(dead, torch.full_like(weights, 0.7), weights)
    noisy_actions = torch.where(dead, torch.full_like(actions, -0.8), actions)
    obs, noisy = flat(features, weights, mask), flat(noisy_features, noisy_weights, mask)
    with torch.no_grad():
        action, action_n = actor_action(policy, obs), actor_action(policy, noisy)
        q, q_n = policy.critic(obs, actions), policy.critic(noisy, noisy_actions)
    assert torch.equal(action, action_n)
    assert torch.all(action[dead] == 0)
    for one, one_n in zip(q, q_n, strict=True):
        assert torch.equal(one, one_n)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_centered_scores_cannot_push_every_asset_to_one_side(kind: str) -> None:
    """Centred, the live assets' pre-tanh scores average zero in every row, however large the
    common shift the network computes (here: a huge bias on the score head), so no row has
    every live asset's action above zero; uncentred, the same network saturates them all.
    SAC's log std is left alone. Cash is not an asset and is not centred."""
    features, weights, mask = random_parts(64, seed=5)
    live = mask[:, 1:] > 0.5
    outputs = {}
    for center in (False, True):
        policy = make_policy(kind, seed=5, center=center)
        with torch.no_grad():
            head = policy.actor.net.rho[-1]
            head.bias[0] += 30.0
            outputs[center] = policy.actor.net(features, weights, mask)
            outputs[(center, "action")] = actor_action(policy, flat(features, weights, mask))
    raw, cen = outputs[False], outputs[True]
    score = cen[:, 1:, 0]
    mean = torch.where(live, score, 0).sum(dim=1) / live.sum(dim=1)
    torch.testing.assert_close(mean, torch.zeros_like(mean), rtol=0, atol=1e-5)
    assert torch.all(torch.where(live, outputs[(True, "action")][:, 1:], -1).amin(dim=1) <= 0)
    assert torch.all(torch.where(live, outputs[(False, "action")][:, 1:], 1) > 0.99)
    torch.testing.assert_close(cen[:, :1], raw[:, :1], rtol=0, atol=0)  # cash as it was
    if kind == "sac":
        torch.testing.assert_close(cen[..., 1], raw[..., 1], rtol=0, atol=0)  # log std too


def test_sac_samples_are_zero_on_masked_slots_and_log_prob_counts_live_ones() -> None:
    policy = make_policy("sac")
    actor = policy.actor
    assert isinstance(actor, SharedSACActor)
    features, weights, mask = random_parts(8, seed=5)
    obs = flat(features, weights, mask)
    with torch.no_grad():
        torch.manual_seed(0)
        actions, log_prob = actor.action_log_prob(obs)
        mean, log_std, _ = actor.get_action_dist_params(obs)
        torch.manual_seed(0)
        u = mean + log_std.exp() * torch.randn_like(mean)
    assert torch.all(actions[mask == 0] == 0)
    assert log_prob.shape == (8,)
    for row in range(8):
        live = mask[row] > 0
        dist = SquashedDiagGaussianDistribution(int(live.sum()))
        dist.proba_distribution(mean[row, live][None], log_std[row, live][None])
        expected = dist.log_prob(torch.tanh(u[row, live])[None], u[row, live][None])
        torch.testing.assert_close(log_prob[row : row + 1], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_fresh_actor_starts_near_zero_action(kind: str) -> None:
    """Small output layers: under the tilt mapping an untrained policy holds the anchor."""
    policy = make_policy(kind)
    with torch.no_grad():
        action = actor_action(policy, flat(*random_parts(64, seed=6)))
    assert action.abs().max() < 0.05


# --- SB3 training, set sizes, save/load ----------------------------------------------------


ENV6 = EnvConfig(max_assets=6, window=5, episode_length=40, min_assets=3)
MARKET6 = random_walk_market(n_assets=6)


def train_shared(kind: str, steps: int = 300, **kwargs: object) -> SmoothTD3 | SmoothSAC:
    options = tiny_model_options(
        0, 32, policy_kwargs={"n_features": ENV6.window, "hidden": 16}, **kwargs
    )
    model = ALGORITHMS[kind](POLICIES[kind], PortfolioEnv(MARKET6, ENV6), **options)
    model.learn(steps)
    return model


@pytest.fixture(scope="module")
def trained() -> dict[str, SmoothTD3 | SmoothSAC]:
    icm = ICMSettings(enabled=True, feature_dim=8, hidden_dim=16, warmup_steps=0)
    smooth = SmoothnessSettings(mode=SmoothMode.ADAPTIVE, lam=0.5)
    return {
        "td3": train_shared("td3", icm=icm, smoothness=smooth, policy_delay=2),
        "sac": train_shared("sac", icm=icm),
    }


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_learns_with_smoothness_target_noise_and_icm(
    kind: str, trained: dict[str, SmoothTD3 | SmoothSAC]
) -> None:
    model = trained[kind]
    fresh = ALGORITHMS[kind](
        POLICIES[kind],
        PortfolioEnv(MARKET6, ENV6),
        **tiny_model_options(0, 32, policy_kwargs={"n_features": ENV6.window, "hidden": 16}),
    )
    assert isinstance(model.policy, POLICIES[kind])
    assert model._n_updates > 100
    moved = [
        not torch.equal(a, b)
        for a, b in zip(model.policy.parameters(), fresh.policy.parameters(), strict=True)
    ]
    assert all(moved)
    assert model.icm is not None
    assert model.icm.last_stats
    logged = model.logger.name_to_value
    if kind == "td3":
        assert "train/action_change" in logged
        assert "train/actor_loss" in logged
    env = PortfolioEnv(MARKET6, ENV6)
    obs, _ = env.reset(seed=1)
    for _ in range(5):
        action, _ = model.predict(obs, deterministic=True)
        assert np.all(np.isfinite(action))
        assert np.all(np.abs(action) <= 1)
        assert np.all(action[1:][obs[-ENV6.max_assets :] == 0] == 0)
        obs, *_ = env.step(action)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_trained_on_six_slots_acts_on_twelve_assets(
    kind: str, trained: dict[str, SmoothTD3 | SmoothSAC]
) -> None:
    actor = trained[kind].policy.actor
    assert isinstance(actor, SharedTD3Actor | SharedSACActor)
    features, weights, mask = random_parts(10, seed=7, n_assets=12, n_features=ENV6.window)
    with torch.no_grad():
        action = actor.forward_sets(features, weights, mask)
        six = random_parts(10, seed=8, n_assets=6, n_features=ENV6.window)
        torch.testing.assert_close(
            actor.forward_sets(*six), actor_action(trained[kind].policy, flat(*six))
        )
    assert action.shape == (10, 13)
    assert torch.isfinite(action).all()
    assert torch.all(action[mask == 0] == 0)
    assert torch.all(action.abs() <= 1)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_save_load_round_trip_gives_same_actions(
    kind: str, trained: dict[str, SmoothTD3 | SmoothSAC], tmp_path: Path
) -> None:
    model = trained[kind]
    model.save(tmp_path / "model.zip")
    loaded = ALGORITHMS[kind].load(tmp_path / "model.zip", device="cpu")
    assert type(loaded.policy) is POLICIES[kind]
    obs = flat(*random_parts(20, seed=9, n_features=ENV6.window)).numpy()
    expected, _ = model.predict(obs, deterministic=True)
    got, _ = loaded.predict(obs, deterministic=True)
    np.testing.assert_array_equal(got, expected)
    with torch.no_grad():
        tensor = torch.as_tensor(obs)
        actions = torch.as_tensor(expected)
        for a, b in zip(loaded.critic(tensor, actions), model.critic(tensor, actions), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_centering_is_saved_with_the_policy_and_absent_means_off(kind: str, tmp_path: Path) -> None:
    """A centred policy loads centred; one saved before the option existed (no
    ``center_assets`` in its constructor parameters) loads uncentred, as it was trained."""
    policy = make_policy(kind, seed=6, center=True)
    obs = flat(*random_parts(12, seed=6))
    policy.save(str(tmp_path / "policy.pt"))
    loaded = POLICIES[kind].load(str(tmp_path / "policy.pt"), device="cpu")
    assert loaded.actor.net.center_assets
    with torch.no_grad():
        assert torch.equal(actor_action(loaded, obs), actor_action(policy, obs))
    saved = torch.load(tmp_path / "policy.pt", weights_only=False)
    del saved["data"]["center_assets"]
    torch.save(saved, tmp_path / "old.pt")
    old = POLICIES[kind].load(str(tmp_path / "old.pt"), device="cpu")
    assert not old.actor.net.center_assets
    with torch.no_grad():
        assert not torch.equal(actor_action(old, obs), actor_action(policy, obs))


# --- batched critics and the training shortcuts ---------------------------------------------


def reference_q(q_net: SharedQNet, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """One critic evaluated alone, densely, as the plain formula reads (masked rows zeroed)."""
    features, weights, mask = ObservationLayout(M, F).split(obs)
    live = mask[:, 1:] > 0.5
    rows = torch.cat([features, weights[:, 1:, None], actions[:, 1:, None]], dim=-1)
    g = q_net.encoder(torch.where(live[..., None], rows, 0.0))
    count = live.sum(dim=1, keepdim=True).clamp(min=1)
    mean = torch.where(live[..., None], g, 0.0).sum(dim=1) / count
    top = torch.where(live[..., None], g, float("-inf")).amax(dim=1)
    n_live = torch.log1p(live.sum(dim=1, keepdim=True).float())
    return q_net.head(torch.cat([mean, top, weights[:, :1], actions[:, :1], n_live], dim=-1))


@pytest.mark.parametrize("training", [False, True], ids=["exact", "slot_order"])
@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_batched_critics_equal_independent_critics(kind: str, training: bool) -> None:
    """The critics evaluated together give each critic's own Q and the same gradients (for its
    own weights and for the actions) as evaluating it alone; NaN on masked slots stays out."""
    policy = make_policy(kind, seed=7)
    critic = policy.critic
    features, weights, mask = random_parts(24, seed=7)
    features[:, 1:][mask[:, 2:] == 0] = float("nan")
    obs = flat(features, weights, mask)
    actions = torch.rand(24, M + 1, generator=torch.Generator().manual_seed(7)) * 2 - 1
    seed = torch.Generator().manual_seed(8)
    upstream = [torch.randn(24, 1, generator=seed) for _ in critic.q_networks]

    def grads(qs: list[torch.Tensor], act: torch.Tensor) -> list[torch.Tensor]:
        loss = sum((q * u).sum() for q, u in zip(qs, upstream, strict=True))
        return list(torch.autograd.grad(loss, [*critic.parameters(), act]))

    act_a = actions.clone().requires_grad_(True)
    act_b = actions.clone().requires_grad_(True)
    with slot_order_sums() if training else contextlib.nullcontext():
        batched = list(critic(obs, act_a))
        alone = [reference_q(q, obs, act_b) for q in critic.q_networks]
        first = critic.q1_forward(obs, actions)
    assert len(batched) == 2
    for b, a in zip(batched, alone, strict=True):
        assert b.shape == (24, 1)
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(first, alone[0].detach(), rtol=1e-5, atol=1e-6)
    for gb, ga in zip(grads(batched, act_a), grads(alone, act_b), strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-6)


def test_critic_keeps_one_module_per_critic_in_its_saved_layout() -> None:
    """Batching does not touch what is saved: each critic's weights stay under ``qf<i>.``, so
    models saved before load unchanged (and so do their optimizer states)."""
    policy = make_policy("td3", seed=3)
    single = SharedQNet(F, HIDDEN)
    expected = {f"qf{i}.{key}" for i in range(2) for key in single.state_dict()}
    assert set(policy.critic.state_dict()) == expected
    torch.manual_seed(11)
    independent = [SharedQNet(F, HIDDEN) for _ in range(2)]
    state = {f"qf{i}.{k}": v for i, q in enumerate(independent) for k, v in q.state_dict().items()}
    policy.critic.load_state_dict(state)
    features, weights, mask = random_parts(8, seed=3)
    obs = flat(features, weights, mask)
    actions = torch.rand(8, M + 1, generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        for got, q in zip(policy.critic(obs, actions), independent, strict=True):
            torch.testing.assert_close(got, reference_q(q, obs, actions), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_live_rows_shortcut_keeps_symmetry_masking_and_gradients(kind: str) -> None:
    """Inside ``slot_order_sums`` the networks run on live rows only: a permutation still
    permutes actions and keeps Q (to rounding: sums run in slot order), masked slots (NaN
    included) still change nothing, and the actor's gradients match the exact path's."""
    policy = make_policy(kind, seed=9, center=True)
    features, weights, mask = random_parts(32, seed=9)
    actions = torch.rand(32, M + 1, generator=torch.Generator().manual_seed(9)) * 2 - 1
    perm = torch.randperm(M, generator=torch.Generator().manual_seed(19))
    obs = flat(features, weights, mask)
    obs_p = flat(features[:, perm], permute_slots(weights, perm), permute_slots(mask, perm))
    dead = mask == 0
    noisy_features = features.clone()
    noisy_features[dead[:, 1:]] = float("nan")
    noisy = flat(noisy_features, torch.where(dead, 0.7, weights), mask)
    with torch.no_grad(), slot_order_sums():
        action, action_p = actor_action(policy, obs), actor_action(policy, obs_p)
        action_n = actor_action(policy, noisy)
        q, q_p = policy.critic(obs, actions), policy.critic(obs_p, permute_slots(actions, perm))
        q_n = policy.critic(noisy, torch.where(dead, -0.8, actions))
    torch.testing.assert_close(action_p, permute_slots(action, perm), rtol=1e-5, atol=1e-6)
    assert torch.equal(action_n, action)
    assert torch.all(action[dead] == 0)
    for one, one_p, one_n in zip(q, q_p, q_n, strict=True):
        torch.testing.assert_close(one_p, one, rtol=1e-5, atol=1e-6)
        assert torch.equal(one_n, one)

    def actor_grads() -> list[torch.Tensor]:
        out = actor_action(policy, obs) if kind == "td3" else policy.actor.scores(obs)[0]
        weights_out = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        return list(torch.autograd.grad((out * weights_out).sum(), policy.actor.parameters()))

    exact = actor_grads()
    with slot_order_sums():
        fast = actor_grads()
    for a, b in zip(fast, exact, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
