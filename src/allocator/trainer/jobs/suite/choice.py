"""The rule that chooses the default recipe among screened candidates (development ``suite.json``).

A candidate qualifies when on every signal market its mean held-out Sharpe beats the best
training-span rule's, on the no-harm markets it stays within ``ANCHOR_TOLERANCE`` of its anchor,
and no action dimension sat near its bound in ``NEAR_BOUND_LIMIT`` or more of the actions. The
qualifier closing the largest mean share of the rule-to-ceiling gap on the rotating markets wins
(within ``GAP_TIE``, the cheaper recipe); with none, the one meeting most conditions, ties by
mean policy minus rule. Held-out runs are refused: nothing may be chosen on them."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.typed_config import ConfigError

ANCHOR_TOLERANCE = 0.05
NEAR_BOUND_LIMIT = 0.20
GAP_TIE = 0.02
NO_HARM_MARKETS = ("random_walk", "sp500_dev")
ROTATING_MARKETS = ("rotating_short", "rotating_long")


@dataclass(frozen=True)
class Verdict:
    """One candidate against the rule: each condition met or not, and the tie-breakers."""

    name: str
    conditions: dict[str, bool]
    gap_closed: float | None
    """Mean share of the rule-to-ceiling gap closed on the rotating markets."""
    excess: float | None
    """Mean of policy minus rule over the signal markets."""
    cost: float
    """Training steps per draw, every seed's (a cheaper recipe wins a tie between qualifiers)."""

    @property
    def qualifies(self) -> bool:
        return all(self.conditions.values())

    @property
    def met(self) -> int:
        return sum(self.conditions.values())


def _mean_of(cell: dict[str, Any] | None) -> float | None:
    return None if cell is None else cell.get("mean")


def verdict(name: str, document: dict[str, Any]) -> Verdict:
    """``document`` (a development suite's ``suite.json``) judged by the rule."""
    if document.get("mode") != "development":
        raise ConfigError(
            f"{name}: a {document.get('mode')!r} suite run; the default is chosen on "
            "development draws only"
        )
    summary: dict[str, dict[str, Any]] = document["summary"]
    conditions: dict[str, bool] = {}
    excesses: list[float] = []
    for market, s in summary.items():
        if s["signal"]:
            excess = _mean_of(s["policy_minus_rule"])
            conditions[f"above the rule: {market}"] = excess is not None and excess > 0
            if excess is not None:
                excesses.append(excess)
    for market in NO_HARM_MARKETS:
        if market in summary:
            harm = _mean_of(summary[market]["policy_minus_anchor"])
            within = harm is not None and abs(harm) <= ANCHOR_TOLERANCE
            conditions[f"within {ANCHOR_TOLERANCE} of its anchor: {market}"] = within
    worst = [s["near_bound"]["max_dim_max"] for s in summary.values()]
    conditions["no collapse"] = all(w is not None and w < NEAR_BOUND_LIMIT for w in worst)
    gaps = [
        summary[m]["gap_closed"]["of_means"]
        for m in ROTATING_MARKETS
        if m in summary and summary[m]["gap_closed"]["of_means"] is not None
    ]
    config = document.get("config", {})
    steps = config.get("trainer", {}).get("total_timesteps", 0) * config.get("seeds", 1)
    return Verdict(
        name=name,
        conditions=conditions,
        gap_closed=sum(gaps) / len(gaps) if gaps else None,
        excess=sum(excesses) / len(excesses) if excesses else None,
        cost=float(steps),
    )


def choose(verdicts: Sequence[Verdict]) -> Verdict:
    """The candidate the rule chooses (module docstring)."""
    if not verdicts:
        raise ConfigError("no candidates to choose from")
    qualifiers = [v for v in verdicts if v.qualifies]
    if qualifiers:
        best = max(_known(v.gap_closed) for v in qualifiers)
        tied = [v for v in qualifiers if _known(v.gap_closed) >= best - GAP_TIE]
        return min(tied, key=lambda v: (v.cost, -_known(v.gap_closed)))
    return max(verdicts, key=lambda v: (v.met, _known(v.excess)))


def _known(value: float | None) -> float:
    """A figure for ranking; a missing one ranks last."""
    return -math.inf if value is None else value


def read_screen(directory: Path) -> Verdict:
    """The verdict of the suite run written to ``directory`` (its ``suite.json`` and config)."""
    path = directory / "suite.json"
    if not path.is_file():
        raise ConfigError(f"{directory}: no suite.json (is the suite run finished?)")
    document = json.loads(path.read_text())
    config = directory / "suite_config.json"
    if config.is_file():
        document["config"] = json.loads(config.read_text())
    return verdict(directory.name, document)


def verdict_table(verdicts: Sequence[Verdict]) -> str:
    """A markdown table: one row per condition, one column per candidate."""

    def row(label: str, cells: Iterable[str]) -> str:
        return f"| {label} | " + " | ".join(cells) + " |"

    def signed(x: float | None) -> str:
        return "-" if x is None else f"{x:+.2f}"

    keys = list(dict.fromkeys(k for v in verdicts for k in v.conditions))
    lines = [row("condition", (v.name for v in verdicts)), "|---|" + "---|" * len(verdicts)]
    lines += [row(k, ("yes" if v.conditions.get(k) else "no" for v in verdicts)) for k in keys]
    lines.append(row("conditions met", (f"{v.met} of {len(keys)}" for v in verdicts)))
    lines.append(row("mean policy - rule, signal markets", (signed(v.excess) for v in verdicts)))
    lines.append(row("gap closed, rotating", (signed(v.gap_closed) for v in verdicts)))
    return "\n".join(lines)
