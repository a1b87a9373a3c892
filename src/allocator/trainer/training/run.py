"""One training run, start to finish: data split, environment, algorithm, artifacts, audits.

The run directory holds everything needed to judge and reuse the run: the SB3 model, the ICM
weights, normalization statistics, the resolved config, the state-scale and saturation audits,
TensorBoard logs, the training curves, and a validation backtest next to equal weight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.utils import LinearSchedule as SB3LinearSchedule
from stable_baselines3.common.utils import get_device, set_random_seed

from allocator.artifacts.files import write_json
from allocator.artifacts.manifest import write_manifest
from allocator.portfolio import (
    FeatureNormalization,
    NormalizationStats,
    fit_feature_normalization,
    fit_normalization,
)
from allocator.trainer.agents.noise import NoiseAnnealingCallback, make_action_noise
from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.shared_policies import SharedSACPolicy, SharedTD3Policy
from allocator.trainer.agents.td3 import SmoothTD3
from allocator.trainer.market.data import MarketData, load_dataset
from allocator.trainer.sim.backtest import BacktestResult, default_assets, run_backtest
from allocator.trainer.sim.baselines import ActionPolicy
from allocator.trainer.sim.env import PortfolioEnv
from allocator.trainer.sim.plots import plot_allocations, plot_performance, plot_training_curves
from allocator.trainer.training.audit import action_saturation, state_scale_summary
from allocator.trainer.training.callbacks import TurnoverCallback
from allocator.trainer.training.config import (
    LearningRate,
    LinearSchedule,
    SACSettings,
    TD3Settings,
    TrainConfig,
    dump_config,
)
from allocator.trainer.training.run_dir import (
    CONFIG_FILE,
    FEATURE_NORMALIZATION_FILE,
    ICM_FILE,
    MODEL_FILE,
    NORMALIZATION_FILE,
    VALIDATION_FILE,
    build_manifest,
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
    return cls, {"n_features": config.env.n_features, "hidden": config.shared.hidden}


def build_model(config: TrainConfig, env: Any, tensorboard_dir: Path | None) -> BaseAlgorithm:
    """The configured SB3 algorithm on ``env`` (CPU by default, CUDA when present)."""
    algo = config.algorithm
    policy, policy_kwargs = _policy(config)
    common: dict[str, Any] = {
        "gamma": algo.gamma,
        "batch_size": algo.batch_size,
        "buffer_size": algo.buffer_size,
        "learning_starts": algo.learning_starts,
        "tau": algo.tau,
        "train_freq": algo.train_freq,
        "gradient_steps": algo.gradient_steps,
        "policy_kwargs": policy_kwargs,
        "actor_learning_rate": _schedule(algo.actor_learning_rate),
        "critic_learning_rate": _schedule(algo.critic_learning_rate),
        "icm": config.icm,
        "seed": config.seed,
        "device": get_device(config.device),
        "tensorboard_log": str(tensorboard_dir) if tensorboard_dir else None,
        "verbose": 0,
    }
    if isinstance(algo, TD3Settings):
        return SmoothTD3(
            policy,
            env,
            critic_loss=algo.critic_loss,
            huber_delta=algo.huber_delta,
            max_grad_norm=algo.max_grad_norm,
            smoothness=algo.smoothness,
            policy_delay=algo.policy_delay,
            target_policy_noise=algo.target_policy_noise,
            target_noise_clip=algo.target_noise_clip,
            action_noise=make_action_noise(config.noise, env.action_space.shape[0]),
            **common,
        )
    assert isinstance(algo, SACSettings)
    return SmoothSAC(policy, env, ent_coef=algo.ent_coef, **common)


def _universe(config: TrainConfig, data: MarketData) -> MarketData:
    if config.data.assets:
        if len(config.data.assets) > config.env.max_assets:
            raise ConfigError(
                f"data.assets lists {len(config.data.assets)} assets but env.max_assets is "
                f"{config.env.max_assets}"
            )
        return data.select(config.data.assets)
    return data


def _make_run_dir(config: TrainConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(config.output_dir) / f"{config.name}-{stamp}"
    run_dir, i = base, 1
    while run_dir.exists():
        run_dir, i = Path(f"{base}-{i}"), i + 1
    run_dir.mkdir(parents=True)
    return run_dir


def validate_policy(
    model: BaseAlgorithm,
    config: TrainConfig,
    data: MarketData,
    stats: NormalizationStats,
    feature_norm: FeatureNormalization | None = None,
) -> tuple[dict[str, BacktestResult], np.ndarray]:
    """Backtest the deterministic policy and equal weight on the validation period."""
    d, env_cfg = config.data, config.env
    t0 = data.date_index(d.validation_start, "left")
    t1 = data.date_index(d.validation_end, "right")
    assets = default_assets(data, t0 - env_cfg.history, t1)[: env_cfg.max_assets]
    actions: list[np.ndarray] = []

    def actor(obs: np.ndarray) -> np.ndarray:
        action, _ = model.predict(obs, deterministic=True)
        actions.append(np.asarray(action))
        return action

    common = {
        "data": data,
        "start": d.validation_start,
        "end": d.validation_end,
        "assets": assets,
        "cost_bps": env_cfg.cost_bps,
        "window": env_cfg.window,
    }
    # The policy sees the representation it was trained with; equal weight needs none of it.
    agent = run_backtest(
        ActionPolicy(actor, name=config.algorithm.name),
        beta=env_cfg.beta,
        max_assets=env_cfg.max_assets,
        stats=stats,
        env_config=None if env_cfg.is_default_representation else env_cfg,
        feature_norm=feature_norm,
        **common,
    )
    equal = run_backtest("equal-weight", beta=0.0, **common)
    return {agent.name: agent, "equal-weight": equal}, np.asarray(actions)


def write_audits(
    run_dir: Path,
    config: TrainConfig,
    train_data: MarketData,
    stats: NormalizationStats,
    agent: BacktestResult,
    actions: np.ndarray,
) -> None:
    """The state-scale and action-saturation audits of the validation path."""
    scale = state_scale_summary(
        train_data.prices, stats, config.env.obs_clip, agent.executed_weights.to_numpy()
    )
    write_json(run_dir / "state_scale_summary.json", scale)
    live = np.arange(actions.shape[1]) <= len(agent.settings["assets"])  # cash, then the assets
    action = config.env.action
    saturation = action_saturation(actions, mask=live, mapping=action.mapping, k=action.k)
    write_json(run_dir / "action_saturation.json", saturation)


def train(config: TrainConfig, run_dir: Path | None = None) -> TrainingRun:
    """Train, save and audit one run; returns where it went and what it measured."""
    set_random_seed(config.seed)
    if config.torch_threads:
        th.set_num_threads(config.torch_threads)
    data = _universe(config, load_dataset(config.data.dataset))
    train_data = data.between(config.data.train_start, config.data.train_end)
    stats = fit_normalization(train_data.prices, axis=0)  # training period only
    feature_norm = None
    if config.env.features == "asset_v1":  # training period only, too
        feature_norm = fit_feature_normalization(train_data.prices, config.env.asset_feature_spec)
    run_dir = run_dir or _make_run_dir(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(dump_config(config))

    env = Monitor(PortfolioEnv(train_data, config.env, stats=stats, feature_norm=feature_norm))
    model = build_model(config, env, None)
    formats = ["csv", "tensorboard"] if config.tensorboard else ["csv"]
    model.set_logger(configure(str(run_dir), formats))
    callbacks = [TurnoverCallback()]
    if isinstance(config.algorithm, TD3Settings):
        callbacks.append(NoiseAnnealingCallback(config.noise, config.total_timesteps))
    started = time.perf_counter()
    model.learn(
        config.total_timesteps, callback=callbacks, progress_bar=config.progress_bar, log_interval=1
    )
    seconds = time.perf_counter() - started

    model.save(run_dir / MODEL_FILE)
    icm = getattr(model, "icm", None)
    if icm is not None:
        icm.save(run_dir / ICM_FILE)
    write_json(run_dir / NORMALIZATION_FILE, stats.to_dict())
    if feature_norm is not None:
        write_json(
            run_dir / FEATURE_NORMALIZATION_FILE,
            {"spec": config.env.asset_feature_spec.to_dict(), **feature_norm.to_dict()},
        )

    validation, actions = validate_policy(model, config, data, stats, feature_norm)
    agent = validation[config.algorithm.name]
    write_audits(run_dir, config, train_data, stats, agent, actions)
    metrics = {name: res.metrics() for name, res in validation.items()}
    write_json(
        run_dir / VALIDATION_FILE,
        {
            "period": [config.data.validation_start, config.data.validation_end],
            "assets": agent.settings["assets"],
            "metrics": metrics,
        },
    )
    plot_performance(validation, run_dir / "validation.png")
    plot_allocations(agent, run_dir / "validation_allocations.png")
    progress = run_dir / "progress.csv"
    if progress.exists() and progress.stat().st_size > 0:
        plot_training_curves(pd.read_csv(progress), run_dir / "training_curves.png")
    summary = {
        "algorithm": config.algorithm.name,
        "total_timesteps": config.total_timesteps,
        "train_seconds": round(seconds, 2),
        "steps_per_second": round(config.total_timesteps / seconds, 1),
        "device": str(model.device),
        "smooth_lambda": float(getattr(model, "smooth_lambda", 0.0)),
        "validation": metrics,
    }
    write_json(run_dir / "run.json", summary)
    write_manifest(
        run_dir,
        build_manifest(config, stats, list(train_data.assets), metrics, run_dir),
    )
    return TrainingRun(run_dir, model, config, stats, validation, summary, feature_norm)
