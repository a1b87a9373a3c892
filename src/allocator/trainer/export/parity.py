"""Parity of the exported graphs with torch: a policy graph against the torch mean of its
members' SB3 actors on numpy-normalized inputs, a curiosity graph against its module; the
figures go into the manifest, and any above ``PARITY_TOLERANCE`` fails the export."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from allocator.portfolio import (
    action_to_weights,
    live_mask,
    normalize_features,
    normalize_observation,
)
from allocator.registry.layout import ICM_INPUTS, ICM_OUTPUTS
from allocator.trainer.checkpoints.probes import max_abs
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.loaded_run import Float32Array, LoadedRun
from allocator.trainer.export.observations import (
    FlatObservations,
    SetObservations,
    normalize_flat,
    parity_sizes,
    random_inputs,
    real_set_observations,
    rollout,
)

PARITY_TOLERANCE = 1e-5
"""Largest absolute ONNX-vs-torch difference (actions, weights, rewards) an export accepts."""
PARITY_SAMPLES = 1000

Transitions = tuple[Float32Array, Float32Array, Float32Array, Float32Array]
"""Raw flat (previous observations, actions, observations, masks) of the training slots."""


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
