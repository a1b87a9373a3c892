"""Walk-forward report: ``summary.json``, ``returns.csv`` and ``report/`` with ``report.md``, its
PNG figures and ``report.html``, one interactive page: the test windows stitched end to end, the
excess Sharpe per window with its interval, and ``report.md``'s statistics table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import pandas as pd
import plotly.graph_objects as go
from matplotlib.patches import Patch

from allocator.artifacts.files import write_json
from allocator.trainer.jobs.walk_forward.rundir import (
    AGENT,
    SUMMARY_FILE,
    WalkForwardResult,
    WindowResult,
    returns_frame,
    write_returns,
)
from allocator.trainer.jobs.walk_forward.summary import POOLED
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.sim.html_report import REPORT_FILE, write_backtest_report
from allocator.trainer.sim.plots import plot_allocations, save_figure

REGIME_COLORS = {"bull": "tab:green", "bear": "tab:red", "sideways": "tab:gray"}


def summary_payload(result: WalkForwardResult) -> dict[str, Any]:
    """What ``summary.json`` holds: the summary, the run's identity, every window's metrics."""
    kept = {"name", "executor", "model_name", "cost_bps", "baseline_fit", "baselines"}
    kept |= {"baseline_rebalance_every", "configurations_tried"}
    return {
        **result.config.model_dump(mode="json", include=kept),
        "label": result.label,
        "run_id": result.run_id,
        "seconds": round(result.seconds, 2),
        "registry": str(Path(result.config.registry).resolve()),
        "windows_spec": result.config.windows.model_dump(mode="json"),
        "summary": {k: v for k, v in result.summary.items() if k != "per_window"},
        "windows": [
            {
                **row,
                "metrics": w.metrics(),
                "baselines": w.baseline_metrics(),
                "icm": w.icm,
                "version_dir": w.version_dir,
                "run_dir": w.run_dir,
                "train_seconds": w.train_seconds,
                "seconds": w.seconds,
            }
            for row, w in zip(result.summary["per_window"], result.windows, strict=True)
        ],
    }


def plot_window_equity(windows: list[WindowResult], path: str | Path) -> Path:
    """One panel per window: the model's NAV and each baseline's over the test span."""
    n = len(windows)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), squeeze=False)
    for ax, w in zip(axes.flat, windows, strict=False):
        ax.plot(w.agent.nav.index, w.agent.nav.to_numpy(), label="agent", color="black", lw=1.6)
        for name, res in w.baselines.items():
            ax.plot(res.nav.index, res.nav.to_numpy(), label=name, lw=0.9, alpha=0.85)
        ax.set_title(f"{w.window.label}: {w.window.test_start} .. {w.window.test_end}", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Equity on each test window (net of costs), exported model vs baselines")
    return save_figure(fig, path)


def plot_excess_sharpe(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Excess Sharpe over equal weight per window (bars by regime) and its distribution."""
    fig, (ax_bar, ax_hist) = plt.subplots(
        1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [2, 1]}
    )
    excess = [r["excess_sharpe"] for r in rows]
    labels = [f"w{r['index']:02d}\n{str(r['test_start'])[:7]}" for r in rows]
    ax_bar.bar(range(len(rows)), excess, color=[REGIME_COLORS[r["regime"]] for r in rows])
    ax_bar.set_xticks(range(len(rows)), labels, fontsize=7)
    ax_bar.axhline(0.0, color="black", lw=0.8)
    ax_bar.set(ylabel="Sharpe - equal weight's", title="Excess Sharpe per test window")
    ax_bar.legend(
        handles=[Patch(color=c, label=regime) for regime, c in REGIME_COLORS.items()], fontsize=8
    )
    ax_hist.hist(excess, bins=max(5, min(20, len(excess))), color="tab:blue", alpha=0.8)
    if excess:
        med = float(pd.Series(excess).median())
        ax_hist.axvline(med, color="black", ls="--", lw=1, label=f"median {med:+.2f}")
        ax_hist.legend(fontsize=8)
    ax_hist.axvline(0.0, color="gray", lw=0.8)
    ax_hist.set(xlabel="excess Sharpe", ylabel="windows", title="Distribution")
    ax_hist.tick_params(axis="x", labelsize=7, rotation=45)
    for ax in (ax_bar, ax_hist):
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def stitch(parts: list[BacktestResult], name: str) -> BacktestResult:
    """Consecutive backtests as one: each NAV continues from the level the previous one ended
    at; weights of assets absent from a part are 0."""
    navs: list[pd.Series] = []
    level = 1.0
    for part in parts:
        nav = part.nav / part.nav.iloc[0] * level
        navs.append(nav if not navs else nav.iloc[1:])
        level = float(nav.iloc[-1])
    return BacktestResult(
        name=name,
        nav=pd.concat(navs),
        raw_weights=pd.concat([p.raw_weights for p in parts]).fillna(0.0),
        executed_weights=pd.concat([p.executed_weights for p in parts]).fillna(0.0),
        turnover=pd.concat([p.turnover for p in parts]),
        costs=pd.concat([p.costs for p in parts]),
    )


def _fmt(value: Any, spec: str = "+.2f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def format_summary(summary: dict[str, Any]) -> str:
    """A plain-text table of the summary (overall and per regime) and the goals, for the CLI."""
    head = f"{'group':<10}{'windows':>8}{'Sharpe>0':>10}{'beats EW':>10}{'med excess':>12}"
    lines = [head, "-" * len(head)]
    for name, g in [("all", summary), *summary["by_regime"].items()]:
        lines.append(
            f"{name:<10}{g['windows']:>8}{_pct(g['positive_sharpe']):>10}"
            f"{_pct(g['beats_equal_weight']):>10}{_fmt(g['median_excess_sharpe']):>12}"
        )
    lines.append(f"mean daily turnover {_fmt(summary['mean_turnover'], '.4f')}")
    held, n = summary["windows_holding_anchor"], summary["windows"]
    lines.append(f"held the anchor (no inner-span skill): {held} of {n} windows")
    lines += [f"goal: {goal_text(key, goal)}" for key, goal in summary["goals"].items()]
    return "\n".join(lines)


def goal_text(key: str, goal: dict[str, Any]) -> str:
    """One goal, its value and whether it is met."""
    state = "met" if goal["met"] else "not met"
    return f"{key.replace('_', ' ')} >= {_pct(goal['target'])}: {_pct(goal['value'])} ({state})"


def statistics_rows(stats: dict[str, Any]) -> list[tuple[str, ...]]:
    """The ``STATISTICS_HEADER`` cells and the deflated Sharpe of each window, then pooled."""
    rows = []
    for span in [*stats["windows"], stats[POOLED]]:
        if "error" in span:
            rows.append((span["window"], str(span["days"]), *(["n/a"] * 5)))
            continue
        ex, dsr = span["excess_sharpe"], span["deflated_sharpe"]
        rows.append(
            (
                span["window"],
                str(span["days"]),
                _fmt(ex["policy_sharpe"]),
                _fmt(ex["benchmark_sharpe"]),
                f"{_fmt(ex['estimate'])} [{_fmt(ex['low'])}, {_fmt(ex['high'])}]",
                _fmt(span["spa"]["pvalues"]["consistent"], ".3f"),
                _fmt(dsr["deflated"], ".3f"),
            )
        )
    return rows


def statistics_notes(stats: dict[str, Any]) -> list[str]:
    """What the statistics columns mean and how they were drawn; spans that had none."""
    st = stats["settings"]
    variance = st["trials_sharpe_variance"]
    block = st["block_size"] or "Politis-White estimate"
    notes = [
        f"Excess: agent's Sharpe minus {st['benchmark']}'s on the same days, {st['level']:.0%} "
        f"{st['interval']} interval of a stationary bootstrap of paired days ({st['reps']} "
        f"draws, seed {st['seed']}, mean block: {block}); pooled: all windows' days in order.",
        "SPA p: Hansen's consistent SPA p-value of the agent against each of "
        f"{', '.join(st['baselines'])} on mean daily net return, the largest over them "
        "(small: the agent beats every one).",
        f"DSR: deflated Sharpe of the agent with {st['configurations_tried']} configuration(s) "
        "tried, their Sharpes' annualized variance "
        + ("the sampling variance of a zero-Sharpe span" if variance is None else f"{variance:g}")
        + " (Bailey and Lopez de Prado, 2014).",
    ]
    notes += anchor_notes(stats)
    for span in [*stats["windows"], stats[POOLED]]:
        if "error" in span:
            notes.append(f"{span['window']}: no statistics: {span['error']}")
    return notes


def anchor_notes(stats: dict[str, Any]) -> list[str]:
    """What the learned tilt adds over its own anchor, when the run backtested the anchor."""
    pooled = stats[POOLED].get("excess_sharpe_over_anchor")
    if pooled is None:
        return []
    spans = [s["excess_sharpe_over_anchor"] for s in stats["windows"] if "error" not in s]
    beats = sum(1 for s in spans if s["estimate"] > 0)
    return [
        f"Over the anchor (the portfolio the tilt policy holds at a zero action): pooled "
        f"excess Sharpe {_fmt(pooled['estimate'])} [{_fmt(pooled['low'])}, "
        f"{_fmt(pooled['high'])}] (anchor {_fmt(pooled['benchmark_sharpe'])}); the agent "
        f"beats it in {beats} of {len(spans)} windows."
    ]


STATISTICS_HEADER = ("window", "days", "agent Sharpe", "EW Sharpe", "excess [lo, hi]", "SPA p")


def format_statistics(stats: dict[str, Any]) -> str:
    """The statistics as a plain-text table (each window, then pooled) and notes, for the CLI."""
    header = (*STATISTICS_HEADER, "DSR")
    rows = [header, *statistics_rows(stats)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    return "\n".join([*lines, *statistics_notes(stats)])


def statistics_lines(stats: dict[str, Any] | None) -> list[str]:
    """The report's statistics section: the same table and notes as the CLI's."""
    if not stats:
        return []
    header = (*STATISTICS_HEADER, "deflated Sharpe")
    lines = ["## Intervals and tests", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + " --- |" * len(header))
    lines += ["| " + " | ".join(row) + " |" for row in statistics_rows(stats)]
    return [*lines, "", *(f"- {note}" for note in statistics_notes(stats))]


def header_lines(result: WalkForwardResult) -> list[str]:
    """The title and what was run: trainer, windows, evaluation, executor."""
    cfg, spec = result.config, result.config.windows
    return [
        f"# Walk-forward: {cfg.name} ({result.label})",
        "",
        f"- Trainer: {cfg.trainer.algorithm.name}"
        + (f" from `{cfg.trainer_source}`" if cfg.trainer_source else "")
        + f", {cfg.trainer.total_timesteps} steps per window, dataset `{cfg.trainer.data.dataset}`",
        f"- Windows: {spec.start} .. {spec.end}, {'expanding' if spec.expanding else 'rolling'} "
        f"train {spec.train_periods} x `{spec.freq}`, test {spec.test_periods}, step "
        f"{spec.step}, purge {spec.purge_days} trading days",
        f"- Evaluation: exported ONNX model replayed through the serving path; {cfg.cost_bps:g} "
        f"bps costs; baselines {', '.join(cfg.baselines)} (fitted ones: `{cfg.baseline_fit}`)",
        f"- Executor: {cfg.executor}; {len(result.windows)} windows in {result.seconds:.1f} s"
        + (f"; recorded as walk-forward run {result.run_id}" if result.run_id is not None else ""),
    ]


def summary_lines(s: dict[str, Any]) -> list[str]:
    """The summary table (overall and per regime), the regime thresholds and the goals."""
    lines = [
        "## Summary",
        "",
        "| windows | regime | positive Sharpe | beats equal weight | median excess Sharpe "
        "| mean turnover | mean Sharpe |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    groups = [("all", s), *((g, s["by_regime"][g]) for g in ("bull", "sideways", "bear"))]
    for name, g in groups:
        lines.append(
            f"| {g['windows']} | {name} | {_pct(g['positive_sharpe'])} | "
            f"{_pct(g['beats_equal_weight'])} | {_fmt(g['median_excess_sharpe'])} | "
            f"{_fmt(g['mean_turnover'], '.4f')} | {_fmt(g['mean_sharpe'])} |"
        )
    t = s["regime_thresholds"]
    return [
        *lines,
        "",
        f"Regimes by equal weight's annualized net return on the test window: bull >= "
        f"{t['bull_above']:.0%}, bear < {t['bear_below']:.0%}, sideways in between.",
        "",
        "Goals: " + "; ".join(goal_text(k, v) for k, v in s["goals"].items()),
    ]


def window_lines(s: dict[str, Any]) -> list[str]:
    """One table row per window: spans, regime, the model's figures, its version."""
    lines = [
        "## Windows",
        "",
        "| window | train | test | regime | Sharpe | equal weight | excess | turnover "
        "| total return | max DD | version |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in s["per_window"]:
        lines.append(
            f"| w{r['index']:02d} | {r['train_start']} .. {r['train_end']} | {r['test_start']} "
            f".. {r['test_end']} | {r['regime']} | {_fmt(r['sharpe'])} | "
            f"{_fmt(r['equal_weight_sharpe'])} | {_fmt(r['excess_sharpe'])} | "
            f"{_fmt(r['turnover'], '.4f')} | {_fmt(r['total_return'], '+.1%')} | "
            f"{_fmt(r['max_drawdown'], '.1%')} | `{r['version']}` |"
        )
    return lines


def baseline_lines(s: dict[str, Any]) -> list[str]:
    """The model next to every baseline: mean Sharpe and fraction of positive windows."""
    lines = ["## Baselines (same windows, assets and costs)", ""]
    lines += ["| policy | mean Sharpe | positive Sharpe |", "| --- | --- | --- |"]
    lines.append(f"| agent | {_fmt(s['mean_sharpe'])} | {_pct(s['positive_sharpe'])} |")
    for name, b in s["baselines"].items():
        lines.append(f"| {name} | {_fmt(b['mean_sharpe'])} | {_pct(b['positive_sharpe'])} |")
    return lines


def icm_lines(windows: list[WindowResult]) -> list[str]:
    """Curiosity per test window (nothing when the model has no ICM)."""
    icm = [(w.window.label, w.icm) for w in windows if w.icm]
    if not icm:
        return []
    lines = ["## Curiosity (ICM) on the test windows", ""]
    lines += ["| window | mean | p95 | novelty vs training end |", "| --- | --- | --- | --- |"]
    for label, st in icm:
        lines.append(
            f"| {label} | {_fmt(st['mean'], '.4g')} | {_fmt(st['p95'], '.4g')} | "
            f"{_fmt(st.get('novelty_ratio'), '.2f')} |"
        )
    return lines


def render_markdown(result: WalkForwardResult, figures: dict[str, Path]) -> str:
    """The report's text: summary, regimes, goals, per-window table, baselines, figures."""
    s = result.summary
    sections = [
        header_lines(result),
        summary_lines(s),
        window_lines(s),
        statistics_lines(s.get("statistics")),
        baseline_lines(s),
        icm_lines(result.windows),
        ["## Figures", "", *(f"![{name}]({path.name})" for name, path in figures.items())],
    ]
    return "\n\n".join("\n".join(section) for section in sections if section) + "\n"


def stitched_results(windows: list[WindowResult]) -> dict[str, BacktestResult]:
    """The model, then every baseline that ran on all windows, each over all test windows."""
    names = [n for n in windows[0].baselines if all(n in w.baselines for w in windows)]
    return {
        AGENT: stitch([w.agent for w in windows], "agent (all test windows)"),
        **{n: stitch([w.baselines[n] for w in windows], n) for n in names},
    }


def excess_sharpe_figure(summary: dict[str, Any]) -> go.Figure:
    """Each window's excess Sharpe over equal weight with its interval, then the pooled one."""
    fig = go.Figure()
    for regime, color in REGIME_COLORS.items():
        rows = [r for r in summary["per_window"] if r["regime"] == regime]
        if not rows:
            continue
        fig.add_trace(
            go.Bar(
                x=[r["label"] for r in rows],
                y=[r["excess_sharpe"] for r in rows],
                name=regime,
                marker_color=color.removeprefix("tab:"),
                error_y=interval(rows),
            )
        )
    pooled = (summary.get("statistics") or {}).get(POOLED, {}).get("excess_sharpe")
    if pooled is not None:
        fig.add_trace(
            go.Scatter(
                x=[POOLED],
                y=[pooled["estimate"]],
                name=POOLED,
                mode="markers",
                marker={"color": "black", "size": 10},
                error_y=interval([pooled], key="estimate", low="low", high="high"),
            )
        )
    order = [r["label"] for r in summary["per_window"]] + ([POOLED] if pooled else [])
    fig.update_xaxes(categoryorder="array", categoryarray=order)
    fig.update_layout(
        title="Excess Sharpe over equal weight per test window, with its interval",
        yaxis_title="Sharpe - equal weight's",
        barmode="overlay",  # one bar per window: each regime's trace fills its own categories
        height=450,
    )
    return fig


def interval(
    rows: list[dict[str, Any]],
    key: str = "excess_sharpe",
    low: str = "excess_sharpe_low",
    high: str = "excess_sharpe_high",
) -> dict[str, Any] | None:
    """Asymmetric error bars from each row's interval; none when no row has one."""
    if all(r.get(low) is None for r in rows):
        return None
    return {
        "type": "data",
        "symmetric": False,
        "array": [None if r.get(high) is None else r[high] - r[key] for r in rows],
        "arrayminus": [None if r.get(low) is None else r[key] - r[low] for r in rows],
    }


def statistics_table(stats: dict[str, Any]) -> go.Figure:
    """The intervals and tests per window and pooled: the rows of ``report.md``'s table."""
    header = (*STATISTICS_HEADER, "deflated Sharpe")
    rows = statistics_rows(stats)
    fig = go.Figure(
        go.Table(
            header={"values": list(header), "align": "left"},
            cells={"values": [list(col) for col in zip(*rows, strict=True)], "align": "left"},
        )
    )
    fig.update_layout(title="Intervals and tests", height=120 + 28 * len(rows))
    return fig


def write_html_report(result: WalkForwardResult, folder: str | Path) -> Path | None:
    """``report.html`` in ``folder``; nothing when the run has no window to show."""
    if not result.windows:
        return None
    extra = {"excess-sharpe": excess_sharpe_figure(result.summary)}
    stats = result.summary.get("statistics")
    if stats:
        extra["statistics"] = statistics_table(stats)
    return write_backtest_report(
        Path(folder) / REPORT_FILE,
        stitched_results(result.windows),
        AGENT,
        title=f"Walk-forward: {result.config.name} ({result.label}), all test windows",
        extra=extra,
    )


def write_report(result: WalkForwardResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``summary.json`` and ``returns.csv`` in ``out_dir`` and ``report/`` beside them."""
    out = Path(out_dir)
    folder = out / "report"
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "summary": write_json(out / SUMMARY_FILE, summary_payload(result)),
        "returns": write_returns(returns_frame(result.windows), out),
    }
    figures: dict[str, Path] = {}
    if result.windows:
        figures["equity per window"] = plot_window_equity(result.windows, folder / "equity.png")
        figures["excess Sharpe"] = plot_excess_sharpe(
            result.summary["per_window"], folder / "excess_sharpe.png"
        )
        figures["allocations, raw vs smoothed"] = plot_allocations(
            stitched_results(result.windows)[AGENT], folder / "allocations.png"
        )
    files["report"] = folder / "report.md"
    files["report"].write_text(render_markdown(result, figures))
    files.update({p.stem: p for p in figures.values()})
    html = write_html_report(result, folder)
    if html is not None:
        files["html"] = html
    return files
