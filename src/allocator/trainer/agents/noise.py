"""Exploration noise for TD3 from SB3's noise classes, with sigma annealed over training.

Seed 001: start exploring widely (sigma 0.2-0.4) and anneal toward ~0.01 so late training
exploits what was learned instead of thrashing.
"""

from __future__ import annotations

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.noise import (
    ActionNoise,
    NormalActionNoise,
    OrnsteinUhlenbeckActionNoise,
)

from allocator.trainer.training.config import AnnealKind, NoiseKind, NoiseSettings


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
    if settings.anneal == AnnealKind.LINEAR:
        return s0 + (s1 - s0) * x
    if s0 <= 0 or s1 <= 0:  # exponential needs positive endpoints; fall back to linear
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
