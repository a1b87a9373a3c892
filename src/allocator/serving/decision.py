"""The decision step's maths: "what weights now?" for a batch of portfolios, as trained.

One onnxruntime call per batch, through the environment's own functions, so the server cannot
map an action differently from training: a flat graph's weights are renormalized over the live
slots; a shared graph's action tilts ``portfolio.anchor_weights``. The current weights are the
request's, else the previous smoothed ones (all cash for a new portfolio); executed weights are
``ema_smooth``ed with the manifest's ``beta``. The ICM reward reads the previous observation and
action: ``None`` without an ICM, on a first decision, after the slots changed, and under a
shared policy when the portfolio does not fit the training slots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from allocator.portfolio import (
    CASH_ID,
    FeatureSpec,
    anchor_weights,
    assemble_observation,
    asset_features,
    build_raw_observation,
    ema_smooth,
    renormalize,
    tilt_weights,
)
from allocator.portfolio.costs import turnover
from allocator.serving.loader import LoadedModel, SetPolicy
from allocator.serving.portfolio_state import ModelKey, PortfolioState
from allocator.serving.slots import SlotBatch, lay_out
from allocator.serving.validation import ValidRequest

__all__ = ["DecisionOutput", "Decisions", "decide_many"]

Float64Array = NDArray[np.float64]
Float32Array = NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class DecisionOutput:
    """One portfolio's answer, in request order, cash first; ``current_weights`` is the base
    the decision used (sent or implied)."""

    asset_ids: tuple[str, ...]
    raw_weights: Float64Array
    smoothed_weights: Float64Array
    current_weights: Float64Array
    turnover: float
    icm_reward: float | None


@dataclass(frozen=True, slots=True)
class _PolicyOutput:
    """Raw weights per slot, the action, and the flat observations the ICM reads (on the
    ``icm_ready`` rows)."""

    raw: Float64Array
    action: Float32Array
    observations: Float32Array
    icm_ready: NDArray[np.bool_]


def _flat_policy(model: LoadedModel, rows: SlotBatch) -> _PolicyOutput:
    layout = model.manifest.feature_spec.layout  # a flat policy's features: its return window
    observations = build_raw_observation(rows.prices, rows.current, rows.mask, layout)
    action, weights = model.run(observations, rows.mask.astype(np.float32))
    raw = renormalize(weights.astype(np.float64), rows.mask)
    return _PolicyOutput(raw, action, observations, np.ones(len(raw), dtype=bool))


def _shared_policy(model: LoadedModel, policy: SetPolicy, rows: SlotBatch) -> _PolicyOutput:
    """The ICM's observation is the first ``max_assets`` slots, for rows that fit them."""
    features = asset_features(rows.prices, rows.mask, policy.features)
    action = model.run_sets(features, rows.current, rows.mask)
    anchor = anchor_weights(rows.prices, rows.mask, policy.anchor)
    raw = tilt_weights(action, anchor, rows.mask, policy.k)
    m = model.max_assets
    icm_ready = rows.widths == m + 1
    if model.icm_session is None or not icm_ready.any():
        return _PolicyOutput(raw, action, np.zeros((len(raw), 0), np.float32), icm_ready)
    layout = FeatureSpec(max_assets=m, window=policy.features.n_features, clip=1.0)
    observations = assemble_observation(
        features[:, :m], rows.current[:, : m + 1], rows.mask[:, : m + 1], layout
    )
    return _PolicyOutput(raw, action, observations, icm_ready)


def _smooth(rows: SlotBatch, raw: Float64Array, beta: float) -> Float64Array:
    """EMA from the previous smoothed weights; a new portfolio's are its raw weights."""
    smoothed = ema_smooth(rows.previous, raw, rows.mask, beta)
    if not rows.has_previous.all():
        new = ~rows.has_previous
        smoothed[new] = ema_smooth(None, raw[new], rows.mask[new], beta)
    return smoothed


def _icm_rewards(
    model: LoadedModel, rows: SlotBatch, decided: _PolicyOutput, batch: int
) -> list[float | None]:
    """Per row with the inputs; ``None`` elsewhere and for a non-finite value."""
    icm: list[float | None] = [None] * batch
    use = [j for j, i in enumerate(rows.icm_rows) if decided.icm_ready[i]]
    if not use:
        return icm
    at = [rows.icm_rows[j] for j in use]
    rewards = model.intrinsic_reward(
        np.stack([rows.icm_observations[j] for j in use]),
        np.stack([rows.icm_actions[j] for j in use]),
        decided.observations[at],
        rows.mask[at, : model.n_slots].astype(np.float32),
    )
    for i, r in zip(at, rewards.tolist(), strict=True):
        icm[i] = r if math.isfinite(r) else None
    return icm


@dataclass(frozen=True, slots=True)
class Decisions:
    """A batch's answers per row and as whole read-only arrays in request order, cash first;
    row i's first ``sizes[i]`` entries are its own (the rest is padding)."""

    outputs: list[DecisionOutput]
    states: list[PortfolioState]
    raw: Float64Array
    smoothed: Float64Array
    current: Float64Array
    sizes: list[int]


def decide_many(
    model: LoadedModel,
    requests: Sequence[ValidRequest],
    states: Sequence[PortfolioState | None],
) -> Decisions:
    """Each request's answer and new state with one model call (a non-empty batch, a state or
    None per request); pure, nothing is stored."""
    batch = len(requests)
    rows = lay_out(model, requests, states)
    policy = model.set_policy
    decided = _flat_policy(model, rows) if policy is None else _shared_policy(model, policy, rows)
    raw = decided.raw
    smoothed = _smooth(rows, raw, model.manifest.beta)
    traded = turnover(smoothed, rows.current)
    icm = _icm_rewards(model, rows, decided, batch)

    for a in (decided.observations, decided.action, smoothed):
        a.setflags(write=False)  # states keep row views of these
    # Request order, cash first: one gather for the three vectors of every row.
    raw_req, smoothed_req, current_req = np.stack((raw, smoothed, rows.current))[
        :, np.arange(batch)[:, None], rows.gather
    ]
    for a in (raw_req, smoothed_req, current_req):
        a.setflags(write=False)
    turnovers = traded.tolist()
    sizes = (rows.sizes + 1).tolist()
    continued = rows.has_previous.tolist()
    widths = rows.widths.tolist()
    with_icm = decided.icm_ready.tolist() if model.icm_session is not None else [False] * batch
    name, version = model.name, model.version

    outputs: list[DecisionOutput] = []
    new_states: list[PortfolioState] = []
    for i, request in enumerate(requests):
        n1, previous, width, icm_inputs = sizes[i], states[i], widths[i], with_icm[i]
        weights = raw_req[i, :n1], smoothed_req[i, :n1], current_req[i, :n1]
        ids = (CASH_ID, *request.asset_ids)
        outputs.append(DecisionOutput(ids, *weights, turnovers[i], icm[i]))
        observation = decided.observations[i] if icm_inputs else None
        action = decided.action[i, :width] if icm_inputs else None
        steps = previous.steps + 1 if previous is not None and continued[i] else 1
        key, slots = ModelKey(name, version, width), rows.slot_assets[i]
        state = PortfolioState(key, slots, smoothed[i, :width], observation, action, steps)
        new_states.append(state)
    return Decisions(outputs, new_states, raw_req, smoothed_req, current_req, sizes)
