"""SB3 policies whose actor and twin critics are the per-asset shared networks: only
``make_actor`` and ``make_critic`` change, so SB3's optimizers, targets and save/load still work.
SAC's log-probability counts live slots only: the entropy bonus is about choices that matter."""

from __future__ import annotations

from typing import Any

import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BaseModel, BasePolicy
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from stable_baselines3.sac.policies import LOG_STD_MAX, LOG_STD_MIN, SACPolicy
from stable_baselines3.td3.policies import TD3Policy
from torch import nn

from allocator.trainer.agents.shared_networks import (
    ObservationLayout,
    SharedActorNet,
    SharedQNet,
    slot_live,
    stacked_q,
)

SQUASH_EPS = 1e-6
"""Added inside ``log(1 - tanh(u)^2)`` (as SB3's squashed Gaussian does) so a saturated action
does not give an infinite log-probability."""


class SharedActorBase(BasePolicy):
    """The shared actor network behind SB3's actor interface (flat observation in, action out)."""

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Box,
        n_features: int,
        hidden: int = 64,
        activation_fn: type[nn.Module] = nn.ReLU,
        normalize_images: bool = True,
        n_outputs: int = 1,
        center_assets: bool = False,
    ) -> None:
        super().__init__(
            observation_space, action_space, normalize_images=normalize_images, squash_output=True
        )
        self.layout = ObservationLayout.from_spaces(observation_space, action_space, n_features)
        self.n_features = n_features
        self.hidden = hidden
        self.activation_fn = activation_fn
        self.center_assets = center_assets
        self.net = SharedActorNet(n_features, hidden, n_outputs, activation_fn, center_assets)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            n_features=self.n_features,
            hidden=self.hidden,
            activation_fn=self.activation_fn,
            center_assets=self.center_assets,
        )
        return data

    def scores(self, obs: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """Raw per-slot outputs (B, M + 1, n_outputs) of a flat batch, and its live slots."""
        features, weights, mask = self.layout.split(obs)
        return self.net(features, weights, mask), slot_live(mask)

    def forward_sets(self, features: th.Tensor, weights: th.Tensor, mask: th.Tensor) -> th.Tensor:
        """Deterministic action ``tanh(score)`` (B, N + 1) for any number of assets N."""
        return th.tanh(self.net(features, weights, mask)[..., 0])


class SharedTD3Actor(SharedActorBase):
    """Deterministic actor: ``tanh(score)`` per slot, 0 on masked slots."""

    def forward(self, obs: th.Tensor) -> th.Tensor:
        return self.forward_sets(*self.layout.split(obs))

    def _predict(self, observation: PyTorchObs, deterministic: bool = False) -> th.Tensor:
        return self(observation)


class SharedSACActor(SharedActorBase):
    """Squashed-Gaussian actor: per-slot mean and log std from the shared trunk (no gSDE)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "n_outputs": 2})

    def get_action_dist_params(
        self, obs: PyTorchObs
    ) -> tuple[th.Tensor, th.Tensor, dict[str, th.Tensor]]:
        """Pre-squash mean and clamped log std, (B, M + 1) each (0 on masked slots)."""
        out, _ = self.scores(obs)  # type: ignore[arg-type]
        return out[..., 0], out[..., 1].clamp(LOG_STD_MIN, LOG_STD_MAX), {}

    def _sample(self, obs: th.Tensor, deterministic: bool) -> tuple[th.Tensor, th.Tensor]:
        """Actions (masked slots 0) and the log-probability summed over live slots, (B,)."""
        out, live = self.scores(obs)
        mean, log_std = out[..., 0], out[..., 1].clamp(LOG_STD_MIN, LOG_STD_MAX)
        std = log_std.exp()
        u = mean if deterministic else mean + std * th.randn_like(mean)
        actions = th.tanh(u)
        log_prob = th.distributions.Normal(mean, std).log_prob(u)
        log_prob = log_prob - th.log(1 - actions.pow(2) + SQUASH_EPS)
        zeros = th.zeros_like(actions)
        return th.where(live, actions, zeros), th.where(live, log_prob, zeros).sum(dim=-1)

    def forward(self, obs: th.Tensor, deterministic: bool = False) -> th.Tensor:
        return self._sample(obs, deterministic)[0]

    def action_log_prob(self, obs: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """A reparametrized sample and its log-probability (B,), as SB3's SAC expects."""
        return self._sample(obs, deterministic=False)

    def _predict(self, observation: PyTorchObs, deterministic: bool = False) -> th.Tensor:
        return self(observation, deterministic)


class SharedCritic(BaseModel):
    """``n_critics`` ``SharedQNet``s (``qf0``, ``qf1``: the saved layout) behind SB3's
    ``ContinuousCritic`` interface, evaluated together."""

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Box,
        n_features: int,
        hidden: int = 64,
        activation_fn: type[nn.Module] = nn.ReLU,
        normalize_images: bool = True,
        n_critics: int = 2,
    ) -> None:
        super().__init__(observation_space, action_space, normalize_images=normalize_images)
        self.layout = ObservationLayout.from_spaces(observation_space, action_space, n_features)
        self.n_critics = n_critics
        self.q_networks = [SharedQNet(n_features, hidden, activation_fn) for _ in range(n_critics)]
        for idx, q_net in enumerate(self.q_networks):
            self.add_module(f"qf{idx}", q_net)

    def forward(self, obs: th.Tensor, actions: th.Tensor) -> tuple[th.Tensor, ...]:
        return tuple(stacked_q(self.q_networks, *self.layout.split(obs), actions).unbind(0))

    def q1_forward(self, obs: th.Tensor, actions: th.Tensor) -> th.Tensor:
        """The first critic only (TD3's actor loss needs no more)."""
        return self.q_networks[0](*self.layout.split(obs), actions)


class SharedPolicyMixin(BasePolicy):
    """What both shared policies add to SB3's: the set-network sizes and their two builders."""

    actor_class: type[SharedTD3Actor | SharedSACActor]
    net_args: dict[str, Any]
    critic_kwargs: dict[str, Any]
    actor: nn.Module
    critic: nn.Module

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Box,
        lr_schedule: Schedule,
        n_features: int,
        hidden: int = 64,
        center_assets: bool = False,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("use_sde"):
            raise ValueError("the shared policies do not support gSDE (use_sde)")
        if kwargs.get("share_features_extractor"):
            raise ValueError("the shared policy has no features extractor to share")
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        self.n_features = int(n_features)
        self.hidden = int(hidden)
        self.center_assets = bool(center_assets)
        if (
            not kwargs.get("optimizer_kwargs")
            and kwargs.get("optimizer_class", th.optim.Adam) is th.optim.Adam
        ):
            kwargs["optimizer_kwargs"] = {"fused": True}  # one kernel per parameter on CPU
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    def _net_kwargs(self) -> dict[str, Any]:
        return {
            "observation_space": self.observation_space,
            "action_space": self.action_space,
            "n_features": self.n_features,
            "hidden": self.hidden,
            "activation_fn": self.net_args["activation_fn"],
            "normalize_images": self.normalize_images,
        }

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            n_features=self.n_features, hidden=self.hidden, center_assets=self.center_assets
        )
        return data

    def set_training_mode(self, mode: bool) -> None:
        """A no-op call returns at once: SB3 walks every module twice per env step."""
        actor, critic = self.actor, self.critic
        if mode == self.training == actor.training == critic.training:
            return
        super().set_training_mode(mode)

    def make_actor(self, features_extractor: Any = None) -> SharedTD3Actor | SharedSACActor:
        actor = self.actor_class(**self._net_kwargs(), center_assets=self.center_assets)
        return actor.to(self.device)

    def make_critic(self, features_extractor: Any = None) -> SharedCritic:
        critic = SharedCritic(**self._net_kwargs(), n_critics=self.critic_kwargs["n_critics"])
        return critic.to(self.device)


class SharedTD3Policy(SharedPolicyMixin, TD3Policy):  # type: ignore[misc]
    """TD3 policy with the per-asset shared actor and twin critics."""

    actor_class = SharedTD3Actor


class SharedSACPolicy(SharedPolicyMixin, SACPolicy):  # type: ignore[misc]
    """SAC policy with the per-asset shared actor and twin critics."""

    actor_class = SharedSACActor
