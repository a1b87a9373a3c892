"""Choosing the checkpoint to keep without looking ahead: the policy is backtested on an inner
span cut from the end of training (after a purge gap), so nothing after ``data.train_end``
influences the choice; the score is a backtest figure, not episode reward (no ``EvalCallback``).
A collapsed actor is never kept. ``fallback_level`` keeps the zero action unless the checkpoint
beats it with an interval above 0: the best of a dozen evaluations of noise looks like skill.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback

from allocator.artifacts.files import atomic_write_with, write_json
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.statistics.sharpe import excess_sharpe_interval
from allocator.trainer.training.config import SelectionSettings, TrainConfig
from allocator.trainer.training.inputs import InnerSplit, TrainingData
from allocator.trainer.training.policy_eval import Actor, ZeroAction, backtest_model
from allocator.trainer.training.run_dir import BEST_ICM_FILE, BEST_MODEL_FILE, SELECTION_FILE
from allocator.trainer.training.saturation import SaturationWatch

InnerBacktest = Callable[[Actor], BacktestResult]
"""A policy -> its backtest on the inner span."""

LOGGED = ("sharpe", "total_return", "max_drawdown", "turnover")
"""Inner-backtest figures logged at every evaluation, besides the selection metric."""


def inner_backtest(config: TrainConfig, data: TrainingData, split: InnerSplit) -> InnerBacktest:
    """The inner backtest of a policy: on the training span's prices only."""
    span = (split.inner_start, split.inner_end)

    def backtest(model: Actor) -> BacktestResult:
        return backtest_model(model, config, data.train, span, data.stats, data.feature_norm)[0]

    return backtest


@dataclass
class SelectionState:
    """Everything selection knows, as saved in ``selection.json`` and in every checkpoint."""

    metric: str
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    best_step: int | None = None
    best_score: float = -math.inf
    stale: int = 0
    last_eval_step: int = 0
    stopped_early: bool = False
    fallback: dict[str, Any] | None = None
    """The kept checkpoint against the zero action on the inner span (``fallback_level``)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["best_score"] = self.best_score if math.isfinite(self.best_score) else None
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SelectionState:
        raw = dict(raw)
        raw["best_score"] = -math.inf if raw.get("best_score") is None else raw["best_score"]
        return cls(**raw)


class SelectionCallback(BaseCallback):
    """Backtests the policy on the inner span every ``eval_every`` steps, saves the best and
    stops after ``patience`` stale evaluations."""

    def __init__(
        self,
        settings: SelectionSettings,
        backtest: InnerBacktest,
        run_dir: Path,
        split: InnerSplit,
        state: SelectionState | None,
        watch: SaturationWatch,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.backtest = backtest
        self.run_dir = Path(run_dir)
        self.split = split
        self.state = state or SelectionState(metric=settings.metric)
        self.watch = watch

    def _on_step(self) -> bool:
        if self.num_timesteps - self.state.last_eval_step < self.settings.eval_every:
            return True
        return self.evaluate()

    def evaluate(self) -> bool:
        """One inner backtest of the current policy; False when training should stop."""
        state, step = self.state, int(self.model.num_timesteps)
        metrics = self.score(self.model)
        score = float(metrics[self.settings.metric])
        saturation = self.watch.at_current_step()
        collapsed = saturation.collapsed
        evaluation = {"step": step, "score": score, "metrics": metrics}
        evaluation |= {"saturation": saturation.to_dict(), "collapsed": collapsed}
        improved = not collapsed and math.isfinite(score) and score > state.best_score
        state.evaluations.append(evaluation)
        state.last_eval_step = step
        if improved:
            self._save_best()
            state.best_step, state.best_score, state.stale = step, score, 0
        else:
            state.stale += 1
        patience = self.settings.patience
        state.stopped_early = bool(patience) and state.stale >= patience
        self._log(metrics, step)
        write_json(self.run_dir / SELECTION_FILE, self.to_dict())
        return not state.stopped_early

    def score(self, model: BaseAlgorithm) -> dict[str, float]:
        """The figures of ``model``'s inner backtest (``performance`` keys)."""
        return self.backtest(model).metrics()

    def keeps_zero_action(self, model: BaseAlgorithm, seed: int) -> bool:
        """Whether ``model``, the checkpoint kept, shows no skill over the zero action on the
        inner span at ``fallback_level`` (False when that is off); the test goes in the state."""
        level = self.settings.fallback_level
        if level is None:
            return False
        zero = ZeroAction(model.action_space.shape)
        excess = excess_sharpe_interval(
            self.backtest(model).returns, self.backtest(zero).returns, level=level, seed=seed
        )
        self.state.fallback = {**excess.to_dict(), "zero_action_kept": excess.low <= 0}
        write_json(self.run_dir / SELECTION_FILE, self.to_dict())
        return excess.low <= 0

    def _save_best(self) -> None:
        atomic_write_with(self.run_dir / BEST_MODEL_FILE, self.model.save)
        icm = getattr(self.model, "icm", None)
        if icm is not None:
            atomic_write_with(self.run_dir / BEST_ICM_FILE, icm.save)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        for key in (*LOGGED, self.settings.metric):
            self.logger.record(f"selection/inner_{key}", float(metrics[key]))
        self.logger.record("selection/best_score", self.state.best_score)
        self.logger.record("time/total_timesteps", step, exclude="tensorboard")
        self.logger.dump(step)

    def to_dict(self) -> dict[str, Any]:
        """``selection.json``: the settings, the split, every evaluation and the choice."""
        return {
            "settings": self.settings.model_dump(mode="json"),
            "split": self.split.to_dict(),
            **self.state.to_dict(),
        }

    def summary(self, last_step: int) -> dict[str, Any]:
        """Which step was kept and why, for ``run.json``."""
        s, state = self.settings, self.state
        n = len(state.evaluations)
        collapsed = sum(bool(e.get("collapsed")) for e in state.evaluations)
        span = f"{self.split.inner_start}..{self.split.inner_end}"
        if state.best_step is not None:
            reason = (
                f"step {state.best_step} had the highest inner {s.metric} "
                f"({state.best_score:.4g}) of {n} evaluations on {span}"
            )
            if collapsed:
                reason += f"; {collapsed} collapsed evaluation(s) were ineligible"
        elif n and collapsed == n:
            reason = (
                f"the actor was collapsed at all {n} evaluations on {span}, so none was "
                "eligible: kept the last model"
            )
        else:
            reason = f"no finite inner {s.metric} in {n} evaluations on {span}: kept the last model"
            if collapsed:
                reason += f" ({collapsed} of them ineligible, the actor collapsed)"
        warning = None
        if state.best_step is None and collapsed:  # the last model kept, for want of a sane one
            warning = f"WARNING: selection kept no checkpoint: {reason}"
        if state.stopped_early:
            reason += (
                f"; training stopped at step {last_step}, {s.patience} evaluation(s) "
                "without improvement"
            )
        test = state.fallback
        if test is not None and test["zero_action_kept"]:
            reason += (
                f"; the zero action kept instead: that model's inner excess Sharpe over it, "
                f"{test['estimate']:+.2f} [{test['low']:+.2f}, {test['high']:+.2f}] "
                f"({test['level']:.0%}), does not lie above 0"
            )
        return {
            "metric": s.metric,
            "chosen_step": state.best_step if state.best_step is not None else last_step,
            "chosen_score": state.best_score if state.best_step is not None else None,
            "last_step": last_step,
            "evaluations": n,
            "collapsed_evaluations": collapsed,
            "stopped_early": state.stopped_early,
            "inner_span": [str(self.split.inner_start), str(self.split.inner_end)],
            "fit_end": str(self.split.fit_end),
            "purge_days": self.split.purge_days,
            "reason": reason,
            **({"fallback": test} if test is not None else {}),
            **({"warning": warning} if warning else {}),
        }
