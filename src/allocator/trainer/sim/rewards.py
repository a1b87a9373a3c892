"""Rewards and penalties, by name, each docstring its formula; trailing windows use what
history exists, so there is no cliff when a window fills."""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field

from allocator.portfolio.weights import BoolArray, FloatArray
from allocator.typed_config import StrictModel


class EpisodeHistory:
    """What an episode has done so far, in preallocated arrays that rewards and penalties read:
    row 0 before the first decision, row ``k + 1`` after step ``k``, per-slot columns in the
    current slot layout (a joining asset's past is weight 0 at a flat price)."""

    def __init__(self, n_slots: int, capacity: int) -> None:
        self.n_slots = n_slots
        self.capacity = capacity
        self.nav = np.zeros(capacity + 1)
        self.weights = np.zeros((capacity + 1, n_slots))  # executed (smoothed) target weights
        self.prices = np.ones((capacity + 1, n_slots))  # slot closes; cash and masked slots = 1
        self.returns = np.zeros(capacity)  # net one-step portfolio return
        self.benchmark = np.zeros(capacity)  # the anchor's one-step gross return (0 if unused)
        self.mask = np.zeros(n_slots, dtype=bool)
        self.steps = 0

    def start(self, nav: float, weights: FloatArray, prices: FloatArray, mask: BoolArray) -> None:
        self.steps = 0
        self.nav[0] = nav
        self.weights[0] = weights
        self.prices[0] = prices
        self.mask[:] = mask

    def record(
        self, nav: float, weights: FloatArray, prices: FloatArray, benchmark: float = 0.0
    ) -> None:
        k = self.steps
        if k >= self.capacity:
            raise IndexError(f"episode history is full ({self.capacity} steps)")
        self.nav[k + 1] = nav
        self.weights[k + 1] = weights
        self.prices[k + 1] = prices
        self.returns[k] = nav / self.nav[k] - 1.0
        self.benchmark[k] = benchmark
        self.steps = k + 1

    def remap(self, source: NDArray[np.intp], mask: BoolArray, prices: FloatArray) -> None:
        """Every recorded row in a new layout: slot i takes old slot ``source[i]``'s columns,
        or (-1) weight 0 and the flat price ``prices[i]``."""
        rows = slice(0, self.steps + 1)
        kept = source >= 0
        weights = np.zeros((self.steps + 1, self.n_slots))
        weights[:, kept] = self.weights[rows][:, source[kept]]
        flat = np.broadcast_to(np.asarray(prices, dtype=np.float64), weights.shape)
        self.prices[rows] = np.where(kept, self.prices[rows][:, np.maximum(source, 0)], flat)
        self.weights[rows] = weights
        self.mask[:] = mask

    def window_start(self, window: int) -> int:
        return max(0, self.steps - window)


class RewardKind(StrEnum):
    TRANSACTION_COST = "TRANSACTION_COST"
    STRUCTURED_CREDIT = "STRUCTURED_CREDIT"
    SORTINO = "SORTINO"
    SHAPLEY = "SHAPLEY"


class TransactionCostSettings(StrictModel):
    """Net one-step return plus ``long_weight / long_horizon`` times the N-step NAV return."""

    long_horizon: int = Field(20, ge=1, description="N: steps back for the long-horizon bonus")
    long_weight: float = Field(1.0, ge=0, description="lambda_long: weight of the bonus")


class StructuredCreditSettings(StrictModel):
    """Window allocation-weighted soft-log asset returns, cash hedge, downside-sigma penalty."""

    window: int = Field(30, ge=1, description="steps in the credit window")
    soft_log_k: float = Field(1.5, gt=0, description="k in sign(x) log1p(k|x|) / log1p(k)")
    downside_weight: float = Field(0.02, ge=0, description="weight of the downside sigma")
    clip: float = Field(1.0, gt=0, description="reward clipped to [-clip, clip]")


class SortinoSettings(StrictModel):
    """Net return plus potential-based shaping ``weight * (gamma F_t - F_{t-1})``."""

    window: int = Field(30, ge=2, description="steps in the rolling Sortino window")
    gamma: float = Field(0.99, gt=0, le=1, description="discount used in the shaping term")
    weight: float = Field(0.01, ge=0, description="scale of the shaping term")
    cap: float = Field(10.0, gt=0, description="the potential F is clipped to [-cap, cap]")


class ShapleySettings(StrictModel):
    """Sum of exact Shapley credits of the window's coalition game, clipped."""

    window: int = Field(30, ge=1, description="steps in the credit window")
    clip: float = Field(0.1, gt=0, description="reward clipped to [-clip, clip]")


class PenaltySettings(StrictModel):
    """Weights (0 = off) of the allocation-churn penalties."""

    turnover: float = Field(0.0, ge=0, description="weight on sum |s_t - s_{t-1}|")
    jitter: float = Field(0.0, ge=0, description="weight on squared moves inside the dead-band")
    jitter_deadband: float = Field(0.10, gt=0, le=1, description="moves below this are jitter")
    total_variation: float = Field(0.0, ge=0, description="weight on the window's L1 variation")
    tv_window: int = Field(10, ge=1, description="steps in the total-variation window")


class RewardConfig(StrictModel):
    """Which reward drives learning, its knobs, and the penalties subtracted from it."""

    kind: RewardKind = RewardKind.TRANSACTION_COST
    # Daily returns are ~1e-2: critics and tanh actors learn faster on rewards of order 1.
    scale: float = Field(1.0, gt=0, description="the final reward is multiplied by this")
    transaction_cost: TransactionCostSettings = TransactionCostSettings()
    structured_credit: StructuredCreditSettings = StructuredCreditSettings()
    sortino: SortinoSettings = SortinoSettings()
    shapley: ShapleySettings = ShapleySettings()
    penalties: PenaltySettings = PenaltySettings()
    relative_to: Literal["none", "anchor"] = Field(
        "none",
        description="'anchor' (tilt mapping only): subtract the anchor's one-step return",
    )


# --- maths -------------------------------------------------------------------------------


def soft_log(x: ArrayLike, k: float = 1.5) -> FloatArray:
    """Sign-preserving log squashing ``sign(x) log1p(k|x|) / log1p(k)``; +-1 at |x| = 1."""
    v = np.asarray(x, dtype=np.float64)
    return np.sign(v) * np.log1p(k * np.abs(v)) / math.log1p(k)


def downside_sigma(returns: ArrayLike) -> float:
    """Population std of the negative returns (0 without any)."""
    r = np.asarray(returns, dtype=np.float64)
    neg = r[r < 0]
    return float(neg.std()) if neg.size else 0.0


def sortino_potential(returns: ArrayLike, cap: float = 10.0) -> float:
    """``mean(r) / sqrt(mean(min(r, 0)^2))`` clipped to ``[-cap, cap]``; 0 with < 2 returns."""
    r = np.asarray(returns, dtype=np.float64)
    if r.size < 2:
        return 0.0
    dd = math.sqrt(float(np.mean(np.minimum(r, 0.0) ** 2)))
    mean = float(r.mean())
    if dd == 0.0:
        return cap if mean > 0 else (-cap if mean < 0 else 0.0)
    return float(np.clip(mean / dd, -cap, cap))


def window_credit_inputs(h: EpisodeHistory, window: int) -> tuple[FloatArray, ...]:
    """``(avg_alloc, slot_returns, live)`` over the trailing window; cash and masked: 0."""
    j0 = h.window_start(window)
    k = h.steps
    avg_alloc = h.weights[j0 + 1 : k + 1].mean(axis=0)
    slot_returns = h.prices[k] / h.prices[j0] - 1.0
    slot_returns[~h.mask] = 0.0
    slot_returns[0] = 0.0
    return avg_alloc, slot_returns, h.mask


def shapley_values(avg_alloc: ArrayLike, slot_returns: ArrayLike) -> FloatArray:
    """Exact Shapley values ``a_i R_i`` of the additive game ``v(S) = sum_{i in S} a_i R_i``."""
    return np.asarray(avg_alloc, dtype=np.float64) * np.asarray(slot_returns, dtype=np.float64)


# --- rewards -----------------------------------------------------------------------------


Settings = TypeVar("Settings", bound=StrictModel)


class Reward(Generic[Settings]):
    """A reward computed from the episode history after each step, with its settings ``s``."""

    def __init__(self, s: Settings) -> None:
        self.s = s

    def reset(self) -> None:
        """Forget per-episode state (none by default)."""

    def __call__(self, h: EpisodeHistory) -> float:
        raise NotImplementedError


class TransactionCostReward(Reward[TransactionCostSettings]):
    """Net one-step return (costs already taken out of NAV) plus the long-horizon bonus."""

    def __call__(self, h: EpisodeHistory) -> float:
        k, n = h.steps, self.s.long_horizon
        r = h.returns[k - 1]
        bonus = self.s.long_weight / n
        if bonus and k >= n:
            r += bonus * (h.nav[k] / h.nav[k - n] - 1.0)
        return float(r)


class StructuredCreditReward(Reward[StructuredCreditSettings]):
    """Allocation-weighted soft-log asset returns + cash hedge - downside sigma, clipped."""

    def __call__(self, h: EpisodeHistory) -> float:
        avg_alloc, slot_ret, live = window_credit_inputs(h, self.s.window)
        assets = live.copy()
        assets[0] = False
        credit = float(np.sum(avg_alloc[assets] * soft_log(slot_ret[assets], self.s.soft_log_k)))
        market = float(slot_ret[assets].mean()) if assets.any() else 0.0
        cash = float(avg_alloc[0]) * max(-market, 0.0)
        sigma = downside_sigma(h.returns[h.window_start(self.s.window) : h.steps])
        return float(
            np.clip(credit + cash - self.s.downside_weight * sigma, -self.s.clip, self.s.clip)
        )


class SortinoReward(Reward[SortinoSettings]):
    """Net return + ``weight * (gamma F_t - F_{t-1})`` with F the rolling Sortino ratio."""

    prev = 0.0  # F_{t-1}

    def reset(self) -> None:
        self.prev = 0.0

    def __call__(self, h: EpisodeHistory) -> float:
        k = h.steps
        f = sortino_potential(h.returns[h.window_start(self.s.window) : k], self.s.cap)
        shaped = self.s.weight * (self.s.gamma * f - self.prev)
        self.prev = f
        return float(h.returns[k - 1] + shaped)


class ShapleyReward(Reward[ShapleySettings]):
    """Sum of the exact Shapley credits over the window, clipped."""

    def __call__(self, h: EpisodeHistory) -> float:
        avg_alloc, slot_ret, _ = window_credit_inputs(h, self.s.window)
        return float(np.clip(shapley_values(avg_alloc, slot_ret).sum(), -self.s.clip, self.s.clip))


# --- penalties ---------------------------------------------------------------------------


def turnover_penalty(h: EpisodeHistory, weight: float) -> float:
    """``weight * sum_i |s_t,i - s_{t-1},i|`` on executed weights."""
    k = h.steps
    return weight * float(np.abs(h.weights[k] - h.weights[k - 1]).sum())


def jitter_penalty(h: EpisodeHistory, weight: float, deadband: float) -> float:
    """``weight * sum_i d_i^2`` over moves ``d_i = |s_t,i - s_{t-1},i|`` in (0, band): noise."""
    k = h.steps
    d = np.abs(h.weights[k] - h.weights[k - 1])
    small = d[(d > 0) & (d < deadband)]
    return weight * float(np.sum(small * small))


def total_variation_penalty(h: EpisodeHistory, weight: float, window: int) -> float:
    """``weight * sum_{j in window} sum_i |s_j,i - s_{j-1},i|``: thrashing across steps."""
    w = h.weights[h.window_start(window) : h.steps + 1]
    return weight * float(np.abs(np.diff(w, axis=0)).sum())


class RewardFunction:
    """The configured reward minus the configured penalties."""

    def __init__(self, config: RewardConfig) -> None:
        self.config = config
        self.scale = config.scale
        builders: dict[RewardKind, Callable[[], Reward[Any]]] = {
            RewardKind.TRANSACTION_COST: lambda: TransactionCostReward(config.transaction_cost),
            RewardKind.STRUCTURED_CREDIT: lambda: StructuredCreditReward(config.structured_credit),
            RewardKind.SORTINO: lambda: SortinoReward(config.sortino),
            RewardKind.SHAPLEY: lambda: ShapleyReward(config.shapley),
        }
        self.reward = builders[config.kind]()
        # The anchor's return does not depend on the action (the anchor is set from trailing
        # prices), so subtracting it leaves the best action where it was while it takes the
        # market's common move out of every reward: a control variate for the critic's target.
        self.relative = config.relative_to == "anchor"
        self.penalties = config.penalties

    def reset(self) -> None:
        self.reward.reset()

    def __call__(self, h: EpisodeHistory) -> float:
        r = self.reward(h)
        if self.relative:
            r -= float(h.benchmark[h.steps - 1])
        p = self.penalties  # a zero weight skips its penalty
        if p.turnover:
            r -= turnover_penalty(h, p.turnover)
        if p.jitter:
            r -= jitter_penalty(h, p.jitter, p.jitter_deadband)
        if p.total_variation:
            r -= total_variation_penalty(h, p.total_variation, p.tv_window)
        return r * self.scale
