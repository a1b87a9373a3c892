"""Parity of an ensemble's graph with the torch mean of its members' actions.

The reference is computed member by member exactly as a single export's is (each member's SB3
actor on the input normalized in numpy with that member's own statistics), then averaged. The
observations are a single export's: random ones and real ones (windows of the training data and
a rollout of the first member in the training environment; every member trained on the same
data), and, for a shared ensemble, at half, once and twice the training slots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from allocator.portfolio import (
    action_to_weights,
    live_mask,
    normalize_features,
    normalize_observation,
)
from allocator.registry.layout import POLICY_OUTPUTS, SHARED_POLICY_OUTPUTS
from allocator.trainer.export.loaded_run import Float32Array, LoadedRun
from allocator.trainer.export.parity import (
    PARITY_SAMPLES,
    max_abs,
    onnx_session,
    random_raw_observations,
    real_transitions,
)
from allocator.trainer.export.shared_parity import (
    SetObservations,
    set_parity_sweep,
    shared_rollout,
)

__all__ = [
    "ensemble_parity",
    "ensemble_set_parity",
    "measure_ensemble_parity",
]


def _spread(actions: list[Float32Array], mean: Float32Array) -> float:
    """How far the members disagree: the largest |member action - mean action|."""
    return max(max_abs(a, mean) for a in actions)


def _member_flat_actions(
    members: list[LoadedRun], observations: Float32Array
) -> list[Float32Array]:
    return [
        m.reference_actor()(normalize_observation(observations, m.spec, m.stats)) for m in members
    ]


def ensemble_parity(
    session: Any, members: list[LoadedRun], observations: Float32Array, masks: Float32Array
) -> dict[str, float | int]:
    """ONNX ensemble vs the torch mean action, and the graph's weights vs numpy
    ``action_to_weights`` of the graph's own action (as ``parity.policy_parity`` splits them).

    ``member_spread`` (reported, not checked) says how much the members disagree.
    """
    action, weights = session.run(
        list(POLICY_OUTPUTS), {"observation": observations, "mask": masks}
    )
    actions = _member_flat_actions(members, observations)
    reference = np.mean(np.stack(actions), axis=0)
    return {
        "n": len(observations),
        "max_abs_action_diff": max_abs(action, reference),
        "max_abs_weight_diff": max_abs(weights, action_to_weights(action, masks)),
        "end_to_end_weight_diff": max_abs(weights, action_to_weights(reference, masks)),
        "member_spread": _spread(actions, reference),
    }


def _member_set_actions(members: list[LoadedRun], obs: SetObservations) -> list[Float32Array]:
    live = live_mask(obs.masks)
    live_f = live.astype(np.float32)
    out = []
    for m in members:
        assert m.feature_norm is not None
        z = normalize_features(obs.features, m.feature_norm, m.asset_spec.clip, live)
        out.append(m.reference_sets()(z, obs.weights, live_f))
    return out


def ensemble_set_parity(
    session: Any, members: list[LoadedRun], obs: SetObservations
) -> dict[str, Any]:
    """ONNX shared ensemble vs the torch mean action; ``max_abs_masked_action`` must be 0."""
    (action,) = session.run(list(SHARED_POLICY_OUTPUTS), obs.feeds())
    actions = _member_set_actions(members, obs)
    reference = np.mean(np.stack(actions), axis=0)
    live = live_mask(obs.masks)
    return {
        "n": len(action),
        "assets": int(obs.features.shape[1]),
        "max_abs_action_diff": max_abs(action, reference),
        "max_abs_masked_action": float(np.max(np.abs(np.where(live, 0.0, action)))),
        "member_spread": _spread(actions, reference),
    }


def _measure_flat(
    members: list[LoadedRun], session: Any, n: int, rng: np.random.Generator, seed: int
) -> dict[str, Any]:
    first = members[0]
    random_obs, random_masks = random_raw_observations(first.spec, n, rng)
    real = real_transitions(first, n, seed=seed)
    return {
        "random": ensemble_parity(session, members, random_obs, random_masks),
        "real": {
            **ensemble_parity(session, members, real.observations, real.masks),
            "max_abs_observation_diff": real.max_abs_observation_diff,
        },
    }


def _measure_shared(
    members: list[LoadedRun], session: Any, n: int, rng: np.random.Generator, seed: int
) -> dict[str, Any]:
    first = members[0]
    rollout = shared_rollout(first, n, seed=seed)
    return set_parity_sweep(
        first, n, rng, rollout, lambda obs: ensemble_set_parity(session, members, obs)
    )


def measure_ensemble_parity(
    members: list[LoadedRun], model_path: Path, n: int = PARITY_SAMPLES, seed: int = 0
) -> dict[str, Any]:
    """Parity of an ensemble's ``model.onnx`` with the torch mean of its members' actions on
    ``n`` random and ``n`` real observations (a shared ensemble: at every ``parity_sizes``
    size, and on a rollout)."""
    rng = np.random.default_rng(seed)
    session = onnx_session(model_path)
    measure = _measure_shared if members[0].shared else _measure_flat
    return measure(members, session, n, rng, seed)
