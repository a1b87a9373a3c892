"""Steps per second of ``PortfolioEnv`` (20 assets, random actions, costs and smoothing on).

Also times the per-asset feature set (``asset_v1``), alone and with the tilt mapping: its
features and anchors are computed once per episode at reset, which the rates include (goal:
still >= 50,000 steps/s). Prints JSON. For contrast it also times the same step written the
common naive way: prices looked up with ``DataFrame.loc`` on every step.
Run: ``.venv/bin/python bench/env_throughput.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from allocator.portfolio import action_to_weights, build_observation, ema_smooth
from allocator.trainer.market.data import MarketData, load_sp500
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv


class NaivePandasStep:
    """The same mechanics with a per-step ``.loc`` lookup: how such envs are often written."""

    def __init__(self, data: MarketData, env: PortfolioEnv) -> None:
        self.frame = data.to_frame()
        self.env = env
        self.assets = list(data.assets)
        self.reset()

    def reset(self) -> None:
        self.k = 0
        self.t0 = self.env.config.window + 1
        self.nav = 1.0
        self.drifted = np.zeros(len(self.assets) + 1)
        self.drifted[0] = 1.0
        self.executed: np.ndarray | None = None

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float]:
        cfg, dates = self.env.config, self.frame.index
        t = self.t0 + self.k
        mask = np.ones(len(self.assets) + 1, dtype=bool)
        today = self.frame.loc[dates[t], self.assets].to_numpy()
        tomorrow = self.frame.loc[dates[t + 1], self.assets].to_numpy()
        w = action_to_weights(action, mask)
        s = ema_smooth(self.executed, w, mask, cfg.beta)
        cost = cfg.cost_bps / 1e4 * np.abs(s[1:] - self.drifted[1:]).sum() * self.nav
        growth = np.concatenate([[1.0], tomorrow / today])
        grown = s * growth
        nav = (self.nav - cost) * grown.sum()
        reward = nav / self.nav - 1.0
        self.nav, self.drifted, self.executed = nav, grown / grown.sum(), s
        self.k += 1
        window = self.frame.loc[dates[t + 1 - cfg.window] : dates[t + 1], self.assets]
        obs = build_observation(
            window.to_numpy().T, self.drifted, mask, cfg.feature_spec, self.env.stats
        )
        if t + 2 >= len(dates) or self.k >= cfg.episode_length:
            self.reset()
        return obs, reward


def time_steps(step: Callable[[np.ndarray], object], actions: np.ndarray) -> float:
    """Steps per second of ``step`` over ``actions``."""
    start = time.perf_counter()
    for a in actions:
        step(a)
    return len(actions) / (time.perf_counter() - start)


def env_rates(env: PortfolioEnv, actions: np.ndarray, repeats: int) -> list[float]:
    """Steps per second of ``env`` over ``actions``, ``repeats`` times (resets included)."""
    assets = list(env.data.assets)[: env.config.max_assets]
    env.reset(seed=0, options={"assets": assets})

    def env_step(action: np.ndarray) -> None:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset(options={"assets": assets})

    return [time_steps(env_step, actions) for _ in range(repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--naive-steps", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    data = load_sp500()
    config = EnvConfig(max_assets=20, cost_bps=10.0, beta=0.5)
    env = PortfolioEnv(data, config)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, size=(args.steps, 21)).astype(np.float32)
    rates = env_rates(env, actions, args.repeats)
    variants = {
        "asset_v1": EnvConfig(**config.model_dump() | {"features": "asset_v1"}),
        "asset_v1_tilt": EnvConfig(
            **config.model_dump() | {"features": "asset_v1", "action": {"mapping": "tilt"}}
        ),
    }
    new_rates = {
        name: max(env_rates(PortfolioEnv(data, cfg), actions, args.repeats))
        for name, cfg in variants.items()
    }
    naive = NaivePandasStep(data, env)
    naive_rate = time_steps(naive.step, actions[: args.naive_steps])
    best = max(rates)
    print(
        json.dumps(
            {
                "steps_per_s": round(best, 1),
                "steps_per_s_runs": [round(r, 1) for r in rates],
                "naive_pandas_loc_steps_per_s": round(naive_rate, 1),
                "speedup_vs_naive": round(best / naive_rate, 1),
                "asset_v1_steps_per_s": round(new_rates["asset_v1"], 1),
                "asset_v1_tilt_steps_per_s": round(new_rates["asset_v1_tilt"], 1),
                "asset_v1_goal_steps_per_s": 50_000,
                "assets": 20,
                "reward": config.reward.kind.value,
                "cost_bps": config.cost_bps,
                "beta": config.beta,
                "steps": args.steps,
                "python": platform.python_version(),
                "numpy": np.__version__,
                "pandas": pd.__version__,
                "cpus": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
