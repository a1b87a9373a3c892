"""The saturation watch: an actor frozen at its tanh bounds (gate ``kappa = 1 - a^2`` ~0) is
found while it trains, on a probe set from a separate seeded environment (no training draws),
so the run warns and selection can refuse it. The rule (``RULE``) counts the bulk of live action
values, not one dimension: pinning one (always no cash) is a choice, not a collapse."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback

from allocator.trainer.sim.env import PortfolioEnv
from allocator.trainer.training.audit import action_saturation
from allocator.trainer.training.config import TrainConfig
from allocator.trainer.training.inputs import TrainingData

log = logging.getLogger("allocator.trainer")

NEAR_BOUND = 0.95
"""An action value with ``|a|`` at or above this is near the bound (as in the audit)."""

COLLAPSE_SHARE = 0.9
"""The actor is collapsed when at least this share of its live action values is near the bound."""

PROBE_SIZE = 256
"""Observations in the probe set."""

PROBE_EPISODE_STEPS = 32
"""Steps per probe episode: 8 episodes (universes, start dates) make up the probe set."""

PROBE_SEED_OFFSET = 7_919
"""Added to the run's seed for the probe environment, so its draws are not the training env's."""

RULE = (
    f"collapsed when >= {COLLAPSE_SHARE:.0%} of the deterministic actor's live action values on "
    f"the probe set have |a| >= {NEAR_BOUND}"
)


@dataclass(frozen=True)
class Saturation:
    """One measurement of the actor on the probe set."""

    step: int
    near_bound_ratio: float
    near_bound_ratio_per_dim: list[float | None]
    mean_kappa: float
    collapsed: bool

    @property
    def max_dim_ratio(self) -> float:
        """The highest near-bound share of one live action dimension."""
        return max((r for r in self.near_bound_ratio_per_dim if r is not None), default=0.0)

    def describe(self) -> str:
        return (
            f"step {self.step}: {self.near_bound_ratio:.1%} of live action values near the bound "
            f"(|a| >= {NEAR_BOUND}; worst dimension {self.max_dim_ratio:.1%}), "
            f"mean kappa {self.mean_kappa:.3g}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "max_dim_ratio": self.max_dim_ratio}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Saturation:
        return cls(**{k: v for k, v in raw.items() if k != "max_dim_ratio"})


class SaturationProbe:
    """A fixed batch of observations and which action slots are live in each."""

    def __init__(self, observations: np.ndarray, n_slots: int) -> None:
        self.observations = np.asarray(observations, dtype=np.float32)  # (n >= 2, obs_dim)
        # The flat observation ends with the mask (cash first); cash is always live.
        self.live = self.observations[:, -n_slots:] > 0.5
        self.live[:, 0] = True

    @classmethod
    def from_env(cls, env: PortfolioEnv, seed: int) -> SaturationProbe:
        """``PROBE_SIZE`` observations of ``env`` under random actions, in short episodes."""
        rng = np.random.default_rng(seed)
        shape = env.action_space.shape
        assert shape is not None
        observations: list[np.ndarray] = []
        episode = 0
        while len(observations) < PROBE_SIZE:
            obs, _ = env.reset(seed=seed + episode)
            episode += 1
            for _ in range(PROBE_EPISODE_STEPS):
                observations.append(obs)
                obs, _, terminated, truncated, _ = env.step(rng.uniform(-1.0, 1.0, shape))
                if terminated or truncated or len(observations) >= PROBE_SIZE:
                    break
        return cls(np.stack(observations), int(shape[0]))

    def measure(self, model: BaseAlgorithm, step: int) -> Saturation:
        """The deterministic actor's saturation on the probe set at ``step``."""
        actions, _ = model.predict(self.observations, deterministic=True)
        audit = action_saturation(np.asarray(actions), NEAR_BOUND, mask=self.live)
        ratio = float(audit["near_bound_ratio"])
        return Saturation(
            step=int(step),
            near_bound_ratio=ratio,
            near_bound_ratio_per_dim=audit["near_bound_ratio_per_dim"],
            mean_kappa=float(audit["mean_kappa"]),
            collapsed=ratio >= COLLAPSE_SHARE,
        )


@dataclass
class WatchState:
    """What the watch has seen, as saved in ``run.json`` and in every resumable checkpoint."""

    checks: int = 0
    collapsed_checks: int = 0
    first_collapsed_step: int | None = None
    last: dict[str, Any] | None = None
    last_check_step: int = 0


class SaturationWatch(BaseCallback):
    """Measures the actor on the probe set every ``every`` steps (0: only when asked), warning
    on entering collapse; ``init_callback`` must have run before ``check``."""

    def __init__(self, probe: SaturationProbe, every: int, state: WatchState | None = None) -> None:
        super().__init__()
        self.probe = probe
        self.every = every
        self.state = state or WatchState()

    def _on_step(self) -> bool:
        if self.every and self.num_timesteps - self.state.last_check_step >= self.every:
            self.check()
        return True

    def check(self) -> Saturation:
        """Measure the training model now; record, log and warn."""
        figures = self.probe.measure(self.model, int(self.model.num_timesteps))
        state = self.state
        was_collapsed = bool(state.last and state.last["collapsed"])
        state.checks += 1
        state.last_check_step = max(state.last_check_step, figures.step)
        state.last = figures.to_dict()
        if figures.collapsed:
            state.collapsed_checks += 1
            if state.first_collapsed_step is None:
                state.first_collapsed_step = figures.step
            if not was_collapsed:
                log.warning("actor collapsed at %s (%s)", figures.describe(), RULE)
        self.logger.record("train/saturation_near_bound", figures.near_bound_ratio)
        self.logger.record("train/saturation_max_dim", figures.max_dim_ratio)
        self.logger.record("train/saturation_mean_kappa", figures.mean_kappa)
        self.logger.record("train/actor_collapsed", float(figures.collapsed))
        return figures

    def at_current_step(self) -> Saturation:
        """The check at the model's current step: the one already made there, else a new one."""
        last = self.state.last
        if last is not None and last["step"] == self.model.num_timesteps:
            return Saturation.from_dict(last)
        return self.check()

    def summary(self) -> dict[str, Any]:
        """``run.json``'s ``saturation_watch``: the rule, the record and a warning if any."""
        state = self.state
        out: dict[str, Any] = {
            "rule": RULE,
            "near_bound": NEAR_BOUND,
            "collapse_share": COLLAPSE_SHARE,
            "probe_observations": int(self.probe.observations.shape[0]),
            "every": self.every,
            **asdict(state),
            "collapsed": state.first_collapsed_step is not None,
        }
        out.pop("last_check_step")
        if state.first_collapsed_step is not None:
            out["warning"] = collapse_message(state)
        return out


def make_watch(config: TrainConfig, data: TrainingData, saved: dict[str, Any]) -> SaturationWatch:
    """The run's watch, probing the prices it trains on; a resumed run's record carries on."""
    env = PortfolioEnv(data.fit, config.env, stats=data.stats, feature_norm=data.feature_norm)
    probe = SaturationProbe.from_env(env, config.seed + PROBE_SEED_OFFSET)
    record = saved.get("saturation_watch")
    state = WatchState(**record) if record else None
    return SaturationWatch(probe, config.saturation_watch.every, state)


def collapse_message(state: WatchState) -> str:
    """The one line a run prints when its actor collapsed."""
    last = state.last or {}
    now = "still collapsed" if last.get("collapsed") else "recovered"
    return (
        f"WARNING: the actor collapsed into the saturated corner at step "
        f"{state.first_collapsed_step} ({state.collapsed_checks} of {state.checks} checks; "
        f"{now} at step {last.get('step')}: {last.get('near_bound_ratio', float('nan')):.1%} "
        f"of live action values near the bound, mean kappa "
        f"{last.get('mean_kappa', float('nan')):.3g})"
    )


def collapse_warnings(summary: dict[str, Any]) -> list[str]:
    """The warning lines of a run's ``run.json`` (watch and selection), for the CLI to print."""
    parts = (summary.get("saturation_watch") or {}, summary.get("selection") or {})
    return [str(part["warning"]) for part in parts if "warning" in part]
