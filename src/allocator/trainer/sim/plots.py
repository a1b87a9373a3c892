"""Backtest plots: equity, drawdown, and allocations (raw vs executed) as PNG files."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from allocator.trainer.sim.backtest import BacktestResult


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` and close it, so a long job keeps no figure in memory."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def drawdown(nav: pd.Series) -> pd.Series:
    """How far below its running peak the NAV is each day (0 at a new high, negative below)."""
    return nav / nav.cummax() - 1.0


def held_columns(weights: pd.DataFrame) -> pd.DataFrame:
    """The slots the run ever held: an allocation chart skips the rest."""
    return weights.loc[:, (weights > 1e-12).any(axis=0)]


def _allocation_area(ax: Axes, frame: pd.DataFrame, title: str, legend: bool) -> None:
    live = held_columns(frame)
    # tab20 is a ListedColormap (it has .colors); the stubs type get_cmap as the base class
    ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # type: ignore[attr-defined]
    ax.stackplot(live.index, live.to_numpy().T, labels=list(live.columns), linewidth=0)
    ax.set_ylim(0, 1)
    ax.set_ylabel("weight")
    ax.set_title(title)
    if legend:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def plot_performance(results: Mapping[str, BacktestResult], path: str | Path) -> Path:
    """Equity curves and drawdowns of several runs on one figure."""
    fig, (ax_eq, ax_dd) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for name, res in results.items():
        ax_eq.plot(res.nav.index, res.nav.to_numpy(), label=name, linewidth=1.2)
        dd = drawdown(res.nav)
        ax_dd.plot(dd.index, dd.to_numpy(), label=name, linewidth=1.0)
    ax_eq.set(ylabel="NAV", title="Equity (net of costs)")
    ax_eq.legend(loc="upper left", fontsize=8)
    ax_dd.set(ylabel="drawdown", title="Drawdown")
    for ax in (ax_eq, ax_dd):
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_allocations(result: BacktestResult, path: str | Path) -> Path:
    """Stacked areas of the raw (policy) and executed (smoothed) weights of one run."""
    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    _allocation_area(axes[0], result.raw_weights, f"{result.name}: raw weights", legend=True)
    _allocation_area(
        axes[1], result.executed_weights, f"{result.name}: executed (smoothed)", legend=False
    )
    return save_figure(fig, path)


def plot_backtest(result: BacktestResult, path: str | Path) -> Path:
    """One run on one figure: equity, drawdown and both allocation areas."""
    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    axes[0].plot(result.nav.index, result.nav.to_numpy(), linewidth=1.2)
    axes[0].set(ylabel="NAV", title=f"{result.name}: equity (net of costs)")
    dd = drawdown(result.nav)
    axes[1].fill_between(dd.index, dd.to_numpy(), 0.0, alpha=0.5, color="tab:red")
    axes[1].set(ylabel="drawdown", title="drawdown")
    _allocation_area(axes[2], result.raw_weights, "raw weights", legend=True)
    _allocation_area(axes[3], result.executed_weights, "executed weights", legend=False)
    return save_figure(fig, path)


TRAINING_CURVES = (
    ("rollout/ep_rew_mean", "episode reward"),
    ("train/critic_loss", "critic loss"),
    ("train/actor_loss", "actor loss"),
    ("rollout/turnover", "turnover"),
    ("train/smooth_lambda", "smoothness lambda"),
    ("icm/intrinsic_reward_mean", "intrinsic reward"),
)


def plot_training_curves(progress: pd.DataFrame, path: str | Path) -> Path:
    """The run's logged scalars (SB3's progress.csv) against environment steps."""
    x = progress.get("time/total_timesteps")
    panels = [(k, t) for k, t in TRAINING_CURVES if k in progress and progress[k].notna().any()]
    fig, axes = plt.subplots(
        max(1, len(panels)), 1, figsize=(9, 2.2 * max(1, len(panels))), sharex=True, squeeze=False
    )
    for ax, (key, title) in zip(axes[:, 0], panels, strict=False):
        series = progress[key]
        ok = series.notna()
        ax.plot((x[ok] if x is not None else series.index[ok]), series[ok], linewidth=1.0)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("environment steps")
    return save_figure(fig, path)
