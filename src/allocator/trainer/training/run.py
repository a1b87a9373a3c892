"""One training run, start to finish: data split, environment, algorithm, artifacts, audits."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, ConvertCallback
from stable_baselines3.common.logger import configure
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.utils import LinearSchedule as SB3LinearSchedule
from stable_baselines3.common.utils import get_device, set_random_seed

from allocator.artifacts.files import atomic_write_with, write_json
from allocator.artifacts.manifest import write_manifest
from allocator.portfolio import FeatureNormalization, NormalizationStats
from allocator.trainer import require_extra
from allocator.trainer.agents.algorithms import zero_actions
from allocator.trainer.agents.noise import NoiseAnnealingCallback, make_action_noise
from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.shared_policies import SharedSACPolicy, SharedTD3Policy
from allocator.trainer.agents.td3 import SmoothTD3
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.sim.baselines import ANCHOR
from allocator.trainer.sim.html_report import REPORT_FILE, write_backtest_report
from allocator.trainer.sim.plots import plot_allocations, plot_performance, plot_training_curves
from allocator.trainer.training.audit import write_audits
from allocator.trainer.training.callbacks import TurnoverCallback
from allocator.trainer.training.checkpointing import (
    CheckpointCallback,
    TrainingStoppedError,
    copy_best,
    keep_progress_before,
    latest_checkpoint,
    load_icm,
    merge_progress,
    restore_model,
    resume_config,
    write_checkpoint,
)
from allocator.trainer.training.config import (
    LearningRate,
    LinearSchedule,
    SACSettings,
    TD3Settings,
    TrainConfig,
    dump_config,
    load_config,
)
from allocator.trainer.training.host import host_info
from allocator.trainer.training.inputs import TrainingData, make_env, prepare_data
from allocator.trainer.training.policy_eval import excess_over, validate_policy
from allocator.trainer.training.run_dir import (
    BEST_ICM_FILE,
    BEST_MODEL_FILE,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    FEATURE_NORMALIZATION_FILE,
    ICM_FILE,
    LAST_ICM_FILE,
    LAST_MODEL_FILE,
    MODEL_FILE,
    NORMALIZATION_FILE,
    RUN_SUMMARY_FILE,
    SELECTION_FILE,
    VALIDATION_FILE,
    build_manifest,
    fresh_path,
)
from allocator.trainer.training.saturation import make_watch
from allocator.trainer.training.selection import SelectionCallback, SelectionState, inner_backtest
from allocator.trainer.training.tracking import (
    MLflowOutputFormat,
    ended_on_error,
    log_finished,
    open_job_run,
    require_mlflow,
)
from allocator.typed_config import ConfigError


@dataclass
class TrainingRun:
    """Where a finished run lives and what it measured."""

    run_dir: Path
    model: BaseAlgorithm
    config: TrainConfig
    stats: NormalizationStats
    validation: dict[str, BacktestResult]
    summary: dict[str, Any]
    feature_norm: FeatureNormalization | None = None


def _schedule(lr: LearningRate) -> Any:
    if isinstance(lr, LinearSchedule):
        return SB3LinearSchedule(lr.start, lr.end, lr.end_fraction)
    return lr


def _policy(config: TrainConfig) -> tuple[Any, dict[str, Any]]:
    """The SB3 policy (class or name) and its keyword arguments for ``config.policy``."""
    algo = config.algorithm
    if config.policy == "mlp":
        return "MlpPolicy", {"net_arch": list(algo.net_arch)}
    cls = SharedTD3Policy if isinstance(algo, TD3Settings) else SharedSACPolicy
    shared = config.shared
    kwargs = {"n_features": config.env.n_features, "hidden": shared.hidden}
    if shared.center_assets:  # only when on: a policy saved without the key loads uncentred
        kwargs["center_assets"] = True
    return cls, kwargs


def build_model(config: TrainConfig, env: Any) -> BaseAlgorithm:
    """The configured SB3 algorithm on ``env`` (CPU by default, CUDA when present)."""
    algo = config.algorithm
    policy, policy_kwargs = _policy(config)
    sb3 = "gamma batch_size buffer_size learning_starts tau train_freq gradient_steps"
    common: dict[str, Any] = {
        **algo.model_dump(include=set(sb3.split())),
        "policy_kwargs": policy_kwargs,
        "actor_learning_rate": _schedule(algo.actor_learning_rate),
        "critic_learning_rate": _schedule(algo.critic_learning_rate),
        "icm": config.icm,
        "seed": config.seed,
        "device": get_device(config.device),
        "verbose": 0,
    }
    if isinstance(algo, TD3Settings):
        td3 = (
            "critic_loss huber_delta max_grad_norm policy_delay target_policy_noise "
            "target_noise_clip"
        )
        return SmoothTD3(
            policy,
            env,
            **algo.model_dump(include=set(td3.split())),
            smoothness=algo.smoothness,
            action_bound=algo.action_bound,
            action_noise=make_action_noise(config.noise, env.action_space.shape[0]),
            **common,
        )
    assert isinstance(algo, SACSettings)
    return SmoothSAC(policy, env, ent_coef=algo.ent_coef, **common)


def _seed(config: TrainConfig, offset: int) -> None:
    set_random_seed(config.seed + offset)
    if config.torch_threads:
        th.set_num_threads(config.torch_threads)


def _copy(src: Path, dst: Path) -> None:
    atomic_write_with(dst, lambda tmp: shutil.copyfile(src, tmp))


class TrainingSession:
    """A run in progress: its data, model and callbacks, started fresh or from a checkpoint;
    ``learn(until=...)`` stops early, as a crash would."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        data: TrainingData,
        model: OffPolicyAlgorithm,
        state: dict[str, Any],
    ) -> None:
        self.config, self.run_dir, self.data, self.model = config, run_dir, data, model
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.resumed_from: list[int] = list(state.get("resumed_from", []))
        self.session_steps, self.session_seconds = 0, 0.0
        self._learning_since: float | None = None
        if config.tensorboard:  # SB3's tensorboard output: a clear error when it is missing
            require_extra("tensorboard", "tensorboard", "tensorboard: true (false: CSV logs only)")
        logger = configure(str(run_dir), ["csv", "tensorboard"] if config.tensorboard else ["csv"])
        params = config.model_dump(mode="json")  # None: not tracked
        self.tracked = open_job_run(config.tracking, run_dir, run_dir.name, params, bool(state))
        if self.tracked is not None:
            logger.output_formats.append(MLflowOutputFormat(self.tracked))
        model.set_logger(logger)
        self.callbacks: list[BaseCallback] = [TurnoverCallback()]
        if isinstance(config.algorithm, TD3Settings):
            # The schedule's position is the model's own step count, so it survives a resume.
            self.callbacks.append(NoiseAnnealingCallback(config.noise, config.total_timesteps))
        self.watch = make_watch(config, data, state)
        self.watch.init_callback(model)  # ``finish`` checks the last model without ``learn``
        self.callbacks.append(self.watch)  # before selection, which reuses a check at its step
        self.selection: SelectionCallback | None = None
        if data.split is not None:
            saved = state.get("selection")
            self.selection = SelectionCallback(
                config.selection,
                inner_backtest(config, data, data.split),
                run_dir,
                data.split,
                SelectionState.from_dict(saved) if saved else None,
                watch=self.watch,
            )
            self.selection.init_callback(model)  # ``finish`` may evaluate without ``learn``
            self.callbacks.append(self.selection)
        if config.checkpoint_every:
            self.callbacks.append(
                CheckpointCallback(
                    run_dir, config.checkpoint_every, self.checkpoint_state, model.num_timesteps
                )
            )

    @classmethod
    def start(cls, config: TrainConfig, run_dir: Path | None = None) -> TrainingSession:
        """A new run: data cut, statistics fitted, config written, a fresh model."""
        if config.tracking.enabled:
            require_mlflow()  # before the data: a missing extra fails at once
        _seed(config, 0)
        data = prepare_data(config)
        fresh = run_dir is None  # a directory of its own, never one a concurrent run just made
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = run_dir or fresh_path(Path(config.output_dir) / f"{config.name}-{stamp}")
        run_dir.mkdir(parents=True, exist_ok=not fresh)
        (run_dir / CONFIG_FILE).write_text(dump_config(config))
        model = build_model(config, make_env(config, data))
        assert isinstance(model, OffPolicyAlgorithm)
        return cls(config, run_dir, data, model, {})

    @classmethod
    def resume(cls, run_dir: Path, config: TrainConfig | None = None) -> TrainingSession:
        """The run in ``run_dir`` from its last checkpoint, with its own config (``config``
        may differ only in ``RESUME_FREE_KEYS``); a finished run is refused."""
        run_dir = Path(run_dir)
        config = resume_config(load_config(run_dir / CONFIG_FILE), config, run_dir)
        if (run_dir / RUN_SUMMARY_FILE).exists():
            raise ConfigError(
                f"{run_dir}: the run finished ({RUN_SUMMARY_FILE}); nothing to resume"
            )
        checkpoint = latest_checkpoint(run_dir)
        done = checkpoint.num_timesteps
        _seed(config, done)  # a new stream: not the first session's draws again
        data = prepare_data(config)
        model = restore_model(config, make_env(config, data), checkpoint)
        model.set_random_seed(config.seed + done)
        copy_best(checkpoint.path, run_dir)  # a later best belongs to steps about to be redone
        keep_progress_before(run_dir, done)
        state = {
            **checkpoint.state,
            "resumed_from": [*checkpoint.state.get("resumed_from", []), done],
        }
        return cls(config, run_dir, data, model, state)

    @property
    def finished(self) -> bool:
        stopped = self.selection is not None and self.selection.state.stopped_early
        return stopped or self.model.num_timesteps >= self.config.total_timesteps

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the model: seconds, resumes, selection."""
        since = self._learning_since
        running = 0.0 if since is None else time.perf_counter() - since
        buffer = self.model.replay_buffer
        return {
            "train_seconds": self.train_seconds + running,
            "resumed_from": self.resumed_from,
            "replay_buffer_size": int(buffer.size()) if buffer is not None else 0,
            "smooth_lambda": float(getattr(self.model, "smooth_lambda", 0.0)),
            "selection": self.selection.state.to_dict() if self.selection else None,
            "saturation_watch": asdict(self.watch.state),
        }

    def learn(self, until: int | None = None, stop: threading.Event | None = None) -> None:
        """Train to ``total_timesteps`` (or to step ``until``), continuing the step count; a
        ``stop`` set meanwhile checkpoints and raises ``TrainingStoppedError``."""
        model = self.model
        if self.finished:
            return
        # A callback answering False ends ``learn`` after that step: between steps the model,
        # buffer and schedules agree, so it can be checkpointed.
        callbacks = list(self.callbacks)
        if until is not None:  # schedules still span the full budget, as in an interruption
            callbacks.append(ConvertCallback(lambda *_: model.num_timesteps < until))
        if stop is not None:
            callbacks.append(ConvertCallback(lambda *_: not stop.is_set()))
        first = model.num_timesteps
        self._learning_since = time.perf_counter()
        model.learn(
            self.config.total_timesteps - first,
            callback=callbacks,
            progress_bar=self.config.progress_bar,
            log_interval=1,
            reset_num_timesteps=False,
        )
        seconds = time.perf_counter() - self._learning_since
        self._learning_since = None
        if not self.finished:
            model._last_obs = None  # stopped by ``until``: its transition was never stored
        self.train_seconds += seconds
        self.session_seconds += seconds
        self.session_steps += model.num_timesteps - first
        if stop is not None and stop.is_set() and not self.finished:
            checkpoint = write_checkpoint(self.run_dir, model, self.checkpoint_state())
            raise TrainingStoppedError(self.run_dir, int(model.num_timesteps), checkpoint)

    def complete(
        self, callbacks: Sequence[BaseCallback] = (), stop: threading.Event | None = None
    ) -> TrainingRun:
        """``learn`` to the end, then ``finish``; a run that raises is marked so in MLflow."""
        self.callbacks.extend(callbacks)
        with ended_on_error(self.tracked):
            self.learn(stop=stop)
            return self.finish()

    def _keep_models(self) -> BaseAlgorithm:
        """Save the model(s); with selection, ``model.zip`` is the best and is what returns."""
        model, run_dir, selection = self.model, self.run_dir, self.selection
        icm = getattr(model, "icm", None)
        saved = (MODEL_FILE, ICM_FILE) if selection is None else (LAST_MODEL_FILE, LAST_ICM_FILE)
        model.save(run_dir / saved[0])
        if icm is not None:
            icm.save(run_dir / saved[1])
        if selection is None:
            return model
        kept = (BEST_MODEL_FILE, BEST_ICM_FILE) if selection.state.best_step is not None else saved
        _copy(run_dir / kept[0], run_dir / MODEL_FILE)
        if icm is not None:
            _copy(run_dir / kept[1], run_dir / ICM_FILE)
        chosen = type(model).load(run_dir / MODEL_FILE, device=model.device)
        load_icm(chosen, run_dir / ICM_FILE)
        if selection.keeps_zero_action(chosen, self.config.seed):
            zero_actions(chosen.actor)
            chosen.save(run_dir / MODEL_FILE)
        return chosen

    def finish(self) -> TrainingRun:
        """Keep the model, then validate, audit, plot and describe it in run.json and manifest."""
        config, run_dir, data, model = self.config, self.run_dir, self.data, self.model
        if self.selection is not None:
            if self.selection.state.last_eval_step != model.num_timesteps:
                self.selection.evaluate()  # the last model gets its score too
            # written again: a resumed run's file may list evaluations it undid
            write_json(run_dir / SELECTION_FILE, self.selection.to_dict())
        self.watch.at_current_step()  # and its saturation, with or without selection
        chosen = self._keep_models()
        write_json(run_dir / NORMALIZATION_FILE, data.stats.to_dict())
        if data.feature_norm is not None:
            write_json(
                run_dir / FEATURE_NORMALIZATION_FILE,
                {"spec": config.env.asset_feature_spec.to_dict(), **data.feature_norm.to_dict()},
            )
        validation, actions = validate_policy(
            chosen, config, data.data, data.stats, data.feature_norm
        )
        metrics = write_validation(run_dir, config, data, validation, actions)
        merge_progress(run_dir)
        progress = run_dir / "progress.csv"
        if progress.exists() and progress.stat().st_size > 0:
            plot_training_curves(pd.read_csv(progress), run_dir / "training_curves.png")
        summary = self.summary(chosen, metrics)
        write_json(run_dir / RUN_SUMMARY_FILE, summary)
        fallback = self.selection.state.fallback if self.selection else None
        holds_anchor = bool(fallback and fallback["zero_action_kept"])
        assets = list(data.train.assets)
        manifest = build_manifest(config, data.stats, assets, metrics, run_dir, holds_anchor)
        write_manifest(run_dir, manifest)
        shutil.rmtree(run_dir / CHECKPOINTS_DIR, ignore_errors=True)  # the run is complete
        if self.tracked is not None:
            log_finished(self.tracked, run_dir, summary)
        return TrainingRun(
            run_dir, chosen, config, data.stats, validation, summary, data.feature_norm
        )

    def summary(self, chosen: BaseAlgorithm, metrics: dict[str, Any]) -> dict[str, Any]:
        """``run.json``: what ran, how fast, what was kept and why, and how it validated."""
        model, config = self.model, self.config
        buffer = model.replay_buffer
        out: dict[str, Any] = {
            "algorithm": config.algorithm.name,
            "total_timesteps": config.total_timesteps,
            "timesteps": int(model.num_timesteps),
            "train_seconds": round(self.train_seconds, 2),
            "steps_per_second": round(self.session_steps / max(self.session_seconds, 1e-9), 1),
            "device": str(model.device),
            "host": host_info(),
            "smooth_lambda": float(getattr(chosen, "smooth_lambda", 0.0)),
            "replay_buffer_size": int(buffer.size()) if buffer is not None else 0,
            "validation": metrics,
        }
        if self.resumed_from:
            out["resumed_from"] = self.resumed_from
        if self.selection is not None:
            out["selection"] = self.selection.summary(int(model.num_timesteps))
        out["saturation_watch"] = self.watch.summary()
        return out


def write_validation(
    run_dir: Path,
    config: TrainConfig,
    data: TrainingData,
    validation: dict[str, BacktestResult],
    actions: np.ndarray,
) -> dict[str, Any]:
    """validation.json, its PNGs and report.html, the validation path's audits; returns metrics."""
    algorithm = config.algorithm.name
    agent = validation[algorithm]
    write_audits(run_dir, config, data, agent, actions)
    metrics = {name: res.metrics() for name, res in validation.items()}
    payload: dict[str, Any] = {
        "period": [config.data.validation_start, config.data.validation_end],
        "assets": agent.settings["assets"],
        "metrics": metrics,
    }
    for key, benchmark in (("equal_weight", "equal-weight"), ("anchor", ANCHOR)):
        if benchmark in validation:
            excess = excess_over(validation, algorithm, benchmark, config.seed)
            payload[f"excess_sharpe_vs_{key}"] = excess.to_dict()
    payload["allocation"] = agent.allocation_summary()
    write_json(run_dir / VALIDATION_FILE, payload)
    plot_performance(validation, run_dir / "validation.png")
    plot_allocations(agent, run_dir / "validation_allocations.png")
    if config.html_report:
        write_backtest_report(run_dir / REPORT_FILE, validation, algorithm)
    return metrics


def train(
    config: TrainConfig,
    run_dir: Path | None = None,
    callbacks: Sequence[BaseCallback] = (),
    stop: threading.Event | None = None,
) -> TrainingRun:
    """Train, save and audit one run; ``callbacks`` join the run's own, and ``stop`` set while
    it learns ends the run at a checkpoint (``TrainingStoppedError``)."""
    return TrainingSession.start(config, run_dir).complete(callbacks, stop)


def resume(
    run_dir: Path,
    config: TrainConfig | None = None,
    stop: threading.Event | None = None,
    callbacks: Sequence[BaseCallback] = (),
) -> TrainingRun:
    """Continue a run that did not finish from its last checkpoint, to ``total_timesteps``."""
    return TrainingSession.resume(run_dir, config).complete(callbacks, stop)
