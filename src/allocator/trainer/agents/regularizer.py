"""The actor's regularizers: smoothness ``lambda * E||pi(s') - pi(s)||^2`` and the bound penalty.

Adaptive smoothness is a constraint: lambda rises while the mean action change exceeds a budget
and falls under it, so the agent pays only when it over-trades (a fixed one is too timid).
"""

from __future__ import annotations

import math
from enum import StrEnum

import torch as th
from pydantic import Field

from allocator.typed_config import StrictModel


class SmoothMode(StrEnum):
    NONE = "none"
    FIXED = "fixed"
    ADAPTIVE = "adaptive"


class SmoothnessSettings(StrictModel):
    """How the actor is asked to move smoothly between consecutive states."""

    mode: SmoothMode = SmoothMode.NONE
    lam: float = Field(0.0, ge=0, description="lambda: fixed value, or the adaptive start")
    alpha: float = Field(0.05, gt=0, description="dual-ascent step size (adaptive)")
    budget: float = Field(0.05, ge=0, description="d: allowed E||pi(s') - pi(s)||^2 (adaptive)")
    lam_max: float = Field(100.0, gt=0, description="adaptive lambda never exceeds this")


def split_change(out: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """``pi(s)`` and per-sample ``C = ||pi(s') - pi(s)||^2`` from one actor pass on ``[s; s']``."""
    actions, next_actions = out.chunk(2)
    return actions, (next_actions - actions).pow(2).sum(dim=-1)


class SmoothnessLambda:
    """Holds lambda and applies its update rule after every actor step."""

    def __init__(self, settings: SmoothnessSettings) -> None:
        self.settings = settings
        self.value = settings.lam if settings.mode != SmoothMode.NONE else 0.0

    @property
    def active(self) -> bool:
        return self.settings.mode != SmoothMode.NONE

    def update(self, mean_change: float) -> float:
        """Dual ascent ``lambda <- clip(lambda + alpha (E[C] - d), 0, lam_max)`` (adaptive only)."""
        s = self.settings
        if s.mode == SmoothMode.ADAPTIVE:
            self.value = min(s.lam_max, max(0.0, self.value + s.alpha * (mean_change - s.budget)))
        return self.value


class ActionBoundSettings(StrictModel):
    """A penalty on pre-tanh scores past ``atanh(limit)`` (``weight`` 0: off): a tanh actor at
    +-1 has no gradient, and a penalty on the action would be gated by the same factor."""

    weight: float = Field(0.0, ge=0, description="penalty per squared unit of score past the limit")
    limit: float = Field(0.9, gt=0, lt=1, description="the |action| the penalty starts at")

    @property
    def active(self) -> bool:
        return self.weight > 0


def bound_penalty(scores: th.Tensor, settings: ActionBoundSettings) -> th.Tensor:
    """``weight * E_batch[sum_slots relu(|u| - atanh(limit))^2]`` for pre-tanh ``scores`` (B, S)."""
    excess = th.relu(scores.abs() - math.atanh(settings.limit))
    return settings.weight * excess.pow(2).sum(dim=-1).mean()
