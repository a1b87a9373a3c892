"""``SmoothTD3``: SB3's TD3 with two learning rates, Huber critics, clipping and a smoothness
term; SB3 keeps the rollout loop, only ``train()`` is overridden."""

from __future__ import annotations

from typing import Any

import torch as th
import torch.nn.functional as F
from stable_baselines3 import TD3
from stable_baselines3.common.policies import BaseModel
from stable_baselines3.common.type_aliases import ReplayBufferSamples, Schedule
from stable_baselines3.common.utils import polyak_update

from allocator.trainer.agents.icm import ICMSettings
from allocator.trainer.agents.off_policy import SmoothOffPolicy
from allocator.trainer.agents.regularizer import (
    ActionBoundSettings,
    SmoothnessLambda,
    SmoothnessSettings,
    bound_penalty,
    split_change,
)
from allocator.trainer.agents.shared_networks import slot_order_sums
from allocator.trainer.agents.shared_policies import SharedTD3Actor


def critic_loss(
    current_qs: tuple[th.Tensor, ...], target: th.Tensor, kind: str = "huber", delta: float = 1.0
) -> th.Tensor:
    """Sum over the twin critics of the Huber (robust to reward spikes) or MSE loss."""
    if kind == "huber":
        return sum(F.huber_loss(q, target, delta=delta) for q in current_qs)  # type: ignore[return-value]
    if kind == "mse":
        return sum(F.mse_loss(q, target) for q in current_qs)  # type: ignore[return-value]
    raise ValueError(f"critic_loss must be 'huber' or 'mse', got {kind!r}")


def target_policy_noise(actions: th.Tensor, sigma: float, clip: float) -> th.Tensor:
    """Fresh Gaussian noise of the actions' shape (one draw per batch would shift every
    target alike), clipped to ``[-clip, clip]``."""
    return th.randn_like(actions).mul_(sigma).clamp_(-clip, clip)


def actor_scores(actor: th.nn.Module, obs: th.Tensor) -> th.Tensor:
    """The deterministic actor's pre-tanh scores: ``tanh`` of them is ``actor(obs)``."""
    if isinstance(actor, SharedTD3Actor):
        return actor.scores(obs)[0][..., 0]  # masked slots score 0
    # SB3's TD3 Actor: ``mu`` is the MLP with its final Tanh.
    features = actor.extract_features(obs, actor.features_extractor)  # type: ignore[operator]
    return actor.mu[:-1](features)  # type: ignore[index, operator]


def clip_and_step(net: BaseModel, max_norm: float | None, norms: list[th.Tensor]) -> None:
    """Clip ``net``'s gradient norm (if set: its pre-clip value, a tensor for no device sync,
    joins ``norms``) and step its optimizer."""
    if max_norm:
        norms.append(th.nn.utils.clip_grad_norm_(net.parameters(), max_norm))
    net.optimizer.step()


TRAIN_FIGURES = (
    "critic_loss",
    "actor_loss",
    "smooth_penalty",
    "action_change",
    "critic_grad_norm",
    "actor_grad_norm",
    "bound_penalty",
)
"""What ``SmoothTD3.train`` logs under ``train/``, averaged over the call's gradient steps."""


class SmoothTD3(SmoothOffPolicy, TD3):
    """TD3 with Huber critics, two learning rates, gradient clipping and a smoothness term."""

    def __init__(
        self,
        policy: Any,
        env: Any,
        actor_learning_rate: float | Schedule = 1e-4,
        critic_learning_rate: float | Schedule = 1e-3,
        critic_loss: str = "huber",
        huber_delta: float = 1.0,
        max_grad_norm: float | None = 1.0,
        smoothness: SmoothnessSettings | None = None,
        action_bound: ActionBoundSettings | None = None,
        icm: ICMSettings | None = None,
        **kwargs: Any,
    ) -> None:
        self.critic_loss_kind = critic_loss
        self.huber_delta = huber_delta
        self.max_grad_norm = max_grad_norm
        self.smoothness = smoothness or SmoothnessSettings()
        self.lam = SmoothnessLambda(self.smoothness)
        self.action_bound = action_bound or ActionBoundSettings()
        super().__init__(policy, env, actor_learning_rate, critic_learning_rate, icm, **kwargs)

    @property
    def smooth_lambda(self) -> float:
        return self.lam.value

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """``gradient_steps`` TD3 updates: critics every step, actor, lambda and targets every
        ``policy_delay``-th step; the figures are logged once, averaged."""
        self.policy.set_training_mode(True)
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])
        logs: dict[str, list[th.Tensor]] = {k: [] for k in TRAIN_FIGURES}
        with slot_order_sums():
            for _ in range(gradient_steps):
                self._n_updates += 1
                batch = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)  # type: ignore[union-attr]
                self._critic_step(batch, self._td3_target(batch), logs)
                if self._n_updates % self.policy_delay == 0:
                    self._actor_step(batch, logs)
                    self._update_targets()
        self._record(logs)

    def _td3_target(self, batch: ReplayBufferSamples) -> th.Tensor:
        """Clipped double-Q target with smoothed target actions: r + (1 - done) * gamma *
        min_i Q'_i(s', clip(pi'(s') + clip(noise)))."""
        discounts = batch.discounts if batch.discounts is not None else self.gamma
        with th.no_grad():
            noise = target_policy_noise(
                batch.actions, self.target_policy_noise, self.target_noise_clip
            )
            next_actions = (self.actor_target(batch.next_observations) + noise).clamp(-1, 1)
            next_q = th.cat(self.critic_target(batch.next_observations, next_actions), dim=1)
            next_q, _ = th.min(next_q, dim=1, keepdim=True)
            return batch.rewards + (1 - batch.dones) * discounts * next_q

    def _critic_step(
        self, batch: ReplayBufferSamples, target_q: th.Tensor, logs: dict[str, list[th.Tensor]]
    ) -> None:
        """Both critics regress on the target (Huber resists reward spikes)."""
        current_qs = self.critic(batch.observations, batch.actions)
        loss_c = critic_loss(current_qs, target_q, self.critic_loss_kind, self.huber_delta)
        self.critic.optimizer.zero_grad()
        loss_c.backward()
        clip_and_step(self.critic, self.max_grad_norm, logs["critic_grad_norm"])
        logs["critic_loss"].append(loss_c.detach())

    def _actor_step(self, batch: ReplayBufferSamples, logs: dict[str, list[th.Tensor]]) -> None:
        """Maximize Q1, minus lambda * E||pi(s') - pi(s)||^2 and the bound penalty; then the
        dual-ascent step on lambda with the batch's measured E[C] (one device sync per step)."""
        actions, change, bound = self._actor_outputs(batch)
        self.critic.requires_grad_(False)  # its gradients here would be discarded
        try:
            loss_a = -self.critic.q1_forward(batch.observations, actions).mean()
            if change is not None:
                mean_change = change.mean()
                penalty = self.lam.value * mean_change
                loss_a = loss_a + penalty
                logs["smooth_penalty"].append(penalty.detach())
                logs["action_change"].append(mean_change.detach())
            if bound is not None:
                loss_a = loss_a + bound
                logs["bound_penalty"].append(bound.detach())
            self.actor.optimizer.zero_grad()
            loss_a.backward()
        finally:
            self.critic.requires_grad_(True)
        clip_and_step(self.actor, self.max_grad_norm, logs["actor_grad_norm"])
        logs["actor_loss"].append(loss_a.detach())
        if change is not None:
            self.lam.update(float(mean_change.item()))

    def _actor_outputs(
        self, batch: ReplayBufferSamples
    ) -> tuple[th.Tensor, th.Tensor | None, th.Tensor | None]:
        """``pi(s)``, the smoothness term's per-sample change (when on) and the bound penalty
        (when on), from one actor pass (over ``[s; s']`` when smoothness needs ``pi(s')``)."""
        obs = batch.observations
        if self.lam.active:
            obs = th.cat([obs, batch.next_observations])
        bound = None
        if self.action_bound.active:
            scores = actor_scores(self.actor, obs)
            out, bound = th.tanh(scores), bound_penalty(scores, self.action_bound)
        else:
            out = self.actor(obs)
        return (*split_change(out), bound) if self.lam.active else (out, None, bound)

    def _update_targets(self) -> None:
        """Targets track the online networks by SB3's ``polyak_update``, not a fused lerp,
        which rounds differently and would move a seeded run's figures."""
        polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
        polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.tau)
        polyak_update(self.critic_batch_norm_stats, self.critic_batch_norm_stats_target, 1.0)
        polyak_update(self.actor_batch_norm_stats, self.actor_batch_norm_stats_target, 1.0)

    def _record(self, logs: dict[str, list[th.Tensor]]) -> None:
        """Each figure's mean over this call's steps, lambda, and the ICM's losses."""
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        for key, values in logs.items():
            if values:
                self.logger.record(f"train/{key}", float(th.stack(values).mean().item()))
        self.logger.record("train/smooth_lambda", self.lam.value)
        self._log_curiosity()
