"""Intrinsic Curiosity Module (Pathak et al. 2017): the forward model's error predicting
``phi(s')``, normalized, is a novelty bonus on each replay batch's reward. It owns its optimizer
and detaches every input, so its losses never reach the actor or the critics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from torch import nn

from allocator.typed_config import StrictModel

NORM_EPS = 1e-8  # added to the running variance before the square root


class ICMSettings(StrictModel):
    """Knobs of the curiosity bonus; disabled by default so plain TD3/SAC is unchanged."""

    enabled: bool = Field(False, description="add the ICM to TD3/SAC training")
    feature_dim: int = Field(64, ge=1, description="size of the learned features phi(s)")
    hidden_dim: int = Field(128, ge=1, description="hidden width of encoder, inverse, forward")
    learning_rate: float = Field(1e-3, gt=0, description="Adam step size of the ICM's optimizer")
    beta: float = Field(0.2, ge=0, le=1, description="loss = (1 - beta) * inverse + beta * forward")
    eta: float = Field(1.0, gt=0, description="scale of the raw forward error")
    extrinsic_weight: float = Field(1.0, ge=0, description="weight of the environment reward")
    intrinsic_weight: float = Field(
        0.01, ge=0, description="weight of the curiosity bonus; 0 = monitor novelty only"
    )
    clip: float = Field(5.0, gt=0, description="normalized bonus clipped to +-clip")
    warmup_steps: int = Field(
        1000, ge=0, description="timesteps before the bonus enters the reward"
    )
    max_grad_norm: float = Field(1.0, gt=0, description="gradient norm clip of an ICM update")
    update_every: int = Field(
        1,
        ge=1,
        description="train the ICM on every k-th replay batch (it costs ~45% of a TD3 step)",
    )


def _mlp(in_dim: int, hidden_dim: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.ELU(), nn.Linear(hidden_dim, out_dim))


class CuriosityNet(nn.Module):
    """Encoder, inverse and forward models plus the raw error's running statistics: float64
    buffers (exact over millions of samples) that travel with the state_dict and into ONNX."""

    reward_mean: torch.Tensor
    reward_var: torch.Tensor
    reward_count: torch.Tensor

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        feature_dim: int = 64,
        hidden_dim: int = 128,
        eta: float = 1.0,
        clip: float = 5.0,
    ) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.eta = float(eta)
        self.clip = float(clip)
        self.encoder = _mlp(obs_dim, hidden_dim, feature_dim)
        # tanh: the policies' actions live in [-1, 1].
        self.inverse_model = nn.Sequential(_mlp(2 * feature_dim, hidden_dim, action_dim), nn.Tanh())
        self.forward_model = _mlp(feature_dim + action_dim, hidden_dim, feature_dim)
        # Before any statistics (count 0) the raw error passes through unnormalized.
        self.register_buffer("reward_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("reward_var", torch.ones((), dtype=torch.float64))
        self.register_buffer("reward_count", torch.zeros((), dtype=torch.float64))

    def predict_features(self, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Forward model: ``phi(s')`` predicted from ``phi(s)`` and the action."""
        return self.forward_model(torch.cat([features, action], dim=-1))

    def raw_error(
        self, obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor
    ) -> torch.Tensor:
        """``eta * 0.5 * ||f(phi(s), a) - phi(s')||^2`` summed over features, shape (B, 1)."""
        predicted = self.predict_features(self.encoder(obs), action)
        error = 0.5 * (predicted - self.encoder(next_obs)).pow(2).sum(dim=-1, keepdim=True)
        return self.eta * error

    def normalize(self, raw: torch.Tensor) -> torch.Tensor:
        """``(raw - mean) / sqrt(var + eps)`` with the stored statistics, clipped to +-clip."""
        mean = self.reward_mean.to(raw.dtype)
        std = torch.sqrt(self.reward_var + NORM_EPS).to(raw.dtype)
        return torch.clamp((raw - mean) / std, -self.clip, self.clip)

    def forward(
        self, obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor
    ) -> torch.Tensor:
        """Normalized, clipped intrinsic reward (B, 1); reads the statistics, never updates
        them; no data-dependent branches, so it traces for ONNX."""
        return self.normalize(self.raw_error(obs, action, next_obs))

    @torch.no_grad()
    def update_statistics(self, raw: torch.Tensor) -> None:
        """Fold a batch into the running mean/var: equal to numpy's over every error seen."""
        batch = raw.detach().reshape(-1).to(torch.float64)
        batch_count = float(batch.numel())
        if batch_count == 0:
            return
        batch_mean = batch.mean()
        batch_var = batch.var(unbiased=False)
        count = self.reward_count
        total = count + batch_count
        delta = batch_mean - self.reward_mean
        m2 = (
            self.reward_var * count
            + batch_var * batch_count
            + delta**2 * count * batch_count / total
        )
        self.reward_mean.add_(delta * batch_count / total)
        self.reward_var.copy_(m2 / total)
        self.reward_count.copy_(total)


class IntrinsicCuriosity:
    """A ``CuriosityNet`` with its own Adam optimizer, as used inside TD3/SAC ``train()``."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        settings: ICMSettings | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.settings = settings if settings is not None else ICMSettings()
        self.device = torch.device(device)
        s = self.settings
        self.net = CuriosityNet(
            obs_dim, action_dim, s.feature_dim, s.hidden_dim, eta=s.eta, clip=s.clip
        ).to(self.device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=s.learning_rate)
        self.last_stats: dict[str, float] = {}

    def _inputs(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Detached: the ICM must never send gradients back into whoever produced its inputs.
        return tuple(t.detach().to(self.device, torch.float32) for t in tensors)

    def update(
        self, obs: torch.Tensor, actions: torch.Tensor, next_obs: torch.Tensor
    ) -> dict[str, float]:
        """One gradient step on the ICM's own optimizer; returns the three losses."""
        obs, actions, next_obs = self._inputs(obs, actions, next_obs)
        net = self.net
        net.train()
        features = net.encoder(obs)
        next_features = net.encoder(next_obs)
        predicted_action = net.inverse_model(torch.cat([features, next_features], dim=-1))
        inverse_loss = nn.functional.mse_loss(predicted_action, actions)
        # Target detached as in Pathak et al.: the forward loss must not shrink phi(s') itself.
        predicted_features = net.predict_features(features, actions)
        forward_error = (predicted_features - next_features.detach()).pow(2).sum(dim=-1)
        forward_loss = 0.5 * forward_error.mean()
        beta = self.settings.beta
        total_loss = (1.0 - beta) * inverse_loss + beta * forward_loss

        self.optimizer.zero_grad(set_to_none=True)
        total_loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), self.settings.max_grad_norm)
        self.optimizer.step()

        stats = {
            "forward_loss": float(forward_loss.item()),
            "inverse_loss": float(inverse_loss.item()),
            "total_loss": float(total_loss.item()),
        }
        self.last_stats.update({f"icm/{key}": value for key, value in stats.items()})
        return stats

    @torch.no_grad()
    def raw_error(
        self, obs: torch.Tensor, actions: torch.Tensor, next_obs: torch.Tensor
    ) -> torch.Tensor:
        """Unnormalized forward error (B, 1) without touching the running statistics."""
        return self.net.raw_error(*self._inputs(obs, actions, next_obs))

    @torch.no_grad()
    def intrinsic_reward(
        self, obs: torch.Tensor, actions: torch.Tensor, next_obs: torch.Tensor
    ) -> torch.Tensor:
        """Normalized, clipped bonus (B, 1); folds the batch into the statistics first."""
        raw = self.raw_error(obs, actions, next_obs)
        self.net.update_statistics(raw)
        reward = self.net.normalize(raw)
        self.last_stats["icm/intrinsic_reward_mean"] = float(reward.mean().item())
        self.last_stats["icm/intrinsic_reward_std"] = float(reward.std(unbiased=False).item())
        return reward

    def mix(
        self, extrinsic: torch.Tensor, intrinsic: torch.Tensor, num_timesteps: int
    ) -> torch.Tensor:
        """``extrinsic_weight * r + w * r_int``, ``w`` the ``intrinsic_weight`` once
        ``warmup_steps`` timesteps have passed and 0 before."""
        s = self.settings
        mixed = s.extrinsic_weight * extrinsic
        weight = 0.0 if num_timesteps < s.warmup_steps else s.intrinsic_weight
        if weight == 0.0:  # monitor mode / warm-up: the bonus must not touch the reward at all
            return mixed
        return mixed + weight * intrinsic.detach().to(extrinsic.device, extrinsic.dtype)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, path: str | Path) -> None:
        state = {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}
        torch.save({**state, "dims": [self.obs_dim, self.action_dim]}, Path(path))

    @classmethod
    def load(
        cls,
        path: str | Path,
        obs_dim: int,
        action_dim: int,
        settings: ICMSettings | None = None,
        device: torch.device | str = "cpu",
    ) -> IntrinsicCuriosity:
        """Rebuild from ``save``; the dimensions must match those it was saved with."""
        state = torch.load(Path(path), map_location=torch.device(device), weights_only=True)
        saved = tuple(state.get("dims", (obs_dim, action_dim)))
        if saved != (obs_dim, action_dim):
            raise ValueError(
                f"ICM at {path} has (obs_dim, action_dim) {saved}, expected {(obs_dim, action_dim)}"
            )
        icm = cls(obs_dim, action_dim, settings, device)
        icm.load_state_dict(state)
        return icm
