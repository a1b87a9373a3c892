"""The promotion gates. A metric that is not a number (NaN, infinite, missing) fails its gate,
never passes by accident of a comparison with NaN."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from allocator.trainer.jobs.json_safe import json_safe
from allocator.typed_config import StrictModel


class GateSettings(StrictModel):
    """What a candidate must show on the held-out span to replace production (None: gate off);
    every figure is net of costs."""

    max_sharpe_shortfall: float | None = Field(
        0.1, ge=0, description="candidate net Sharpe may trail production's by at most this"
    )
    max_turnover: float | None = Field(
        0.1, gt=0, description="budget on the candidate's mean daily turnover"
    )
    max_drawdown: float | None = Field(
        0.35, gt=0, le=1, description="limit on the candidate's max drawdown (fraction)"
    )
    min_sharpe: float | None = Field(
        None, description="absolute floor on the candidate's net Sharpe"
    )
    max_shortfall_vs_equal_weight: float | None = Field(
        None, ge=0, description="candidate net Sharpe may trail equal weight's by at most this"
    )

    @model_validator(mode="after")
    def _at_least_one(self) -> GateSettings:
        if all(v is None for v in self.model_dump().values()):
            raise ValueError("every gate is off: a candidate would always be promoted")
        return self


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict: what was measured, against what, and why it passed or failed."""

    gate: str
    passed: bool
    reason: str
    value: float | None = None
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return json_safe(self.__dict__)


def bounded(
    gate: str, what: str, value: float, bound: float, detail: str, *, floor: bool = True
) -> GateResult:
    """Pass when ``value`` is at least ``bound`` (a floor), or with ``floor=False`` at most
    ``bound`` (a limit); a value that is not a number fails."""
    if not math.isfinite(value):
        return GateResult(gate, False, f"{what} is not a number ({value}): {detail}", value, bound)
    ok = value >= bound if floor else value <= bound
    verdict = ("meets" if ok else "is below") if floor else ("is within" if ok else "exceeds")
    reason = (
        f"{what} {value:.4f} {verdict} the {'floor' if floor else 'limit'} {bound:.4f} ({detail})"
    )
    return GateResult(gate, ok, reason, value, bound)


def sharpe_vs(
    who: str, sharpe: float, other: Mapping[str, float] | None, shortfall: float
) -> GateResult:
    """The candidate's net Sharpe against ``who``'s (production or equal weight) less
    ``shortfall``. With no production to compare with (none, or its Sharpe not a number) it
    passes and the absolute gates decide; equal weight always exists, so its Sharpe
    unavailable fails the gate."""
    gate = f"sharpe_vs_{who.replace(' ', '_')}"
    theirs = float("nan") if other is None else float(other["sharpe"])
    if who == "equal weight" and not math.isfinite(theirs):
        reason = "equal weight's net Sharpe is unavailable: cannot check the candidate against it"
        return GateResult(gate, False, reason, sharpe)
    if other is None:
        reason = "no production model to compare with: the absolute gates decide"
        return GateResult(gate, True, reason, sharpe)
    if not math.isfinite(theirs):
        reason = (
            f"production's net Sharpe is not a number ({other['sharpe']}): "
            "nothing to compare with, the absolute gates decide"
        )
        return GateResult(gate, True, reason, sharpe)
    detail = f"{who} {theirs:.4f} less the allowed shortfall {shortfall:g}"
    return bounded(gate, "net Sharpe", sharpe, theirs - shortfall, detail)


def apply_gates(
    gates: GateSettings,
    candidate: Mapping[str, float],
    production: Mapping[str, float] | None,
    equal_weight: Mapping[str, float] | None = None,
) -> list[GateResult]:
    """Every configured gate on held-out metrics (``BacktestResult.metrics()``), in order."""
    g, results = gates, list[GateResult]()
    sharpe = float(candidate["sharpe"])
    if g.max_sharpe_shortfall is not None:
        results.append(sharpe_vs("production", sharpe, production, g.max_sharpe_shortfall))
    for gate, what, limit, detail in (
        ("turnover", "mean daily turnover", g.max_turnover, "the turnover budget"),
        ("max_drawdown", "max drawdown", g.max_drawdown, "the drawdown limit"),
    ):
        if limit is not None:
            results.append(bounded(gate, what, float(candidate[gate]), limit, detail, floor=False))
    if g.min_sharpe is not None:
        floor = "the absolute Sharpe floor"
        results.append(bounded("min_sharpe", "net Sharpe", sharpe, g.min_sharpe, floor))
    if g.max_shortfall_vs_equal_weight is not None:
        shortfall = g.max_shortfall_vs_equal_weight
        results.append(sharpe_vs("equal weight", sharpe, equal_weight, shortfall))
    return results
