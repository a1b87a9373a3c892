"""One suite run: train the recipe on one draw of one market and score it beside its yardsticks
on the same held-out days, assets, costs and smoothing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from allocator.trainer.jobs.json_safe import finite
from allocator.trainer.market.data import MarketData, load_dataset
from allocator.trainer.market.draws import SP500_DEV
from allocator.trainer.market.generated import GeneratedMarket, market
from allocator.trainer.sim.backtest import BacktestResult, run_backtest
from allocator.trainer.sim.baselines import AnchorPolicy, EqualWeight, Policy
from allocator.trainer.sim.ceilings import ceiling_for
from allocator.trainer.sim.rule_selection import select_simple_rule
from allocator.trainer.training.audit import SATURATION_FILE, backtest_saturation
from allocator.trainer.training.config import UNION_TAGS, TrainConfig, merged
from allocator.trainer.training.policy_eval import SeedEnsemble, backtest_model
from allocator.trainer.training.run import TrainingRun, train
from allocator.typed_config import validate

MEMBER_SEED_STRIDE = 1000
"""Seed distance between the runs of one draw's ensemble: no member shares another draw's seed."""


@dataclass(frozen=True)
class SuiteJob:
    """Everything one draw needs, picklable: its trainer settings already resolved."""

    kind: str
    draw: int
    trainer: dict[str, Any]
    rules: dict[str, list[int]]
    run_dir: str
    seeds: int = 1

    def member_dirs(self) -> list[Path]:
        """The runs' folders: the first is ``run_dir``, the others beside it (``-m1``, ...)."""
        return [Path(f"{self.run_dir}-m{i}" if i else self.run_dir) for i in range(self.seeds)]


def job_label(job: SuiteJob) -> str:
    return f"suite run {job.kind} draw {job.draw}"


def draw_settings(kind: str, draw: int) -> dict[str, Any]:
    """The trainer keys a market's draw fixes: its dataset and its spans."""
    keys = ("dataset", "train_start", "train_end", "validation_start", "validation_end")
    if kind == SP500_DEV:  # the draw is a test year; five years of training before it
        first, last = f"{draw - 5}-01-01", f"{draw - 1}-12-31"
        values: tuple[Any, ...] = ("sp500", first, last, f"{draw}-01-01", f"{draw}-12-31")
    else:
        m = market(kind)
        values = (m.dataset(draw), m.train_start, m.train_end, m.validation_start, m.validation_end)
    return {"data": dict(zip(keys, values, strict=True))}


def job_trainer(
    recipe: dict[str, Any], kind: str, draw: int, changes: dict[str, Any], seed_per_draw: bool
) -> dict[str, Any]:
    """The recipe (a JSON dump of its ``TrainConfig``) with the market's changes and the draw's
    dataset and spans; the training seed moves with the draw when ``seed_per_draw``."""
    tree = merged(merged(recipe, changes), draw_settings(kind, draw))
    tree["data"]["assets"] = None if kind != SP500_DEV else tree["data"].get("assets")
    if seed_per_draw:
        tree["seed"] = int(recipe.get("seed", 0)) + draw
    tree.update(name=f"{kind}-{draw}", progress_bar=False, tensorboard=False, html_report=False)
    return tree


def run_job(job: SuiteJob) -> dict[str, Any]:
    """Train the draw's runs and score them: the row the suite's report aggregates."""
    config = validate(TrainConfig, job.trainer, job_label(job), tags=UNION_TAGS)
    runs = [
        train(config.model_copy(update={"seed": config.seed + i * MEMBER_SEED_STRIDE}), run_dir)
        for i, run_dir in enumerate(job.member_dirs())
    ]
    return score_run(runs, load_dataset(config.data.dataset), job)


def held_out_ensemble(
    runs: Sequence[TrainingRun], data: MarketData
) -> tuple[BacktestResult, dict[str, Any]]:
    """The seed ensemble of ``runs`` on their held-out days by the path of each run's own
    validation (an ensemble of one is that validation), and the saturation of its actions."""
    first = runs[0]
    span = (first.config.data.validation_start, first.config.data.validation_end)
    ensemble = SeedEnsemble([run.model for run in runs])
    result, actions = backtest_model(
        ensemble, first.config, data, span, first.stats, first.feature_norm
    )
    return result, backtest_saturation(first.config, result, actions)


def held_out(run: TrainingRun, data: MarketData, policy: Policy) -> BacktestResult:
    """``policy`` on the run's held-out days with its assets, costs, smoothing and
    representation (the tilt mapping the anchor needs, the statistics fitted in training)."""
    cfg, env = run.config, run.config.env
    return run_backtest(
        policy,
        data,
        start=cfg.data.validation_start,
        end=cfg.data.validation_end,
        assets=run.validation[cfg.algorithm.name].settings["assets"],
        cost_bps=env.cost_bps,
        beta=env.beta,
        max_assets=env.max_assets,
        stats=run.stats,
        env_config=env,
        feature_norm=run.feature_norm,
    )


def best_simple_rule(run: TrainingRun, data: MarketData, rules: dict[str, list[int]]) -> Any:
    """The best top-k momentum or reversal rule on the run's training span only, from the
    first date where every held-out asset has the longest lookback's closes: the held-out
    days never take part."""
    cfg = run.config
    assets = run.validation[cfg.algorithm.name].settings["assets"]
    longest = max([*rules["momentum_lookbacks"], *rules["reversal_lookbacks"]])
    first = int(data.select(assets).first_valid().max())  # the last of them to list
    start = max(pd.Timestamp(cfg.data.train_start), data.dates[first + longest])
    return select_simple_rule(
        data,
        start,
        cfg.data.train_end,
        momentum_lookbacks=rules["momentum_lookbacks"],
        reversal_lookbacks=rules["reversal_lookbacks"],
        ks=[k for k in rules["ks"] if k <= len(assets)],
        cost_bps=cfg.env.cost_bps,
        beta=cfg.env.beta,
        assets=assets,
    )


def saturation(run_dir: Path) -> dict[str, float | None]:
    """Near-bound share of the policy's actions on held-out days: overall and the worst live
    action dimension (``action_saturation.json``)."""
    path = run_dir / SATURATION_FILE
    if not path.is_file():  # a run too short to audit; a damaged audit is an error, not a pass
        return {"near_bound": None, "near_bound_max_dim": None}
    return near_bound(json.loads(path.read_text()))


def near_bound(audit: dict[str, Any]) -> dict[str, float | None]:
    """An action-saturation audit's near-bound share: overall and the worst live dimension."""
    per_dim = [x for x in audit.get("near_bound_ratio_per_dim", []) if x is not None]
    return {
        "near_bound": float(audit["near_bound_ratio"]),
        "near_bound_max_dim": float(max(per_dim)) if per_dim else None,
    }


def score_run(runs: Sequence[TrainingRun], data: MarketData, job: SuiteJob) -> dict[str, Any]:
    """The row of one draw: Sharpe net of costs and turnover of the policy (one run, or the
    seed ensemble of several) and its yardsticks on the held-out days, and its saturation."""
    run = runs[0]
    cfg = run.config
    members = [r.validation[cfg.algorithm.name] for r in runs]
    if len(runs) == 1:
        policy, bound = members[0], saturation(run.run_dir)
    else:
        policy, audit = held_out_ensemble(runs, data)
        bound = near_bound(audit)
    anchor = held_out(run, data, AnchorPolicy()) if cfg.env.action.mapping == "tilt" else None
    choice = best_simple_rule(run, data, job.rules)
    spec: GeneratedMarket | None = None if job.kind == SP500_DEV else market(job.kind)
    ceiling_policy = ceiling_for(spec, job.draw) if spec is not None else None
    ceiling = held_out(run, data, ceiling_policy) if ceiling_policy is not None else None
    row: dict[str, Any] = {
        "market": job.kind,
        "draw": job.draw,
        "seed": cfg.seed,
        "signal": spec.signal if spec is not None else False,
        "rule": repr(choice.rule),
        "rule_training_sharpe": finite(choice.sharpe),
        "run_dir": job.run_dir,
        "train_seconds": sum(r.summary.get("train_seconds") or 0.0 for r in runs),
        "member_sharpes": [finite(m.metrics()["sharpe"]) for m in members],
    }
    results = {
        "policy": policy,
        "anchor": anchor,
        "equal_weight": held_out(run, data, EqualWeight()),
        "rule": held_out(run, data, choice.rule),
        "ceiling": ceiling,
    }
    for name, result in results.items():
        metrics = result.metrics() if result is not None else {}
        row.update({f"{name}_{k}": finite(metrics.get(k)) for k in ("sharpe", "turnover")})
    row.update(bound)
    return row
