"""Hansen's SPA test of a policy (losses: negative daily net returns) against baselines, one
test per baseline and the largest p-value kept (intersection-union: no multiplicity correction).
arch does not floor the observed mean at zero: a clearly worse policy gets ~0.5, not 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
from arch.bootstrap import SPA
from numpy.typing import ArrayLike

from allocator.trainer.statistics.checks import FLAT, daily_returns, paired_returns, positive_int
from allocator.trainer.statistics.sharpe import block_size


@dataclass(frozen=True)
class SpaPValues:
    """Hansen's three SPA p-values; ``consistent`` is the one to quote."""

    lower: float
    consistent: float
    upper: float


SPA_FIELDS = tuple(f.name for f in fields(SpaPValues))
NO_EVIDENCE = SpaPValues(1.0, 1.0, 1.0)
"""Models whose loss is never below the benchmark's by a varying amount: nothing beats it."""

CERTAIN = SpaPValues(0.0, 0.0, 0.0)
"""A model whose loss is below the benchmark's by the same amount every day."""


def spa_pvalues(
    benchmark_losses: ArrayLike,
    model_losses: ArrayLike,
    *,
    block: int | None = None,
    reps: int = 1000,
    seed: int = 0,
) -> SpaPValues:
    """SPA p-values of "no model's expected loss is below the benchmark's" from
    ``benchmark_losses`` per day and ``model_losses`` days x models (or one model's days)."""
    bench = daily_returns(benchmark_losses, "benchmark_losses")
    raw = np.asarray(model_losses, dtype=np.float64)
    models = raw[:, None] if raw.ndim == 1 else raw
    if models.ndim != 2 or models.shape[0] != bench.size:
        raise ValueError(
            f"model_losses has shape {raw.shape}; it needs {bench.size} days (one row per "
            "day of benchmark_losses) and one column per model"
        )
    for k in range(models.shape[1]):
        daily_returns(models[:, k], f"model_losses[:, {k}]")
    diff = bench[:, None] - models
    constant = diff.std(axis=0) <= FLAT
    if np.any(constant & (diff.mean(axis=0) > FLAT)):
        return CERTAIN  # a model with a lower loss on every single day
    # A model whose differential never varies and is never positive cannot beat the
    # benchmark, and its zero variance would make the studentized statistic 0/0: drop it.
    if constant.all():
        return NO_EVIDENCE
    models, diff = models[:, ~constant], diff[:, ~constant]
    mean_block = block_size(diff) if block is None else positive_int(block, "block")
    test = SPA(
        bench, models, block_size=mean_block, reps=positive_int(reps, "reps"), seed=int(seed)
    )
    with np.errstate(all="ignore"):
        test.compute()
    p = test.pvalues
    return SpaPValues(float(p["lower"]), float(p["consistent"]), float(p["upper"]))


@dataclass(frozen=True)
class PolicySuperiority:
    """Whether a policy beats every baseline, and whether any baseline beats the policy."""

    pvalues: SpaPValues
    binding: str
    per_baseline: dict[str, SpaPValues]
    baselines_beat_policy: SpaPValues
    days: int
    reps: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def policy_superiority(
    policy: ArrayLike,
    baselines: Mapping[str, ArrayLike],
    *,
    block: int | None = None,
    reps: int = 1000,
    seed: int = 0,
) -> PolicySuperiority:
    """SPA of the policy's daily net returns against each baseline's on the same days, and the
    reverse test (``baselines_beat_policy``)."""
    if not baselines:
        raise ValueError("baselines is empty: the policy needs at least one baseline to beat")
    returns = daily_returns(policy, "policy")
    losses = -returns
    others = {
        name: -paired_returns(values, returns, (f"baseline {name!r}", "the policy"))[:, 0]
        for name, values in baselines.items()
    }
    per = {
        name: spa_pvalues(loss, losses, block=block, reps=reps, seed=seed)
        for name, loss in others.items()
    }
    binding = max(per, key=lambda name: per[name].consistent)
    worst = SpaPValues(*(max(getattr(p, f) for p in per.values()) for f in SPA_FIELDS))
    reverse = spa_pvalues(
        losses, np.column_stack(list(others.values())), block=block, reps=reps, seed=seed
    )
    return PolicySuperiority(worst, binding, per, reverse, int(returns.size), reps, int(seed))
