"""Parity of the exported graphs with torch: a policy graph against the torch mean of its
members' SB3 actors on numpy-normalized inputs, a curiosity graph against its module; the
figures go into the manifest, and any above ``PARITY_TOLERANCE`` fails the export. The inputs:
random (calm to crisis markets, masks of every density) and real (training data, a rollout)
observations, built from prices with the contract's functions exactly as the server builds them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from numpy.typing import NDArray

from allocator.portfolio import (
    AssetFeatureSpec,
    FeatureSpec,
    action_to_weights,
    assemble_observation,
    asset_features,
    build_raw_observation,
    live_mask,
    normalize_features,
    normalize_observation,
)
from allocator.registry.layout import (
    ICM_INPUTS,
    ICM_OUTPUTS,
    POLICY_INPUTS,
    SHARED_POLICY_INPUTS,
)
from allocator.trainer.checkpoints.probes import max_abs
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.loaded_run import Float32Array, LoadedRun
from allocator.trainer.market.data import DataError, MarketData, load_dataset
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from allocator.trainer.sim.representation import ActionSettings, AnchorSettings

PARITY_TOLERANCE = 1e-5
"""Largest absolute ONNX-vs-torch difference (actions, weights, rewards) an export accepts."""
PARITY_SAMPLES = 1000

Transitions = tuple[Float32Array, Float32Array, Float32Array, Float32Array]
"""Raw flat (previous observations, actions, observations, masks) of the training slots."""


@dataclass
class FlatObservations:
    """Inputs of a flat graph for ``n`` decisions: raw observations and masks."""

    observations: Float32Array  # (n, obs_size), as portfolio.build_raw_observation builds them
    masks: Float32Array  # (n, max_assets + 1)

    def feeds(self) -> dict[str, Float32Array]:
        return dict(zip(POLICY_INPUTS, (self.observations, self.masks), strict=True))

    def flat(self, layout: FeatureSpec) -> Float32Array:
        return self.observations


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

    def flat(self, layout: FeatureSpec) -> Float32Array:
        """The raw flat observations of the training slots (N = ``layout.max_assets``)."""
        return assemble_observation(self.features, self.weights, self.masks, layout)


def random_live_masks(n: int, n_slots: int, rng: np.random.Generator) -> NDArray[np.bool_]:
    """Random live masks (cash live) of every density; every tenth row is cash only."""
    density = rng.uniform(0.0, 1.0, size=(n, 1))
    live = rng.random((n, n_slots)) < density
    live[::10, 1:] = False
    live[:, 0] = True
    return live


def random_weights(live: NDArray[np.bool_], rng: np.random.Generator) -> Float32Array:
    """Dirichlet weights of varying concentration over the live slots (some rows all cash)."""
    concentration = rng.choice([0.1, 1.0, 10.0], size=(len(live), 1))
    g = rng.gamma(concentration, size=live.shape) * live
    g[::7, 1:] = 0.0
    g[:, 0] = np.where(g.sum(axis=1) > 0, g[:, 0], 1.0)
    return (g / g.sum(axis=1, keepdims=True)).astype(np.float32)


def random_raw_observations(
    spec: FeatureSpec, n: int, rng: np.random.Generator, live: NDArray[np.bool_] | None = None
) -> tuple[Float32Array, Float32Array]:
    """``n`` raw flat observations and masks: Student-t returns, calm to crisis, some clipping."""
    live = random_live_masks(n, spec.n_slots, rng) if live is None else live
    scale = rng.choice([0.005, 0.01, 0.02, 0.05], size=(n, 1, 1))
    returns = scale * rng.standard_t(3.0, size=(n, spec.max_assets, spec.window))
    obs = assemble_observation(returns, random_weights(live, rng), live, spec)
    return obs, live.astype(np.float32)


def parity_sizes(max_assets: int) -> tuple[int, ...]:
    """The universe sizes a shared graph is compared at: half, once and twice the training slots."""
    return tuple(sorted({max(1, max_assets // 2), max_assets, 2 * max_assets}))


def _set_observations(
    prices: NDArray[np.float64],
    live: NDArray[np.bool_],
    spec: AssetFeatureSpec,
    rng: np.random.Generator,
) -> SetObservations:
    """The raw features of ``prices``, garbage (and NaN) in masked rows, random weights."""
    out = asset_features(prices, live, spec).astype(np.float32)
    noise = (100.0 * rng.standard_normal(out.shape)).astype(np.float32)
    noise[::5] = np.nan
    garbage = np.where(~live[:, 1:, None], noise, out)
    return SetObservations(garbage, random_weights(live, rng), live.astype(np.float32))


def random_inputs(
    loaded: LoadedRun,
    n: int,
    n_assets: int,
    rng: np.random.Generator,
    live: NDArray[np.bool_] | None = None,
) -> FlatObservations | SetObservations:
    """``n`` random decisions of the run's representation; a flat one has its training slots."""
    if loaded.shared:
        return random_set_observations(loaded, n, n_assets, rng, live)
    return FlatObservations(*random_raw_observations(loaded.spec, n, rng, live))


def random_set_observations(
    loaded: LoadedRun,
    n: int,
    n_assets: int,
    rng: np.random.Generator,
    live: NDArray[np.bool_] | None = None,
) -> SetObservations:
    """``n`` decisions over ``n_assets`` random price histories, calm to crisis, some clipping."""
    spec = loaded.asset_spec
    live = random_live_masks(n, n_assets + 1, rng) if live is None else live
    scale = rng.choice([0.005, 0.01, 0.02, 0.05], size=(n, 1, 1))
    drift = rng.normal(0.0, 0.002, size=(n, n_assets, 1))
    steps = drift + scale * rng.standard_t(3.0, size=(n, n_assets, spec.prices_per_asset - 1))
    start = rng.uniform(5.0, 500.0, size=(n, n_assets, 1))
    prices = start * np.exp(np.concatenate([np.zeros_like(start), np.cumsum(steps, -1)], -1))
    return _set_observations(prices, live, spec, rng)


def training_data(loaded: LoadedRun) -> MarketData:
    """The run's training data (its universe when the dataset still has it), from the manifest."""
    m = loaded.manifest
    try:
        data = load_dataset(m.data.dataset).between(m.data.train_start, m.data.train_end)
        if m.data.universe and set(m.data.universe) <= set(data.assets):
            data = data.select(m.data.universe)
    except DataError as exc:
        raise ExportError(f"cannot rebuild the training data for the parity check: {exc}") from exc
    return data


def training_env(loaded: LoadedRun) -> PortfolioEnv:
    """The run's training environment (features, mapping, costs) rebuilt from the manifest."""
    m, fs = loaded.manifest, loaded.manifest.feature_spec
    data = training_data(loaded)
    action = ActionSettings()
    if m.tilt is not None:
        anchor = AnchorSettings.model_validate(m.tilt.anchor.model_dump())
        action = ActionSettings(mapping="tilt", k=m.tilt.k, anchor=anchor)
    per_asset: dict[str, Any] = {"horizons": fs.horizons, "vol_window": fs.vol_window}
    config = EnvConfig(
        max_assets=fs.max_assets,
        min_assets=1,
        window=fs.window,
        episode_length=1,
        cost_bps=m.cost_bps,
        beta=m.beta,
        obs_clip=fs.clip,
        features=fs.kind,
        action=action,
        **(per_asset if loaded.shared else {}),
    )
    length = min(252, data.n_dates - 1 - config.history)
    if length < 1:
        raise ExportError(
            f"{m.data.dataset}: training period too short for {config.history} days of history"
        )
    config = config.model_copy(update={"episode_length": length})
    return PortfolioEnv(data, config, stats=loaded.stats, feature_norm=loaded.feature_norm)


def normalize_flat(loaded: LoadedRun, raw: Float32Array, masks: Float32Array) -> Float32Array:
    """Raw flat observations (B, obs_size) as the run's networks were trained on them."""
    layout = loaded.spec
    if not loaded.shared:
        return normalize_observation(raw, layout, loaded.stats)
    assert loaded.feature_norm is not None
    n_feat = layout.max_assets * layout.window
    block = raw[:, :n_feat].reshape(-1, layout.max_assets, layout.window)
    z = normalize_features(block, loaded.feature_norm, layout.clip, masks)
    return assemble_observation(z, raw[:, n_feat : n_feat + layout.n_slots], masks, layout)


def _raw_observation(env: PortfolioEnv, loaded: LoadedRun) -> Float32Array:
    """The raw flat observation of the environment's next decision, from its real price
    window: log returns (``build_raw_observation``) or ``asset_features`` rows."""
    layout = loaded.spec
    p = loaded.asset_spec.prices_per_asset if loaded.shared else layout.prices_per_asset
    prices = np.full((layout.max_assets, p), np.nan)
    prices[: len(env.asset_index)] = env.data.prices[env.t - p + 1 : env.t + 1, env.asset_index].T
    if not loaded.shared:
        return build_raw_observation(prices, env.drifted, env.mask, layout)
    raw = asset_features(prices, env.mask, loaded.asset_spec).astype(np.float32)
    return assemble_observation(raw, env.drifted, env.mask, layout)


@dataclass
class Rollout:
    """A rollout of the run's deterministic policy over its training data, in its own
    environment: the decisions met, as the policy graph takes them, and what followed."""

    inputs: FlatObservations | SetObservations
    observations: Float32Array  # raw flat [M*F raw features, weights, mask]
    actions: Float32Array
    next_observations: Float32Array
    max_abs_observation_diff: float
    """Largest gap between the environment's observation and the one rebuilt from prices."""
    max_abs_flat_action_diff: float | None
    """Shared: largest gap between SB3's actor on the environment's observation and
    ``forward_sets`` on the rebuilt features; None for a flat run."""


def rollout(loaded: LoadedRun, n: int, seed: int = 0) -> Rollout:
    """Roll the run's deterministic policy over ``n`` decisions of its training data: a flat
    run acts on its observation rebuilt from prices, a shared run on the environment's own."""
    env = training_env(loaded)
    layout = loaded.spec
    m, f = layout.max_assets, layout.window
    parts: dict[str, list[Float32Array]] = {k: [] for k in ("o", "w", "m", "a", "next")}
    worst_obs, worst_act = 0.0, None
    env_obs, _ = env.reset(seed=seed)
    raw = _raw_observation(env, loaded)
    while len(parts["a"]) < n:
        live_f = live_mask(env.mask).astype(np.float32)
        normalized = normalize_flat(loaded, raw[None], live_f[None])[0]
        worst_obs = max(worst_obs, max_abs(normalized, env_obs))
        action = loaded.reference_action((env_obs if loaded.shared else normalized)[None])[0]
        if loaded.shared:
            z = normalized[: m * f].reshape(1, m, f)
            set_action = loaded.reference_set_action(z, env.drifted[None], live_f[None])[0]
            worst_act = max(worst_act or 0.0, max_abs(action, set_action))
        for key, value in zip("owma", (raw, env.drifted, live_f, action), strict=True):
            parts[key].append(np.asarray(value, dtype=np.float32))
        env_obs, _, terminated, truncated, _ = env.step(action)
        raw = _raw_observation(env, loaded)
        parts["next"].append(raw)
        if terminated or truncated:
            env_obs, _ = env.reset()
            raw = _raw_observation(env, loaded)
    o, w, masks, a, following = (np.stack(v) for v in parts.values())
    inputs: FlatObservations | SetObservations = FlatObservations(o, masks)
    if loaded.shared:
        inputs = SetObservations(o[:, : m * f].reshape(-1, m, f), w, masks)
    return Rollout(inputs, o, a, following, worst_obs, worst_act)


def real_set_observations(
    loaded: LoadedRun, n: int, n_assets: int, rng: np.random.Generator
) -> SetObservations:
    """``n`` decisions over ``n_assets`` assets of the training data at random dates (with
    replacement when it has fewer); assets without a full window are masked, and random others."""
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
    return _set_observations(windows, live, spec, rng)


def onnx_session(path: Path) -> Any:
    """An onnxruntime CPU session (parity is a CPU measurement whatever the server uses)."""
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _member_action(member: LoadedRun, obs: FlatObservations | SetObservations) -> Float32Array:
    """A member's torch action on ``obs`` normalized in numpy with its own statistics."""
    if isinstance(obs, FlatObservations):
        normalized = normalize_observation(obs.observations, member.spec, member.stats)
        return member.reference_action(normalized)
    assert member.feature_norm is not None
    live = live_mask(obs.masks)
    z = normalize_features(obs.features, member.feature_norm, member.asset_spec.clip, live)
    return member.reference_set_action(z, obs.weights, live.astype(np.float32))


def policy_parity(
    session: Any, members: Sequence[LoadedRun], obs: FlatObservations | SetObservations
) -> dict[str, Any]:
    """The ONNX policy vs the torch mean of its members' actions; a flat graph's weights are
    checked against numpy's mapping of the graph's own action (near-zero preferences amplify
    float32 action gaps, so ``end_to_end_weight_diff`` is reported, not checked)."""
    outputs = session.run(None, obs.feeds())
    action = outputs[0]
    actions = [_member_action(m, obs) for m in members]
    reference = actions[0] if len(actions) == 1 else np.mean(np.stack(actions), axis=0)
    figures: dict[str, Any] = {"n": len(action)}
    if isinstance(obs, SetObservations):
        figures["assets"] = int(obs.features.shape[1])
    figures["max_abs_action_diff"] = max_abs(action, reference)
    if isinstance(obs, FlatObservations):
        figures["max_abs_weight_diff"] = max_abs(outputs[1], action_to_weights(action, obs.masks))
        end_to_end = max_abs(outputs[1], action_to_weights(reference, obs.masks))
        figures["end_to_end_weight_diff"] = end_to_end
    else:
        masked = np.where(live_mask(obs.masks), 0.0, action)
        figures["max_abs_masked_action"] = float(np.max(np.abs(masked)))
    if len(actions) > 1:
        figures["member_spread"] = max(max_abs(a, reference) for a in actions)
    return figures


def curiosity_parity(
    session: Any, loaded: LoadedRun, transitions: Transitions
) -> dict[str, float | int]:
    """ONNX curiosity graph vs ``CuriosityNet.forward`` on numpy-normalized observations."""
    assert loaded.icm is not None
    previous, actions, current, masks = transitions
    (reward,) = session.run(list(ICM_OUTPUTS), dict(zip(ICM_INPUTS, transitions, strict=True)))
    with torch.no_grad():
        ref = loaded.icm.net(
            torch.as_tensor(normalize_flat(loaded, previous, masks)),
            torch.as_tensor(actions),
            torch.as_tensor(normalize_flat(loaded, current, masks)),
        ).numpy()
    return {"n": len(previous), "max_abs_reward_diff": max_abs(reward, ref)}


def _diffs(parity: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for key, value in parity.items():
        if isinstance(value, dict):
            yield from _diffs(value, f"{prefix}{key}.")
        elif key.startswith("max_abs_"):
            yield f"{prefix}{key}", float(value)


def check_parity(parity: dict[str, Any], tolerance: float = PARITY_TOLERANCE) -> None:
    """Raise ``ExportError`` naming every difference above ``tolerance`` (or not finite)."""
    bad = [
        f"{key} = {value:.3g}"
        for key, value in _diffs(parity)
        if not (math.isfinite(value) and value <= tolerance)
    ]
    if bad:
        raise ExportError(
            f"ONNX/torch parity above the tolerance {tolerance:g}: {', '.join(bad)}; "
            "nothing was written to the registry"
        )


def format_parity(parity: dict[str, Any]) -> str:
    """One line per measured difference, for the CLI."""
    return "\n".join(f"  {key:<36} {value:.3g}" for key, value in _diffs(parity))


def measure_parity(
    members: Sequence[LoadedRun],
    model_path: Path,
    icm_path: Path | None = None,
    n: int = PARITY_SAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Parity of the exported graphs with torch on ``n`` random and ``n`` real inputs (a shared
    graph's at each ``parity_sizes`` size) and the first member's curiosity graph."""
    rng = np.random.default_rng(seed)
    session = onnx_session(model_path)
    first = members[0]
    m = first.spec.max_assets
    measure = functools.partial(policy_parity, session, members)
    real = rollout(first, n, seed=seed)
    on_rollout = {**measure(real.inputs), "max_abs_observation_diff": real.max_abs_observation_diff}
    if first.shared:
        if len(members) == 1:  # SB3's flat call on the first member: not an ensemble's figure
            on_rollout["max_abs_flat_action_diff"] = real.max_abs_flat_action_diff
        sizes = parity_sizes(m)
        random = {f"n{s}": measure(random_inputs(first, n, s, rng)) for s in sizes}
        on_sets = {f"n{s}": measure(real_set_observations(first, n, s, rng)) for s in sizes}
        parity = {"random": random, "real": {**on_sets, "rollout": on_rollout}}
        before = None if icm_path is None else random_inputs(first, n, m, rng)
    else:  # the flat graph's random inputs are the curiosity graph's too
        before = random_inputs(first, n, m, rng)
        parity = {"random": measure(before), "real": on_rollout}
    if before is None or icm_path is None:
        return parity
    after = random_inputs(first, n, m, rng, live=before.masks > 0)
    actions = rng.uniform(-1.0, 1.0, size=(n, m + 1)).astype(np.float32)
    transitions = {
        "random": (before.flat(first.spec), actions, after.flat(first.spec), before.masks),
        "real": (real.observations, real.actions, real.next_observations, real.inputs.masks),
    }
    icm = onnx_session(icm_path)
    parity["icm"] = {k: curiosity_parity(icm, first, t) for k, t in transitions.items()}
    return parity
