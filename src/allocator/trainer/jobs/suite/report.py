"""The suite's figures over draws: per market the means, intervals over draws, the share of the
rule-to-ceiling gap closed, turnover and saturation, as a JSON summary, a table and a plot."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np

from allocator.trainer.sim.plots import save_figure
from allocator.trainer.statistics.draws import mean_interval

YARDSTICKS = ("anchor", "equal_weight", "rule", "ceiling")


def _values(rows: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) is not None]


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _diffs(rows: Sequence[dict[str, Any]], a: str, b: str) -> list[float]:
    return [
        float(r[a]) - float(r[b]) for r in rows if r.get(a) is not None and r.get(b) is not None
    ]


def gap_closed(policy: float, rule: float, ceiling: float, min_gap: float) -> float | None:
    """(policy - rule) / (ceiling - rule): 1 at the ceiling, 0 at the rule; None where the
    ceiling does not clear the rule by more than ``min_gap`` (no gap worth reading)."""
    if ceiling - rule <= min_gap:
        return None
    return (policy - rule) / (ceiling - rule)


def market_summary(rows: Sequence[dict[str, Any]], min_gap: float, reps: int) -> dict[str, Any]:
    """One market's figures over its draws (each row one draw)."""
    out: dict[str, Any] = {"draws": len(rows), "signal": bool(rows[0]["signal"])}
    policy = _values(rows, "policy_sharpe")
    out["policy_sharpe"] = {"mean": _mean(policy), "interval": mean_interval(policy, reps)}
    for name in YARDSTICKS:
        out[f"{name}_sharpe"] = _mean(_values(rows, f"{name}_sharpe"))
    for name in ("rule", "anchor", "equal_weight"):
        excess = _diffs(rows, "policy_sharpe", f"{name}_sharpe")
        out[f"policy_minus_{name}"] = {
            "mean": _mean(excess),
            "interval": mean_interval(excess, reps),
            "ahead": int(sum(e > 0 for e in excess)),
        }
    headroom = _diffs(rows, "ceiling_sharpe", "rule_sharpe")
    out["ceiling_minus_rule"] = {"mean": _mean(headroom), "interval": mean_interval(headroom, reps)}
    per_draw = [
        g
        for r in rows
        if r.get("ceiling_sharpe") is not None
        and (g := gap_closed(r["policy_sharpe"], r["rule_sharpe"], r["ceiling_sharpe"], min_gap))
        is not None
    ]
    means = [out["policy_sharpe"]["mean"], out["rule_sharpe"], out["ceiling_sharpe"]]
    of_means = None if None in means else gap_closed(means[0], means[1], means[2], min_gap)
    out["gap_closed"] = {
        "of_means": of_means,
        "mean_per_draw": _mean(per_draw),
        "draws_with_gap": len(per_draw),
    }
    for name in ("policy", *YARDSTICKS):
        out[f"{name}_turnover"] = _mean(_values(rows, f"{name}_turnover"))
    near, worst = _values(rows, "near_bound"), _values(rows, "near_bound_max_dim")
    out["near_bound"] = {"mean": _mean(near), "max_dim_max": max(worst) if worst else None}
    out["rules_chosen"] = dict(Counter(str(r["rule"]) for r in rows).most_common())
    return out


def summarize(
    rows: Sequence[dict[str, Any]], min_gap: float = 0.1, reps: int = 10_000
) -> dict[str, dict[str, Any]]:
    """Per market (in the order the rows first name them) its ``market_summary``."""
    markets = dict.fromkeys(r["market"] for r in rows)
    return {
        m: market_summary([r for r in rows if r["market"] == m], min_gap, reps) for m in markets
    }


def _num(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def _with_interval(cell: dict[str, Any]) -> str:
    interval = cell.get("interval")
    text = _num(cell["mean"], signed=True)
    if interval is None:
        return text
    return f"{text} [{interval[0]:+.2f}, {interval[1]:+.2f}]"


COLUMNS: dict[str, Callable[[dict[str, Any]], str]] = {
    "draws": lambda s: str(s["draws"]),
    "policy Sharpe [95%]": lambda s: _with_interval(s["policy_sharpe"]),
    "anchor": lambda s: _num(s["anchor_sharpe"]),
    "EW": lambda s: _num(s["equal_weight_sharpe"]),
    "rule": lambda s: _num(s["rule_sharpe"]),
    "ceiling": lambda s: _num(s["ceiling_sharpe"]),
    "policy - rule [95%]": lambda s: _with_interval(s["policy_minus_rule"]),
    "policy - anchor [95%]": lambda s: _with_interval(s["policy_minus_anchor"]),
    "gap closed": lambda s: _num(s["gap_closed"]["of_means"]),
    "turnover": lambda s: _num(s["policy_turnover"]),
    "near-bound (max dim)": lambda s: (
        f"{_num(s['near_bound']['mean'])} ({_num(s['near_bound']['max_dim_max'])})"
    ),
}
"""The table's columns after the market's name: each one's cell from the market's summary."""


def table(summary: dict[str, dict[str, Any]]) -> str:
    """A markdown table, one row per market: Sharpe net of costs on held-out days."""
    lines = ["| market | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for name, s in summary.items():
        lines.append(f"| {name} | " + " | ".join(cell(s) for cell in COLUMNS.values()) + " |")
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Held-out Sharpe per market: each draw's policy and yardsticks as points, the policy's
    mean with its interval over draws as a bar."""
    markets = list(summary)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(markets)), 4.5))
    styles = {"policy": "o", "anchor": "s", "rule": "^", "ceiling": "*", "equal_weight": "x"}
    for j, (name, marker) in enumerate(styles.items()):
        offset = (j - 2) * 0.12
        for i, m in enumerate(markets):
            ys = _values([r for r in rows if r["market"] == m], f"{name}_sharpe")
            ax.scatter(
                [i + offset] * len(ys),
                ys,
                marker=marker,
                s=22,
                alpha=0.7,
                color=f"C{j}",
                label=name if i == 0 else None,
            )
    for i, m in enumerate(markets):
        cell = summary[m]["policy_sharpe"]
        if cell["mean"] is not None and cell["interval"] is not None:
            low, high = cell["interval"]
            ax.errorbar(
                i - 0.24,
                cell["mean"],
                yerr=[[cell["mean"] - low], [high - cell["mean"]]],
                color="black",
                capsize=4,
            )
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(markets)), markets, rotation=20)
    ax.set_ylabel("held-out Sharpe, net of costs")
    ax.legend(fontsize=8, ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    return save_figure(fig, path)
