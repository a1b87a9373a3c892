"""Env steps per second of training (``model.learn``): vanilla SB3 TD3 next to ``SmoothTD3``.

Every variant trains on the same set-up: the embedded S&P 500 data restricted to a training
period, ``EnvConfig()`` defaults (20 assets, window 30), MlpPolicy ``[256, 256]``, batch 256,
``learning_starts`` 1000, one gradient step per env step, Gaussian exploration noise (sigma 0.2)
and the same seed. Each model first runs ``learn(learning_starts)`` untimed (random actions, no
gradient steps), then ``learn(steps, reset_num_timesteps=False)`` is timed; with ``--repeats``
the timed runs are interleaved across the variants so that machine drift hits all of them alike.

Variants (``--variants``, comma-separated; default: the first four):

* ``vanilla``: ``stable_baselines3.TD3`` (learning rate 1e-3, MSE critics, no gradient clip);
* ``fixed``: ``SmoothTD3`` with the smoothness term at a fixed lambda of 1.0;
* ``adaptive``: ``SmoothTD3`` with the dual-ascent lambda;
* ``adaptive_icm``: ``adaptive`` plus the Intrinsic Curiosity Module;
* ``none``: ``SmoothTD3`` without the smoothness term (Huber, clipping, two learning rates),
  to separate the cost of those from the cost of the smoothness term;
* ``shared``: ``adaptive`` with the per-asset shared policy instead of the MLP (same env);
* ``shared_asset_v1``: ``shared`` on the per-asset feature set with the tilt mapping;
* ``recipe``: the default recipe as a training run builds it, ``configs/td3_shared_demo.yaml``
  with its own network, batch size, noise and environment on its own training span (the fit
  part that selection leaves), only ``learning_starts`` and ``buffer_size`` taken from here;
* ``recipe_unbounded``: ``recipe`` without its bound penalty (``algorithm.action_bound``), so
  the pair says what the penalty costs a step.

The shared variants report ``ratio_vs_mlp``: their rate over ``adaptive``'s (same algorithm).

``SmoothTD3`` models come from ``training.build_model``, as in a training run. Prints one JSON
object; nothing passes or fails on time (the goal, ours >= 0.85x vanilla, is for the reader).
Run: ``.venv/bin/python bench/train_throughput.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import stable_baselines3 as sb3
import torch
from stable_baselines3 import TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.utils import get_device

from allocator.portfolio import fit_normalization
from allocator.trainer.agents.icm import ICMSettings
from allocator.trainer.agents.noise import NoiseSettings
from allocator.trainer.agents.regularizer import SmoothMode, SmoothnessSettings
from allocator.trainer.market.data import MarketData, load_sp500
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from allocator.trainer.training.config import TD3Settings, TrainConfig, load_config
from allocator.trainer.training.inputs import make_env as make_training_env
from allocator.trainer.training.inputs import prepare_data
from allocator.trainer.training.run import build_model

VARIANTS = (
    "vanilla",
    "fixed",
    "adaptive",
    "adaptive_icm",
    "none",
    "shared",
    "shared_asset_v1",
    "recipe",
    "recipe_unbounded",
)
DEFAULT_VARIANTS = ("vanilla", "fixed", "adaptive", "adaptive_icm")
NOISE_SIGMA = 0.2


SHARED_ENV = EnvConfig(features="asset_v1", action={"mapping": "tilt"})
RECIPE = Path(__file__).resolve().parents[1] / "configs" / "td3_shared_demo.yaml"
UNBOUNDED = ("algorithm.action_bound.weight=0",)


def build_recipe(name: str, args: argparse.Namespace) -> BaseAlgorithm:
    """The default recipe's model on its own training environment, as ``train`` builds them."""
    overrides = [
        f"seed={args.seed}",
        f"device={args.device}",
        "progress_bar=false",
        "tensorboard=false",
        f"algorithm.learning_starts={args.learning_starts}",
        f"algorithm.buffer_size={args.buffer_size}",
    ]
    if name == "recipe_unbounded":
        overrides += UNBOUNDED
    config = load_config(RECIPE, overrides)
    return build_model(config, make_training_env(config, prepare_data(config)))


def make_env(data: MarketData, config: EnvConfig | None = None) -> Monitor:
    """The training environment as ``training.train`` builds it (statistics of ``data``)."""
    stats = fit_normalization(data.prices, axis=0)
    return Monitor(PortfolioEnv(data, config or EnvConfig(), stats=stats))


def variant_env(name: str) -> EnvConfig:
    return SHARED_ENV if name == "shared_asset_v1" else EnvConfig()


def build_variant(name: str, env: Monitor, args: argparse.Namespace) -> BaseAlgorithm:
    """One model of the comparison, all on the same network, batch, warm-up and seed."""
    algo = TD3Settings(
        batch_size=args.batch_size,
        learning_starts=args.learning_starts,
        buffer_size=args.buffer_size,
        train_freq=1,
        gradient_steps=1,
        net_arch=[256, 256],
    )
    if name == "vanilla":
        n_actions = env.action_space.shape[0]
        return TD3(
            "MlpPolicy",
            env,
            learning_rate=1e-3,
            buffer_size=algo.buffer_size,
            learning_starts=algo.learning_starts,
            batch_size=algo.batch_size,
            tau=algo.tau,
            gamma=algo.gamma,
            train_freq=algo.train_freq,
            gradient_steps=algo.gradient_steps,
            action_noise=NormalActionNoise(np.zeros(n_actions), np.full(n_actions, NOISE_SIGMA)),
            policy_delay=algo.policy_delay,
            target_policy_noise=algo.target_policy_noise,
            target_noise_clip=algo.target_noise_clip,
            policy_kwargs={"net_arch": list(algo.net_arch)},
            seed=args.seed,
            device=get_device(args.device),
            verbose=0,
        )
    smoothness = {
        "none": SmoothnessSettings(),
        "fixed": SmoothnessSettings(mode=SmoothMode.FIXED, lam=1.0),
        "adaptive": SmoothnessSettings(mode=SmoothMode.ADAPTIVE, lam=1.0),
        "adaptive_icm": SmoothnessSettings(mode=SmoothMode.ADAPTIVE, lam=1.0),
        "shared": SmoothnessSettings(mode=SmoothMode.ADAPTIVE, lam=1.0),
        "shared_asset_v1": SmoothnessSettings(mode=SmoothMode.ADAPTIVE, lam=1.0),
    }[name]
    config = TrainConfig(
        seed=args.seed,
        device=args.device,
        progress_bar=False,
        tensorboard=False,
        policy="shared" if name.startswith("shared") else "mlp",
        env=variant_env(name),
        algorithm=algo.model_copy(update={"smoothness": smoothness}),
        noise=NoiseSettings(sigma=NOISE_SIGMA),
        icm=ICMSettings(enabled=name == "adaptive_icm"),
    )
    return build_model(config, env)


def timed_learn(model: BaseAlgorithm, steps: int) -> float:
    """Seconds of ``learn(steps)`` continuing the model's step count (GPU work included)."""
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(model.device)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    if cuda:
        torch.cuda.synchronize(model.device)
    return time.perf_counter() - start


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_variants(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"variants must be among {', '.join(VARIANTS)}")
    return list(dict.fromkeys(names))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1000, help="timed env steps per run")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per variant, interleaved (best kept)"
    )
    parser.add_argument("--learning-starts", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--buffer-size", type=int, default=TD3Settings().buffer_size)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-start", default="2005-01-01")
    parser.add_argument("--train-end", default="2014-12-31")
    parser.add_argument(
        "--variants",
        type=parse_variants,
        default=list(DEFAULT_VARIANTS),
        help=f"comma-separated, among {', '.join(VARIANTS)}",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny smoke run: 50 steps, warm-up 20, batch 16"
    )
    args = parser.parse_args()
    if args.quick:
        args.steps, args.learning_starts, args.batch_size = 50, 20, 16
        args.buffer_size, args.repeats = 1000, 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    load_before = os.getloadavg()
    data = load_sp500().between(args.train_start, args.train_end)
    models: dict[str, BaseAlgorithm] = {}
    for name in args.variants:
        if name.startswith("recipe"):
            models[name] = build_recipe(name, args)
        else:
            models[name] = build_variant(name, make_env(data, variant_env(name)), args)
        models[name].learn(args.learning_starts)  # warm-up: fills the buffer, no updates yet

    seconds: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.repeats):
        for name, model in models.items():
            seconds[name].append(timed_learn(model, args.steps))

    rates = {name: [args.steps / s for s in runs] for name, runs in seconds.items()}
    best = {name: max(r) for name, r in rates.items()}
    variants: dict[str, dict[str, Any]] = {}
    for name, model in models.items():
        entry: dict[str, Any] = {
            "steps_per_s": round(best[name], 1),
            "steps_per_s_runs": [round(r, 1) for r in rates[name]],
            "algorithm": type(model).__name__,
            "policy": type(model.policy).__name__,
            "n_updates": int(model._n_updates),
            "batch_size": int(model.batch_size),
        }
        bound = getattr(model, "action_bound", None)
        if bound is not None:
            entry["bound_penalty_weight"] = bound.weight
        if name != "vanilla" and "vanilla" in best:
            entry["ratio_vs_vanilla"] = round(best[name] / best["vanilla"], 3)
        if name.startswith(("shared", "recipe")) and "adaptive" in best:
            entry["ratio_vs_mlp"] = round(best[name] / best["adaptive"], 3)
        variants[name] = entry

    device = next(iter(models.values())).device
    print(
        json.dumps(
            {
                "variants": variants,
                "goal_ratio_vs_vanilla": 0.85,
                "steps": args.steps,
                "repeats": args.repeats,
                "learning_starts": args.learning_starts,
                "batch_size": args.batch_size,
                "buffer_size": args.buffer_size,
                "net_arch": [256, 256],
                "assets": EnvConfig().max_assets,
                "window": EnvConfig().window,
                "obs_dim": int(models[args.variants[0]].observation_space.shape[0]),
                "train_period": [str(data.dates[0])[:10], str(data.dates[-1])[:10]],
                "seed": args.seed,
                "device": str(device),
                "device_name": (
                    torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
                ),
                "torch": torch.__version__,
                "sb3": sb3.__version__,
                "python": platform.python_version(),
                "numpy": np.__version__,
                "cpus": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "torch_interop_threads": torch.get_num_interop_threads(),
                # Other processes on the machine skew the figures: compare with "cpus".
                "load_avg_1m_before_after": [
                    round(load_before[0], 2),
                    round(os.getloadavg()[0], 2),
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
