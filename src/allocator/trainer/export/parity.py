"""Parity of the exported graphs with torch: the comparison, its figures and the check.

A policy graph of k >= 1 members is compared with the torch mean of its members' actions, each
computed exactly as a single export's reference is (the member's SB3 actor on the input
normalized in numpy with that member's own statistics): on ``PARITY_SAMPLES`` random and as
many real inputs (``export.observations``), and for a shared graph at half, once and twice the
training slots. A curiosity graph is compared with its module on random and real transitions.
The figures go into the exported manifest; an export whose graphs disagree with torch by more
than ``PARITY_TOLERANCE`` fails and leaves the registry untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from allocator.portfolio import (
    action_to_weights,
    assemble_observation,
    live_mask,
    normalize_features,
    normalize_observation,
)
from allocator.registry.layout import ICM_OUTPUTS
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.loaded_run import Float32Array, LoadedRun
from allocator.trainer.export.observations import (
    FlatObservations,
    SetObservations,
    max_abs,
    parity_sizes,
    random_raw_observations,
    random_set_observations,
    real_set_observations,
    real_transitions,
    shared_rollout,
)

__all__ = [
    "PARITY_SAMPLES",
    "PARITY_TOLERANCE",
    "Transitions",
    "check_parity",
    "curiosity_parity",
    "format_parity",
    "measure_parity",
    "onnx_session",
    "policy_parity",
]

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
        return member.reference_actor()(normalized)
    assert member.feature_norm is not None
    live = live_mask(obs.masks)
    z = normalize_features(obs.features, member.feature_norm, member.asset_spec.clip, live)
    return member.reference_sets()(z, obs.weights, live.astype(np.float32))


def policy_parity(
    session: Any, members: Sequence[LoadedRun], obs: FlatObservations | SetObservations
) -> dict[str, Any]:
    """The ONNX policy vs the torch mean of its members' actions.

    Flat: the graph's weights are checked against numpy ``action_to_weights`` of the graph's
    *own* action, apart from the network. When every live preference is near 0 (actions near
    -1, common on random observations) renormalizing divides by a small sum and multiplies any
    float32 action difference, so a torch-to-ONNX weight comparison would fail a correct graph
    (seen: 1.6e-5 from a 5e-7 action difference); that figure is still reported
    (``end_to_end_weight_diff``), not checked. Shared: ``max_abs_masked_action``, the graph's
    largest |action| on a masked slot, must be 0. An ensemble also reports how far its members
    disagree (``member_spread``, not checked).
    """
    outputs = session.run(None, obs.feeds())
    action = outputs[0]
    actions = [_member_action(m, obs) for m in members]
    reference = actions[0] if len(actions) == 1 else np.mean(np.stack(actions), axis=0)
    figures: dict[str, Any] = {"n": len(action)}
    if isinstance(obs, FlatObservations):
        figures["max_abs_action_diff"] = max_abs(action, reference)
        figures["max_abs_weight_diff"] = max_abs(outputs[1], action_to_weights(action, obs.masks))
        end_to_end = max_abs(outputs[1], action_to_weights(reference, obs.masks))
        figures["end_to_end_weight_diff"] = end_to_end
    else:
        live = live_mask(obs.masks)
        figures["assets"] = int(obs.features.shape[1])
        figures["max_abs_action_diff"] = max_abs(action, reference)
        figures["max_abs_masked_action"] = float(np.max(np.abs(np.where(live, 0.0, action))))
    if len(actions) > 1:
        figures["member_spread"] = max(max_abs(a, reference) for a in actions)
    return figures


def _normalized_flat(loaded: LoadedRun, raw: Float32Array, masks: Float32Array) -> Float32Array:
    """A raw flat observation as the curiosity module was trained on it."""
    layout = loaded.spec
    if not loaded.shared:
        return normalize_observation(raw, layout, loaded.stats)
    assert loaded.feature_norm is not None
    n_feat = layout.max_assets * layout.window
    block = raw[:, :n_feat].reshape(-1, layout.max_assets, layout.window)
    z = normalize_features(block, loaded.feature_norm, layout.clip, masks)
    weights = raw[:, n_feat : n_feat + layout.n_slots]
    return assemble_observation(z, weights, masks, layout)


def curiosity_parity(
    session: Any, loaded: LoadedRun, transitions: Transitions
) -> dict[str, float | int]:
    """ONNX curiosity graph vs ``CuriosityNet.forward`` on numpy-normalized observations."""
    assert loaded.icm is not None
    previous, actions, current, masks = transitions
    (reward,) = session.run(
        list(ICM_OUTPUTS),
        {
            "previous_observation": previous,
            "action": actions,
            "observation": current,
            "mask": masks,
        },
    )
    with torch.no_grad():
        ref = loaded.icm.net(
            torch.as_tensor(_normalized_flat(loaded, previous, masks)),
            torch.as_tensor(actions),
            torch.as_tensor(_normalized_flat(loaded, current, masks)),
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


Measure = Callable[[FlatObservations | SetObservations], dict[str, Any]]


def _flat_parity(
    first: LoadedRun,
    measure: Measure,
    n: int,
    rng: np.random.Generator,
    seed: int,
    curiosity: bool,
) -> tuple[dict[str, Any], dict[str, Transitions]]:
    """Flat figures on ``n`` random and ``n`` real observations, and the transitions a
    curiosity graph is compared on (drawn only for one)."""
    random_obs, random_masks = random_raw_observations(first.spec, n, rng)
    real = real_transitions(first, n, seed=seed)
    parity = {
        "random": measure(FlatObservations(random_obs, random_masks)),
        "real": {
            **measure(FlatObservations(real.observations, real.masks)),
            "max_abs_observation_diff": real.max_abs_observation_diff,
        },
    }
    if not curiosity:
        return parity, {}
    following, _ = random_raw_observations(first.spec, n, rng, live=random_masks > 0)
    actions = rng.uniform(-1.0, 1.0, size=(n, first.spec.n_slots)).astype(np.float32)
    return parity, {
        "random": (random_obs, actions, following, random_masks),
        "real": (real.observations, real.actions, real.next_observations, real.masks),
    }


def _set_parity(
    first: LoadedRun,
    measure: Measure,
    n: int,
    rng: np.random.Generator,
    seed: int,
    curiosity: bool,
    single: bool,
) -> tuple[dict[str, Any], dict[str, Transitions]]:
    """Shared figures on ``n`` random and ``n`` real decisions at each ``parity_sizes`` size and
    on a rollout, and the curiosity graph's transitions of the training slots."""
    rollout = shared_rollout(first, n, seed=seed)
    sizes = parity_sizes(first.spec.max_assets)
    random = {f"n{s}": measure(random_set_observations(first, n, s, rng)) for s in sizes}
    real = {f"n{s}": measure(real_set_observations(first, n, s, rng)) for s in sizes}
    parity = {"random": random, "real": real}
    real["rollout"] = {
        **measure(rollout.sets),
        "max_abs_observation_diff": rollout.max_abs_observation_diff,
    }
    if single:  # SB3's flat call on the first member: an ensemble's figures leave it out
        real["rollout"]["max_abs_flat_action_diff"] = rollout.max_abs_flat_action_diff
    if not curiosity:
        return parity, {}
    m = first.spec.max_assets
    before = random_set_observations(first, n, m, rng)
    after = random_set_observations(first, n, m, rng, live=before.masks > 0)
    actions = rng.uniform(-1.0, 1.0, size=(n, m + 1)).astype(np.float32)

    def flat(obs: SetObservations) -> Float32Array:
        return assemble_observation(obs.features, obs.weights, obs.masks, first.spec)

    return parity, {
        "random": (flat(before), actions, flat(after), before.masks),
        "real": (
            rollout.observations,
            rollout.actions,
            rollout.next_observations,
            rollout.sets.masks,
        ),
    }


def measure_parity(
    members: Sequence[LoadedRun],
    model_path: Path,
    icm_path: Path | None = None,
    n: int = PARITY_SAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Parity of the exported graphs of ``members`` (one run, or a seed ensemble) with torch on
    ``n`` random and ``n`` real inputs; the curiosity graph ``icm_path`` is the first member's."""
    rng = np.random.default_rng(seed)
    session = onnx_session(model_path)
    first = members[0]

    def measure(obs: FlatObservations | SetObservations) -> dict[str, Any]:
        return policy_parity(session, members, obs)

    curiosity = icm_path is not None
    if first.shared:
        single = len(members) == 1
        parity, transitions = _set_parity(first, measure, n, rng, seed, curiosity, single)
    else:
        parity, transitions = _flat_parity(first, measure, n, rng, seed, curiosity)
    if icm_path is not None:
        icm = onnx_session(icm_path)
        parity["icm"] = {k: curiosity_parity(icm, first, t) for k, t in transitions.items()}
    return parity
