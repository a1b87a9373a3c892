"""Parity of a shared policy's graphs with torch, at several universe sizes.

A shared policy is served for any number of assets, so its graph is compared with the torch
actor (``forward_sets``) at half, once and twice the training slots ``M``: on random price
histories (calm to crisis, masks of every density, garbage in masked rows) and on real ones
(windows of the run's training data, and a rollout of the policy in the training environment,
where the graph's input built by ``portfolio.asset_features`` must also reproduce the
environment's own observation). Every input is built from prices with the contract's
functions, exactly as the server builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from allocator.portfolio import (
    assemble_observation,
    asset_features,
    live_mask,
    normalize_features,
)
from allocator.registry.layout import (
    SHARED_POLICY_INPUTS,
    SHARED_POLICY_OUTPUTS,
)
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.loaded_run import Float32Array, LoadedRun
from allocator.trainer.export.parity import (
    PARITY_SAMPLES,
    curiosity_parity,
    max_abs,
    onnx_session,
    random_live_masks,
    training_data,
)
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from allocator.trainer.sim.representation import ActionSettings, AnchorSettings

__all__ = [
    "SetObservations",
    "measure_shared_parity",
    "parity_sizes",
    "random_set_observations",
    "real_set_observations",
    "set_parity_sweep",
    "set_policy_parity",
    "shared_curiosity_parity",
    "shared_rollout",
]


@dataclass
class SetObservations:
    """Graph inputs for ``n`` decisions over N assets: raw features, weights and masks."""

    features: Float32Array  # (n, N, F) raw, as portfolio.asset_features computes them
    weights: Float32Array  # (n, N + 1)
    masks: Float32Array  # (n, N + 1)

    def feeds(self) -> dict[str, Float32Array]:
        return dict(
            zip(SHARED_POLICY_INPUTS, (self.features, self.weights, self.masks), strict=True)
        )


def parity_sizes(max_assets: int) -> tuple[int, ...]:
    """The universe sizes compared: half, once and twice the training slots."""
    return tuple(sorted({max(1, max_assets // 2), max_assets, 2 * max_assets}))


def random_weights(live: NDArray[np.bool_], rng: np.random.Generator) -> Float32Array:
    """Dirichlet weights of varying concentration over the live slots (some rows all cash)."""
    n = len(live)
    concentration = rng.choice([0.1, 1.0, 10.0], size=(n, 1))
    g = rng.gamma(concentration, size=live.shape) * live
    g[::7, 1:] = 0.0
    g[:, 0] = np.where(g.sum(axis=1) > 0, g[:, 0], 1.0)
    return (g / g.sum(axis=1, keepdims=True)).astype(np.float32)


def _with_garbage(
    raw: NDArray[np.float64], live: NDArray[np.bool_], rng: np.random.Generator
) -> Float32Array:
    """Raw features as float32 with large values (and NaN) written into masked rows: the graph
    must ignore whatever a caller leaves there."""
    out = raw.astype(np.float32)
    masked = ~live[:, 1:]
    noise = (100.0 * rng.standard_normal(out.shape)).astype(np.float32)
    noise[::5] = np.nan
    return np.where(masked[..., None], noise, out)


def random_set_observations(
    loaded: LoadedRun,
    n: int,
    n_assets: int,
    rng: np.random.Generator,
    live: NDArray[np.bool_] | None = None,
) -> SetObservations:
    """``n`` decisions over ``n_assets`` random price histories, calm (0.5% a day) to crisis
    (5%), Student-t (3 dof) returns with a drift, so that some normalized features clip;
    random masks of every density unless ``live`` is given."""
    spec = loaded.asset_spec
    live = random_live_masks(n, n_assets + 1, rng) if live is None else live
    scale = rng.choice([0.005, 0.01, 0.02, 0.05], size=(n, 1, 1))
    drift = rng.normal(0.0, 0.002, size=(n, n_assets, 1))
    steps = drift + scale * rng.standard_t(3.0, size=(n, n_assets, spec.prices_per_asset - 1))
    start = rng.uniform(5.0, 500.0, size=(n, n_assets, 1))
    prices = start * np.exp(np.concatenate([np.zeros_like(start), np.cumsum(steps, -1)], -1))
    raw = asset_features(prices, live, spec)
    masks = live.astype(np.float32)
    return SetObservations(_with_garbage(raw, live, rng), random_weights(live, rng), masks)


def real_set_observations(
    loaded: LoadedRun, n: int, n_assets: int, rng: np.random.Generator
) -> SetObservations:
    """``n`` decisions over ``n_assets`` assets of the training data at random dates (drawn
    with replacement when the data has fewer assets); an asset without a full window of
    closes is masked, as are random others."""
    spec = loaded.asset_spec
    prices = training_data(loaded).prices
    p = spec.prices_per_asset
    if prices.shape[0] < p:
        raise ExportError(f"training period too short for {p} closes per asset")
    ends = rng.integers(p - 1, prices.shape[0], size=n)
    replace = prices.shape[1] < n_assets
    idx = np.stack([rng.choice(prices.shape[1], n_assets, replace=replace) for _ in range(n)])
    rows = ends[:, None] - p + 1 + np.arange(p)  # (n, P)
    windows = np.transpose(prices[rows[:, :, None], idx[:, None, :]], (0, 2, 1))  # (n, N, P)
    valid = np.all(np.isfinite(windows) & (windows > 0), axis=-1)
    live = random_live_masks(n, n_assets + 1, rng)
    live[:, 1:] &= valid
    raw = asset_features(windows, live, spec)
    masks = live.astype(np.float32)
    return SetObservations(_with_garbage(raw, live, rng), random_weights(live, rng), masks)


def set_policy_parity(session: Any, loaded: LoadedRun, obs: SetObservations) -> dict[str, Any]:
    """ONNX shared policy vs torch ``forward_sets`` on numpy-normalized features.

    ``max_abs_masked_action``: the graph's largest |action| on a masked slot (must be 0).
    """
    (action,) = session.run(list(SHARED_POLICY_OUTPUTS), obs.feeds())
    live = live_mask(obs.masks)
    spec = loaded.asset_spec
    assert loaded.feature_norm is not None
    normalized = normalize_features(obs.features, loaded.feature_norm, spec.clip, live)
    reference = loaded.reference_sets()(normalized, obs.weights, live.astype(np.float32))
    return {
        "n": len(action),
        "assets": int(obs.features.shape[1]),
        "max_abs_action_diff": max_abs(action, reference),
        "max_abs_masked_action": float(np.max(np.abs(np.where(live, 0.0, action)))),
    }


@dataclass
class SharedRollout:
    """Raw flat observations of a rollout in the training environment, and what followed."""

    sets: SetObservations
    observations: Float32Array  # raw flat [M*F raw features, weights, mask]
    actions: Float32Array
    next_observations: Float32Array
    max_abs_observation_diff: float
    """Largest gap between the environment's observation and the one rebuilt from prices."""
    max_abs_flat_action_diff: float
    """Largest gap between SB3's actor on the environment's observation and ``forward_sets``."""


def _rollout_env(loaded: LoadedRun) -> PortfolioEnv:
    """The run's training environment (features, mapping, costs) rebuilt from the manifest."""
    m, fs = loaded.manifest, loaded.manifest.feature_spec
    data = training_data(loaded)
    action = ActionSettings()
    if m.tilt is not None:
        a = m.tilt.anchor
        anchor = AnchorSettings.model_validate(
            {"kind": a.kind, "cash_share": a.cash_share, "vol_window": a.vol_window}
        )
        action = ActionSettings(mapping="tilt", k=m.tilt.k, anchor=anchor)
    spec = loaded.asset_spec
    config = EnvConfig(
        max_assets=fs.max_assets,
        min_assets=1,
        window=spec.window,
        episode_length=1,
        cost_bps=m.cost_bps,
        beta=m.beta,
        obs_clip=spec.clip,
        features="asset_v1",
        horizons=list(spec.horizons),
        vol_window=spec.vol_window,
        action=action,
    )
    length = min(252, data.n_dates - 1 - config.history)
    if length < 1:
        raise ExportError(f"{m.data.dataset}: training period too short for the features")
    config = config.model_copy(update={"episode_length": length})
    return PortfolioEnv(data, config, stats=loaded.stats, feature_norm=loaded.feature_norm)


def _raw_flat(env: PortfolioEnv, loaded: LoadedRun) -> tuple[Float32Array, Float32Array]:
    """The raw features (M, F) of the environment's next decision from its real price window,
    and the raw flat observation of the training slots."""
    spec, layout = loaded.asset_spec, loaded.spec
    p = spec.prices_per_asset
    prices = np.full((layout.max_assets, p), np.nan)
    k = len(env.asset_index)
    prices[:k] = env.data.prices[env.t - p + 1 : env.t + 1, env.asset_index].T
    raw = asset_features(prices, env.mask, spec).astype(np.float32)
    flat = assemble_observation(raw, env.drifted, env.mask, layout)
    return raw, flat


def shared_rollout(loaded: LoadedRun, n: int, seed: int = 0) -> SharedRollout:
    """Roll the deterministic policy over the training data in its own environment."""
    env = _rollout_env(loaded)
    actor, sets = loaded.reference_actor(), loaded.reference_sets()
    norm, clip = loaded.feature_norm, loaded.asset_spec.clip
    assert norm is not None
    n_feat = loaded.spec.max_assets * loaded.spec.window
    parts: dict[str, list[Float32Array]] = {k: [] for k in ("f", "w", "m", "o", "a", "next")}
    worst_obs = worst_act = 0.0
    env_obs, _ = env.reset(seed=seed)
    raw, flat = _raw_flat(env, loaded)
    while len(parts["a"]) < n:
        live = live_mask(env.mask)
        normalized = normalize_features(raw, norm, clip, live)
        worst_obs = max(worst_obs, max_abs(normalized.reshape(-1), env_obs[:n_feat]))
        action = actor(env_obs[None])[0]
        live_f = live.astype(np.float32)
        set_action = sets(normalized[None], env.drifted[None], live_f[None])[0]
        worst_act = max(worst_act, max_abs(action, set_action))
        for key, value in zip("fwmoa", (raw, env.drifted, live_f, flat, action), strict=True):
            parts[key].append(np.asarray(value, dtype=np.float32))
        env_obs, _, terminated, truncated, _ = env.step(action)
        raw, flat = _raw_flat(env, loaded)
        parts["next"].append(flat)
        if terminated or truncated:
            env_obs, _ = env.reset()
            raw, flat = _raw_flat(env, loaded)
    stacked = {k: np.stack(v) for k, v in parts.items()}
    return SharedRollout(
        SetObservations(stacked["f"], stacked["w"], stacked["m"]),
        stacked["o"],
        stacked["a"],
        stacked["next"],
        worst_obs,
        worst_act,
    )


def shared_curiosity_parity(
    session: Any,
    loaded: LoadedRun,
    previous: Float32Array,
    actions: Float32Array,
    current: Float32Array,
    masks: Float32Array,
) -> dict[str, float | int]:
    """ONNX curiosity graph vs ``CuriosityNet.forward`` on numpy-normalized flat observations."""
    norm = loaded.feature_norm
    assert norm is not None
    layout = loaded.spec
    n_feat = layout.max_assets * layout.window

    def normalized(raw: Float32Array) -> Float32Array:
        block = raw[:, :n_feat].reshape(-1, layout.max_assets, layout.window)
        z = normalize_features(block, norm, layout.clip, masks)
        weights = raw[:, n_feat : n_feat + layout.n_slots]
        return assemble_observation(z, weights, masks, layout)

    return curiosity_parity(session, loaded, previous, actions, current, masks, normalized)


def _flat(obs: SetObservations, loaded: LoadedRun) -> Float32Array:
    return assemble_observation(obs.features, obs.weights, obs.masks, loaded.spec)


def set_parity_sweep(
    loaded: LoadedRun,
    n: int,
    rng: np.random.Generator,
    rollout: SharedRollout,
    measure: Callable[[SetObservations], dict[str, Any]],
) -> dict[str, Any]:
    """``measure`` on ``n`` random and ``n`` real decisions at each size of ``parity_sizes``,
    and on the rollout's decisions: the layout of every shared (or shared ensemble) parity."""
    sizes = parity_sizes(loaded.spec.max_assets)
    return {
        "random": {
            f"n{size}": measure(random_set_observations(loaded, n, size, rng)) for size in sizes
        },
        "real": {
            **{f"n{size}": measure(real_set_observations(loaded, n, size, rng)) for size in sizes},
            "rollout": {
                **measure(rollout.sets),
                "max_abs_observation_diff": rollout.max_abs_observation_diff,
            },
        },
    }


def measure_shared_parity(
    loaded: LoadedRun,
    model_path: Path,
    icm_path: Path | None,
    n: int = PARITY_SAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Parity of a shared policy's graphs with torch: ``n`` random and ``n`` real decisions at
    each size of ``parity_sizes``, and ``n`` decisions of a rollout in the training
    environment (curiosity: random and rollout transitions of the training slots)."""
    rng = np.random.default_rng(seed)
    policy = onnx_session(model_path)
    rollout = shared_rollout(loaded, n, seed=seed)
    parity = set_parity_sweep(
        loaded, n, rng, rollout, lambda obs: set_policy_parity(policy, loaded, obs)
    )
    parity["real"]["rollout"]["max_abs_flat_action_diff"] = rollout.max_abs_flat_action_diff
    if icm_path is not None:
        icm = onnx_session(icm_path)
        m = loaded.spec.max_assets
        before = random_set_observations(loaded, n, m, rng)
        after = random_set_observations(loaded, n, m, rng, live=before.masks > 0)
        actions = rng.uniform(-1.0, 1.0, size=(n, m + 1)).astype(np.float32)
        parity["icm"] = {
            "random": shared_curiosity_parity(
                icm, loaded, _flat(before, loaded), actions, _flat(after, loaded), before.masks
            ),
            "real": shared_curiosity_parity(
                icm,
                loaded,
                rollout.observations,
                rollout.actions,
                rollout.next_observations,
                rollout.sets.masks,
            ),
        }
    return parity
