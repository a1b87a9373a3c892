"""Exploration noise for TD3 from SB3's noise classes, sigma annealed: wide early to visit new
allocations, narrow late so it does not thrash around what was learned."""

from __future__ import annotations

from enum import StrEnum

import numpy as np
from pydantic import Field
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.noise import (
    ActionNoise,
    NormalActionNoise,
    OrnsteinUhlenbeckActionNoise,
)

from allocator.typed_config import StrictModel


class NoiseKind(StrEnum):
    NONE = "none"
    GAUSSIAN = "gaussian"
    OU = "ou"


class AnnealKind(StrEnum):
    CONSTANT = "constant"
    LINEAR = "linear"
    EXPONENTIAL = "exponential"


class NoiseSettings(StrictModel):
    """Exploration noise added to TD3's actions, its sigma annealed over training."""

    kind: NoiseKind = NoiseKind.GAUSSIAN
    sigma: float = Field(0.3, ge=0, description="initial sigma")
    final_sigma: float = Field(0.05, ge=0, description="sigma at the end of annealing")
    anneal: AnnealKind = AnnealKind.LINEAR
    anneal_fraction: float = Field(0.8, gt=0, le=1, description="share of training to anneal")
    ou_theta: float = Field(0.15, gt=0, description="OU mean reversion")
    ou_dt: float = Field(0.01, gt=0, description="OU time step")


def make_action_noise(settings: NoiseSettings, action_dim: int) -> ActionNoise | None:
    """SB3 Gaussian or OU noise at the initial sigma (None when exploration noise is off)."""
    mean, sigma = np.zeros(action_dim), np.full(action_dim, settings.sigma)
    if settings.kind == NoiseKind.GAUSSIAN:
        return NormalActionNoise(mean, sigma)
    if settings.kind == NoiseKind.OU:
        return OrnsteinUhlenbeckActionNoise(mean, sigma, theta=settings.ou_theta, dt=settings.ou_dt)
    return None


def annealed_sigma(settings: NoiseSettings, elapsed: float) -> float:
    """Sigma after ``elapsed`` (0..1) of training; constant past ``anneal_fraction``."""
    s0, s1 = settings.sigma, settings.final_sigma
    x = min(1.0, max(0.0, elapsed) / settings.anneal_fraction)
    if settings.anneal == AnnealKind.CONSTANT:
        return s0
    # Exponential needs positive endpoints; without them it falls back to linear.
    if settings.anneal == AnnealKind.LINEAR or s0 <= 0 or s1 <= 0:
        return s0 + (s1 - s0) * x
    return float(s0 * (s1 / s0) ** x)


class NoiseAnnealingCallback(BaseCallback):
    """Sets the model's action-noise sigma from the schedule at every step."""

    def __init__(self, settings: NoiseSettings, total_timesteps: int) -> None:
        super().__init__()
        self.settings = settings
        self.total = max(1, total_timesteps)

    def _on_step(self) -> bool:
        noise = getattr(self.model, "action_noise", None)
        if noise is None:
            return True
        sigma = annealed_sigma(self.settings, self.num_timesteps / self.total)
        noise._sigma = np.full_like(noise._sigma, sigma)  # SB3 noise classes keep sigma here
        self.logger.record("rollout/noise_sigma", sigma)
        return True
