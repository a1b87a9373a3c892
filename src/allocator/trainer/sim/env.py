"""``PortfolioEnv``: cash plus a random subset of up to ``max_assets`` assets, daily rebalancing.

One step at date t (after its close):

1. the action maps to raw weights ``w`` (``portfolio.action_to_weights``) and is smoothed into the
   executed target ``s = ema_smooth(s_prev, w, mask, beta)``;
2. the holdings, drifted to weights ``h`` by yesterday's moves, are traded to ``s``:
   ``turnover = sum_{assets} |s_i - h_i|`` of NAV, and ``cost = cost_bps/1e4 * turnover * NAV`` is
   taken out of NAV (``NAV' = NAV - cost``, then held in the proportions ``s``);
3. prices move to t+1: ``NAV_{t+1} = NAV' * sum_i s_i g_i`` with ``g_i = P_{t+1,i}/P_{t,i}``
   (cash 1),
   and the holdings drift to ``s_i g_i / sum_j s_j g_j``.

Holdings are fractional (``shares_i = NAV' s_i / P_t,i`` in ``info``). Everything runs on arrays
prepared at reset so that an agent's updates, not the environment, dominate training time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray
from pydantic import Field, model_validator

from allocator.portfolio import (
    FeatureSpec,
    NormalizationStats,
    action_to_weights,
    ema_smooth,
    fit_normalization,
    is_distribution,
    log_returns,
    normalize_returns,
)
from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.history import EpisodeHistory
from allocator.trainer.sim.rewards import RewardConfig, RewardFunction
from allocator.typed_config import StrictModel


class EnvConfig(StrictModel):
    """Knobs of the trading environment."""

    max_assets: int = Field(20, ge=1, description="asset slots besides cash")
    min_assets: int = Field(1, ge=1, description="fewest assets sampled for an episode")
    window: int = Field(30, ge=1, description="daily log returns per asset in the observation")
    episode_length: int = Field(252, ge=1, description="decisions per episode")
    # Turnover is at most 2 (sell everything, buy everything), so costs stay below NAV.
    cost_bps: float = Field(10.0, ge=0, lt=5_000, description="cost per unit of traded value")
    beta: float = Field(0.5, ge=0, lt=1, description="EMA smoothing of executed weights")
    initial_value: float = Field(1.0, gt=0, description="NAV at the start of each episode")
    obs_clip: float = Field(10.0, gt=0, description="normalized features clipped to +-obs_clip")
    reward: RewardConfig = RewardConfig()

    @model_validator(mode="after")
    def _check(self) -> EnvConfig:
        if self.min_assets > self.max_assets:
            raise ValueError(f"min_assets {self.min_assets} > max_assets {self.max_assets}")
        return self

    @property
    def feature_spec(self) -> FeatureSpec:
        return FeatureSpec(max_assets=self.max_assets, window=self.window, clip=self.obs_clip)


class PortfolioEnv(gym.Env[NDArray[np.float32], NDArray[np.float32]]):
    """Gymnasium environment over ``MarketData`` with the shared policy contract.

    ``reset(options=...)`` accepts ``assets`` (names, in slot order), ``start`` (a date or a row
    index: the first decision date) and ``episode_length`` to pin an episode, as backtests do.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute

    def __init__(
        self,
        data: MarketData,
        config: EnvConfig | None = None,
        stats: NormalizationStats | None = None,
    ) -> None:
        super().__init__()
        self.config = config or EnvConfig()
        self.data = data
        self.spec_ = self.config.feature_spec
        self.stats = stats if stats is not None else fit_normalization(data.prices, axis=0)
        m = self.config.max_assets
        self.n_slots = m + 1
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(self.n_slots,), dtype=np.float32)
        # Features lie in [-clip, clip]; the weights and mask blocks in [0, 1].
        n_feat = self.spec_.obs_size - 2 * self.n_slots
        clip = np.float32(self.config.obs_clip)
        low = np.concatenate([np.full(n_feat, -clip), np.zeros(2 * self.n_slots)])
        high = np.concatenate([np.full(n_feat, clip), np.ones(2 * self.n_slots)])
        self.observation_space = gym.spaces.Box(
            low.astype(np.float32), high.astype(np.float32), dtype=np.float32
        )
        # Normalized returns for the whole history, once: row t holds log(P_t / P_{t-1}).
        feats = normalize_returns(
            log_returns(data.prices, axis=0), self.stats, self.config.obs_clip
        )
        self._features = np.vstack([np.zeros((1, data.n_assets), np.float32), feats])
        self._first = data.first_valid()
        self._last = data.last_valid()
        self._cost_rate = self.config.cost_bps / 1e4
        self._beta = self.config.beta
        self.reward_fn = RewardFunction(self.config.reward)
        self.history = EpisodeHistory(self.n_slots, capacity=1)
        self._t0 = 0
        self._length = 0
        self._k = 0
        self._done = True  # until the first reset

    # --- episode set-up ------------------------------------------------------------------

    def _resolve_start(self, start: Any) -> int:
        if isinstance(start, (int, np.integer)):
            return int(start)
        return self.data.date_index(start, "left")

    def _sample_episode(self, options: dict[str, Any]) -> tuple[list[int], int, int]:
        cfg, w = self.config, self.config.window
        length = int(options.get("episode_length", cfg.episode_length))
        if "start" in options:
            t0 = self._resolve_start(options["start"])
            length = min(length, self.data.n_dates - 1 - t0)
        else:
            hi = self.data.n_dates - 1 - length
            if hi < w:
                raise ValueError(
                    f"{self.data.source}: {self.data.n_dates} dates cannot hold a window of {w} "
                    f"and an episode of {length} steps"
                )
            t0 = int(self.np_random.integers(w, hi + 1))
        if t0 < w:
            raise ValueError(f"start needs {w} earlier closes for the observation window")
        if length < 1:
            raise ValueError("episode has no steps: start is at the end of the data")
        if "assets" in options:
            names = list(options["assets"])
            unknown = [a for a in names if a not in self.data.assets]
            if unknown:
                raise ValueError(f"unknown asset(s) {', '.join(unknown)}")
            if len(set(names)) != len(names):
                raise ValueError(f"duplicate asset ids in {names}")
            if len(names) > cfg.max_assets:
                raise ValueError(f"{len(names)} assets exceed max_assets={cfg.max_assets}")
            idx = [self.data.assets.index(a) for a in names]
        else:
            ok = np.flatnonzero((self._first <= t0 - w) & (self._last >= t0 + length))
            if ok.size < cfg.min_assets:
                raise ValueError(f"only {ok.size} assets trade over the sampled episode")
            k = int(self.np_random.integers(cfg.min_assets, min(cfg.max_assets, ok.size) + 1))
            idx = [int(i) for i in self.np_random.choice(ok, size=k, replace=False)]
        for i in idx:
            if self._first[i] > t0 - w or self._last[i] < t0 + length:
                raise ValueError(
                    f"asset {self.data.assets[i]} has no prices over the whole episode"
                )
        return idx, t0, length

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        idx, t0, length = self._sample_episode(options or {})
        m, k = self.config.max_assets, len(idx)
        self.asset_index = np.asarray(idx, dtype=np.int64)
        self.asset_names = tuple(self.data.assets[i] for i in idx)
        self.mask = np.zeros(self.n_slots, dtype=bool)
        self.mask[: k + 1] = True
        self._mask_f32 = self.mask.astype(np.float32)
        # Slot prices over the episode (cash and empty slots fixed at 1).
        self._slot_prices = np.ones((length + 1, self.n_slots))
        self._slot_prices[:, 1 : k + 1] = self.data.prices[t0 : t0 + length + 1][:, idx]
        self._growth = self._slot_prices[1:] / self._slot_prices[:-1]
        feats = np.zeros((length + self.config.window, m), np.float32)
        feats[:, :k] = self._features[t0 - self.config.window + 1 : t0 + length + 1][:, idx]
        self._episode_features = feats
        self._t0, self._length, self._k = t0, length, 0
        self._done = False
        self.nav = self.config.initial_value
        self.drifted = np.zeros(self.n_slots)
        self.drifted[0] = 1.0
        self.executed: NDArray[np.float64] | None = None
        if self.history.capacity < length:
            self.history = EpisodeHistory(self.n_slots, capacity=length)
        self.history.start(self.nav, self.drifted, self._slot_prices[0], self.mask)
        self.reward_fn.reset()
        return self._observation(), {"assets": self.asset_names, "date": self.date, "nav": self.nav}

    # --- stepping ------------------------------------------------------------------------

    @property
    def date(self) -> Any:
        """The decision date of the next step (or the last close once the episode is over)."""
        return self.data.dates[self._t0 + self._k]

    @property
    def t(self) -> int:
        """Row of the data the next decision is made at."""
        return self._t0 + self._k

    def _observation(self) -> NDArray[np.float32]:
        w, m = self.config.window, self.config.max_assets
        obs = np.empty(self.spec_.obs_size, np.float32)
        obs[: m * w].reshape(m, w)[:] = self._episode_features[self._k : self._k + w].T
        obs[m * w : m * w + self.n_slots] = self.drifted
        obs[m * w + self.n_slots :] = self._mask_f32
        return obs

    def step(
        self, action: NDArray[np.float32]
    ) -> tuple[NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("episode is over: call reset()")
        return self._advance(action_to_weights(action, self.mask))

    def step_weights(
        self, weights: Sequence[float] | NDArray[np.float64]
    ) -> tuple[NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        """Step with raw target weights instead of an action (scripted policies, baselines)."""
        if self._done:
            raise RuntimeError("episode is over: call reset()")
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (self.n_slots,) or not is_distribution(w, self.mask):
            raise ValueError(
                "weights must be a distribution over the live slots "
                f"(length {self.n_slots}, cash first): got {np.round(w, 6).tolist()}"
            )
        return self._advance(w)

    def _advance(
        self, raw: NDArray[np.float64]
    ) -> tuple[NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        s = ema_smooth(self.executed, raw, self.mask, self._beta)
        turnover = float(np.add.reduce(np.abs(s[1:] - self.drifted[1:])))
        cost = self._cost_rate * turnover * self.nav
        invested = self.nav - cost
        shares = invested * s / self._slot_prices[self._k]
        grown = s * self._growth[self._k]
        gross = float(np.add.reduce(grown))
        self.nav = invested * gross
        self.drifted = grown / gross
        self.executed = s
        self._k += 1
        self.history.record(self.nav, s, self._slot_prices[self._k], cost, turnover)
        reward = self.reward_fn(self.history)
        terminated = self.nav <= 1e-9 * self.config.initial_value
        truncated = self._k >= self._length and not terminated
        self._done = terminated or truncated
        info = {
            "raw_weights": raw,
            "executed_weights": s,
            "shares": shares,
            "cost": cost,
            "turnover": turnover,
            "nav": self.nav,
        }
        return self._observation(), float(reward), bool(terminated), bool(truncated), info


ENV_ID = "allocator/Portfolio-v0"
if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="allocator.trainer.sim.env:PortfolioEnv")
