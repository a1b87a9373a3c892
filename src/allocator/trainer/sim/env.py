"""``PortfolioEnv``: cash plus up to ``max_assets`` assets, rebalanced daily. A step smooths the
action's weights ``w`` into ``s = ema_smooth(s_prev, w, mask, beta)``, trades the drifted
holdings ``h`` to ``s`` at ``cost_bps/1e4 * (sold + sum|s - h|) * NAV``, then prices move. A
universe change sells the leavers into cash (``sold``) at the next decision: live slots stay a
prefix, the staying assets keep their order, the joiners follow, and every per-slot vector moves
by asset id (``slot_sources``).
Arrays are prepared per universe span, so the agent's updates dominate training time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray
from pydantic import Field, model_validator

from allocator.portfolio import (
    AssetFeatureSpec,
    FeatureNormalization,
    FeatureSpec,
    NormalizationStats,
    action_to_weights,
    apply_tilt,
    ema_smooth,
    fit_feature_normalization,
    fit_normalization,
    is_distribution,
    log_returns,
    normalize_returns,
)
from allocator.portfolio.costs import cost_rate, trade_cost, turnover
from allocator.portfolio.observation import Float32Array
from allocator.portfolio.weights import FloatArray
from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.representation import (
    ActionSettings,
    FeatureSet,
    FeatureTable,
    episode_anchors,
)
from allocator.trainer.sim.rewards import EpisodeHistory, RewardConfig, RewardFunction
from allocator.typed_config import StrictModel

Step = tuple[Float32Array, float, bool, bool, dict[str, Any]]
"""``gym.Env.step``'s answer: observation, reward, terminated, truncated, info."""
IntArray = NDArray[np.intp]


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
    features: FeatureSet = Field(
        "returns", description="'returns': the return window; 'asset_v1': per-asset feature set"
    )
    horizons: list[int] = Field(
        default_factory=lambda: [5, 10, 20, 30], description="asset_v1 momentum horizons (days)"
    )
    vol_window: int = Field(20, ge=2, description="asset_v1 realized-volatility window (days)")
    action: ActionSettings = ActionSettings()
    reward: RewardConfig = RewardConfig()

    @model_validator(mode="after")
    def _check(self) -> EnvConfig:
        if self.min_assets > self.max_assets:
            raise ValueError(f"min_assets {self.min_assets} > max_assets {self.max_assets}")
        AssetFeatureSpec(horizons=tuple(self.horizons))  # refuses empty, repeated or < 1 ones
        if self.reward.relative_to == "anchor" and self.action.mapping != "tilt":
            raise ValueError(
                "reward.relative_to=anchor needs action.mapping=tilt: the affine mapping has no "
                f"anchor (got mapping {self.action.mapping!r})"
            )
        return self

    @property
    def feature_spec(self) -> FeatureSpec:
        """The observation layout: ``window`` is the features per slot (F)."""
        return FeatureSpec(max_assets=self.max_assets, window=self.n_features, clip=self.obs_clip)

    @property
    def asset_feature_spec(self) -> AssetFeatureSpec:
        return AssetFeatureSpec(self.window, tuple(self.horizons), self.vol_window, self.obs_clip)

    @property
    def n_features(self) -> int:
        """Features per asset slot."""
        return self.asset_feature_spec.n_features if self.features == "asset_v1" else self.window

    @property
    def history(self) -> int:
        need = self.asset_feature_spec.lookback if self.features == "asset_v1" else self.window
        if self.action.mapping == "tilt":
            need = max(need, self.action.anchor.spec.prices_per_asset - 1)
        return need

    @property
    def is_default_representation(self) -> bool:
        """Return-window features with the affine mapping: what every exported model uses."""
        return self.features == "returns" and self.action.mapping == "affine"


def slot_sources(current: Sequence[str], new: Sequence[str], n_slots: int) -> IntArray:
    """Each new slot's previous slot (cash: 0; joiners and empty slots: -1)."""
    before = {a: j + 1 for j, a in enumerate(current)}
    source = np.full(n_slots, -1, dtype=np.intp)
    source[0] = 0
    source[1 : len(new) + 1] = [before.get(a, -1) for a in new]
    return source


def carry(vector: NDArray[np.float64], source: IntArray) -> NDArray[np.float64]:
    """``vector`` in the new layout: joining and empty slots 0, leavers dropped."""
    out = np.zeros(source.size)
    kept = source >= 0
    out[kept] = vector[source[kept]]
    return out


def parse_schedule(changes: Any, length: int) -> dict[int, tuple[str, ...]]:
    """The ``universe_changes`` reset option ``{step: asset names}``, checked, in step order."""
    if not isinstance(changes, Mapping):
        raise ValueError(f"universe_changes must map a step to asset names, got {changes!r}")
    for step in changes:
        if not isinstance(step, (int, np.integer)) or not 1 <= step < length:
            raise ValueError(
                f"universe_changes step {step!r} is not a decision after the first "
                f"(1 .. {length - 1})"
            )
    out: dict[int, tuple[str, ...]] = {}
    for step in sorted(changes):
        names = changes[step]
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise ValueError(f"universe_changes[{step}] must be a list of asset names")
        if not names:
            raise ValueError(f"universe_changes[{step}] names no asset")
        out[int(step)] = tuple(names)
    return out


def segment_end(schedule: Mapping[int, Any], step: int, length: int) -> int:
    """The next scheduled change after ``step``, else the episode's end."""
    return min((s for s in schedule if s > step), default=length)


def observation_space(spec: FeatureSpec) -> gym.spaces.Box[np.float32]:
    """The environment's observation space: features in +-clip, weights and mask in [0, 1]."""
    n_feat = spec.max_assets * spec.window
    low = np.concatenate([np.full(n_feat, -spec.clip), np.zeros(2 * spec.n_slots)])
    high = np.concatenate([np.full(n_feat, spec.clip), np.ones(2 * spec.n_slots)])
    return gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)


class PortfolioEnv(gym.Env[Float32Array, Float32Array]):
    """Gymnasium environment over ``MarketData`` with the shared policy contract. Reset options:
    ``assets`` (slot order), ``start`` (date or row), ``episode_length`` and ``universe_changes``
    (``{step: names}``, the universe from ``step``)."""

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute

    def __init__(
        self,
        data: MarketData,
        config: EnvConfig | None = None,
        stats: NormalizationStats | None = None,
        feature_norm: FeatureNormalization | None = None,
    ) -> None:
        super().__init__()
        self.config = config or EnvConfig()
        self.data = data
        self.stats = stats if stats is not None else fit_normalization(data.prices, axis=0)
        self.n_slots = self.config.max_assets + 1
        self.n_features = self.config.n_features
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(self.n_slots,), dtype=np.float32)
        self.observation_space = observation_space(self.config.feature_spec)
        self._obs_size = self.config.feature_spec.obs_size  # read every step: kept
        self._n_block = self._obs_size - 2 * self.n_slots
        self._history = self.config.history
        self.asset_spec: AssetFeatureSpec | None = None
        self.feature_norm: FeatureNormalization | None = None
        if self.config.features == "asset_v1":
            self.asset_spec = self.config.asset_feature_spec
            self.feature_norm = feature_norm or fit_feature_normalization(
                data.prices, self.asset_spec
            )
            self._table = FeatureTable(data.prices, self.asset_spec, self.feature_norm)
        else:
            # Normalized returns for the whole history, once: row t holds log(P_t / P_{t-1}).
            feats = normalize_returns(
                log_returns(data.prices, axis=0), self.stats, self.config.obs_clip
            )
            self._features = np.vstack([np.zeros((1, data.n_assets), np.float32), feats])
        self._tilt = self.config.action.mapping == "tilt"
        self._anchors: FloatArray | None = None
        self._column = {a: j for j, a in enumerate(data.assets)}
        self._first = data.first_valid()
        self._last = data.last_valid()
        self._cost_rate = cost_rate(self.config.cost_bps)
        self._beta = self.config.beta
        self.reward_fn = RewardFunction(self.config.reward)
        self._relative = self.reward_fn.relative
        self.history = EpisodeHistory(self.n_slots, capacity=1)
        self._done = True  # until the first reset

    # --- episode set-up ------------------------------------------------------------------

    def _universe(
        self, names: Sequence[str], first: int, last: int, span: str | None = None
    ) -> list[int]:
        """Data columns of ``names``: each known, none repeated, at most ``max_assets`` of them,
        every one with prices from row ``first`` to row ``last``."""
        names = list(names)
        unknown = [a for a in names if a not in self._column]
        if unknown:
            raise ValueError(f"unknown asset(s) {', '.join(map(str, unknown))}")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate asset ids in {names}")
        if len(names) > self.config.max_assets:
            raise ValueError(f"{len(names)} assets exceed max_assets={self.config.max_assets}")
        idx = [self._column[a] for a in names]
        span = span or f"rows {first}..{last}"
        for i in idx:
            if self._first[i] > first or self._last[i] < last:
                raise ValueError(f"asset {self.data.assets[i]} has no prices over {span}")
        return idx

    def _sample_episode(
        self, options: dict[str, Any]
    ) -> tuple[list[int], int, int, dict[int, tuple[str, ...]]]:
        cfg, w = self.config, self._history
        length = int(options.get("episode_length", cfg.episode_length))
        if "start" in options:
            t0 = options["start"]
            t0 = int(t0) if isinstance(t0, int | np.integer) else self.data.date_index(t0)
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
        changes = parse_schedule(options.get("universe_changes", {}), length)
        for step, names in changes.items():
            self._universe(names, t0 + step - w, t0 + segment_end(changes, step, length))
        end = t0 + segment_end(changes, 0, length)
        if "assets" in options:
            span = "the whole episode" if not changes else None
            return self._universe(list(options["assets"]), t0 - w, end, span), t0, length, changes
        ok = np.flatnonzero((self._first <= t0 - w) & (self._last >= end))
        if ok.size < cfg.min_assets:
            raise ValueError(f"only {ok.size} assets trade over the sampled episode")
        k = int(self.np_random.integers(cfg.min_assets, min(cfg.max_assets, ok.size) + 1))
        idx = [int(i) for i in self.np_random.choice(ok, size=k, replace=False)]
        return idx, t0, length, changes

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Float32Array, dict[str, Any]]:
        super().reset(seed=seed)
        idx, t0, length, changes = self._sample_episode(options or {})
        self._t0, self._length, self._k, self._changes = t0, length, 0, changes
        self._install(idx, 0)
        self._done = False
        self.nav = self.config.initial_value
        self.drifted = np.zeros(self.n_slots)
        self.drifted[0] = 1.0
        self.executed: FloatArray | None = None
        self._sold = 0.0  # weight sold by universe changes since the last step
        if self.history.capacity < length:
            self.history = EpisodeHistory(self.n_slots, capacity=length)
        self.history.start(self.nav, self.drifted, self._slot_prices[0], self.mask)
        self.reward_fn.reset()
        return self._observation(), {"assets": self.asset_names, "date": self.date, "nav": self.nav}

    def _install(self, idx: list[int], k0: int) -> None:
        """Make ``idx`` the universe from decision ``k0`` to its span's end, arrays and all."""
        m, w, h = self.config.max_assets, self.config.window, self._history
        t = self._t0 + k0
        n = segment_end(self._changes, k0, self._length) - k0  # decisions in the span
        k = len(idx)
        self.asset_index = np.asarray(idx, dtype=np.int64)
        self.asset_names = tuple(self.data.assets[i] for i in idx)
        self.mask = np.arange(self.n_slots) <= k  # live slots: cash and the k assets
        self._mask_f32 = self.mask.astype(np.float32)
        self._row0 = k0  # decision index of row 0 of the per-decision arrays
        self._slot_prices = np.ones((n + 1, self.n_slots))  # cash and empty slots fixed at 1
        self._slot_prices[:, 1 : k + 1] = self.data.prices[t : t + n + 1][:, idx]
        self._growth = self._slot_prices[1:] / self._slot_prices[:-1]
        if self.asset_spec is None:
            self._episode_features = np.zeros((n + w, m), np.float32)
            self._episode_features[:, :k] = self._features[t - w + 1 : t + n + 1][:, idx]
        else:
            self._episode_features = self._table.episode(idx, t, n + 1, m)
        if self._tilt:
            window = self.data.prices[t - h : t + n + 1][:, idx]
            spec = self.config.action.anchor.spec
            self._anchors = episode_anchors(window, spec, self.n_slots, h + 1)

    # --- universe changes ------------------------------------------------------------------

    def change_universe(self, assets: Sequence[str]) -> tuple[Float32Array, dict[str, Any]]:
        """Make ``assets`` the universe from the next decision on; ``ValueError``, the
        environment unchanged, for a finished episode or a list ``reset`` would refuse."""
        if self._done:
            raise ValueError("the episode is over: reset() before changing its universe")
        if isinstance(assets, str):
            raise ValueError(f"assets must be a list of asset names, got the string {assets!r}")
        names = list(assets)
        if not names:
            raise ValueError("a universe needs at least one asset")
        end = self._t0 + segment_end(self._changes, self._k, self._length)
        self._universe(names, self.t - self._history, end)
        self._change(names)
        info = {"assets": self.asset_names, "date": self.date, "nav": self.nav}
        return self._observation(), info | {"liquidation_turnover": self._sold}

    def _change(self, names: Sequence[str]) -> tuple[str, ...]:
        """Apply a checked universe at the next decision: sell the leavers, carry the rest (in
        their order, the joiners after them as asked)."""
        held, wanted = self.asset_names, set(names)
        order = (*(a for a in held if a in wanted), *(a for a in names if a not in held))
        source = slot_sources(held, order, self.n_slots)
        sold = float(self.drifted[[j + 1 for j, a in enumerate(held) if a not in wanted]].sum())
        self._install([self._column[a] for a in order], self._k)
        drifted = carry(self.drifted, source)
        drifted[0] += sold
        self.drifted = drifted
        if self.executed is not None:
            self.executed = carry(self.executed, source)
        self._sold += sold
        self.history.remap(source, self.mask, self._slot_prices[0])
        return self.asset_names

    # --- stepping ------------------------------------------------------------------------

    @property
    def date(self) -> Any:
        """The decision date of the next step."""
        return self.data.dates[self._t0 + self._k]

    @property
    def t(self) -> int:
        return self._t0 + self._k

    def _observation(self) -> Float32Array:
        n = self._n_block
        j = self._k - self._row0
        obs = np.empty(self._obs_size, np.float32)
        if self.asset_spec is None:
            w, m = self.config.window, self.config.max_assets
            obs[:n].reshape(m, w)[:] = self._episode_features[j : j + w].T
        else:
            obs[:n] = self._episode_features[j]
        obs[n : n + self.n_slots] = self.drifted
        obs[n + self.n_slots :] = self._mask_f32
        return obs

    @property
    def anchor(self) -> FloatArray | None:
        """The tilt mapping's anchor at the next decision (None under the affine mapping)."""
        return None if self._anchors is None else self._anchors[self._k - self._row0]

    def action_weights(self, action: Float32Array | FloatArray) -> FloatArray:
        anchor = self.anchor
        if anchor is None:
            return action_to_weights(action, self.mask)
        return apply_tilt(action, anchor, self.config.action.k)

    def step(self, action: Float32Array | FloatArray) -> Step:
        if self._done:
            raise RuntimeError("episode is over: call reset()")
        return self._advance(self.action_weights(action))

    def step_weights(self, weights: Sequence[float] | FloatArray) -> Step:
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

    def _advance(self, raw: FloatArray) -> Step:
        j = self._k - self._row0
        s = ema_smooth(self.executed, raw, self.mask, self._beta)
        sold, self._sold = self._sold, 0.0
        traded = sold + float(turnover(s, self.drifted))
        cost = trade_cost(self._cost_rate, traded, self.nav)
        invested = self.nav - cost
        shares = invested * s / self._slot_prices[j]
        grown = s * self._growth[j]
        gross = float(np.add.reduce(grown))
        self.nav = invested * gross
        self.drifted = grown / gross
        self.executed = s
        self._k += 1
        benchmark = 0.0
        if self._relative and self._anchors is not None:
            benchmark = float(np.add.reduce(self._anchors[j] * self._growth[j])) - 1.0
        self.history.record(self.nav, s, self._slot_prices[j + 1], benchmark)
        reward = self.reward_fn(self.history)
        terminated = self.nav <= 1e-9 * self.config.initial_value
        truncated = self._k >= self._length and not terminated
        self._done = terminated or truncated
        info: dict[str, Any] = {
            "raw_weights": raw,
            "executed_weights": s,
            "shares": shares,
            "cost": cost,
            "turnover": traded,
            "liquidation_turnover": sold,
            "nav": self.nav,
        }
        if not self._done and self._k in self._changes:
            info["assets"] = self._change(self._changes[self._k])
        return self._observation(), float(reward), bool(terminated), bool(truncated), info


ENV_ID = "allocator/Portfolio-v0"
if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="allocator.trainer.sim.env:PortfolioEnv")
