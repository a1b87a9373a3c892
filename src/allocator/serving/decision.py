"""The decision step: "what weights now?" for a batch of portfolios, as the policy was trained.

For every portfolio of a batch, in one onnxruntime call:

1. **Slots** (``serving.slots``). The request's assets map to slots (slot 0 is cash). An asset
   keeps its slot while it stays in the requests; a new asset takes the lowest free slot; the
   previous smoothed mass of a slot whose asset left (or changed) is dropped before smoothing.
   A flat policy has ``max_assets`` slots; a shared policy's rows grow past its training slots
   when a request carries more assets, and the batch is padded to its widest row.
2. **Policy.** The current weights are what the portfolio holds now (the environment's drifted
   holdings); when a request sends none, the previous smoothed weights stand in (all cash for a
   new portfolio).

   * Flat policy: ``portfolio.build_raw_observation`` from the price windows, the current
     weights and the mask; the exported graph normalizes it with the manifest's statistics and
     maps the action to weights (mask-and-renormalize) itself. The graph's float32 weights,
     renormalized in float64 over the live slots (entries move by < 1e-7), are the raw weights.
   * Shared policy: raw per-asset features from ``portfolio.asset_features`` (the graph
     normalizes them), the current weights and the mask give the action; the raw weights are
     ``portfolio.tilt_weights(action, anchor, mask, k)`` with the anchor from
     ``portfolio.anchor_weights`` on the same closes: the functions the environment trained
     with, in float64, so the server cannot map an action differently from training.
3. **Smoothing.** The executed weights are ``portfolio.ema_smooth(previous, raw, mask, beta)``
   with the manifest's ``beta``; ``turnover = sum over assets |smoothed - current|``, as in the
   environment.
4. **Curiosity.** The ICM was trained on replay transitions ``(obs, action, next_obs)``: the
   environment's flat observation before a step, the policy's action in [-1, 1] and the
   observation after the step, with one mask for both (training episodes keep their assets;
   the environment can change a universe mid-episode, but training does not ask it to).
   The exported ``icm.onnx`` takes the *raw* flat observations and normalizes them itself. So
   a decision's ICM reward is ``icm(previous raw observation, previous action, this raw
   observation, mask)``. It is ``None`` when the model has no ICM, for a portfolio's first
   decision, when the slot assignment changed since the previous decision (a transition
   across a universe change is one the ICM never saw, and its graph takes a single mask), and
   for a shared policy whenever the portfolio does not fit the training slots (the ICM's
   observation has exactly those).

A ``PortfolioState`` (``serving.portfolio_state``) carries what the next decision needs. Under
a flat policy a state made with another slot count restarts as if new; a state from another
name or version continues (the smoothing is about what the portfolio executes, which does not
change with a model upgrade), only its ICM inputs are skipped if the observation width differs.

Responses are in request order, cash first (``CASH_ID``).

The inputs are ``ValidRequest``s: validation (``serving.validation``) is the one place that checks
ids, shapes, prices and current weights, and this step trusts what it produced. Every caller (the
server, the replay, the jobs' evaluations) reaches it through ``serving.step``.
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
from allocator.serving.portfolio_state import ModelKey, PortfolioState, StateDecodeError
from allocator.serving.slots import SlotBatch, lay_out
from allocator.serving.validation import ValidRequest

__all__ = [
    "DecisionOutput",
    "Decisions",
    "ModelKey",
    "PortfolioState",
    "StateDecodeError",
    "decide",
    "decide_batch",
    "decide_many",
]

Float64Array = NDArray[np.float64]
Float32Array = NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class DecisionOutput:
    """One portfolio's answer, every vector in request order with cash first.

    ``current_weights`` is the base the decision used: the sent weights, or the implied ones.
    """

    asset_ids: tuple[str, ...]
    raw_weights: Float64Array
    smoothed_weights: Float64Array
    current_weights: Float64Array
    turnover: float
    icm_reward: float | None


@dataclass(frozen=True, slots=True)
class _PolicyOutput:
    """What the policy decided for a batch: float64 raw weights per slot, the action, and the
    flat raw observations the ICM reads (valid on the ``icm_ready`` rows)."""

    raw: Float64Array
    action: Float32Array
    observations: Float32Array
    icm_ready: NDArray[np.bool_]


def _flat_policy(model: LoadedModel, rows: SlotBatch) -> _PolicyOutput:
    """The flat graph maps the raw observation to its action and weights."""
    fs = model.manifest.feature_spec
    spec = FeatureSpec(max_assets=fs.max_assets, window=fs.window, clip=fs.clip)
    observations = build_raw_observation(rows.prices, rows.current, rows.mask, spec)
    action, weights = model.run(observations, rows.mask.astype(np.float32))
    raw = renormalize(weights.astype(np.float64), rows.mask)
    return _PolicyOutput(raw, action, observations, np.ones(len(raw), dtype=bool))


def _shared_policy(model: LoadedModel, policy: SetPolicy, rows: SlotBatch) -> _PolicyOutput:
    """Raw features -> the shared graph's action -> the tilt of the anchor, in numpy.

    The ICM's flat observation is the first ``max_assets`` slots of the raw features, weights
    and mask, usable for the rows laid out within those slots.
    """
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
    """The executed weights: EMA from the previous smoothed weights; a new portfolio's are
    its raw weights (``ema_smooth`` without a previous)."""
    has_previous = rows.has_previous
    if has_previous.all():
        return ema_smooth(rows.previous, raw, rows.mask, beta)
    smoothed = np.empty_like(raw)
    new_rows = ~has_previous
    smoothed[new_rows] = ema_smooth(None, raw[new_rows], rows.mask[new_rows], beta)
    if has_previous.any():
        smoothed[has_previous] = ema_smooth(
            rows.previous[has_previous], raw[has_previous], rows.mask[has_previous], beta
        )
    return smoothed


def _icm_rewards(
    model: LoadedModel, rows: SlotBatch, decided: _PolicyOutput, batch: int
) -> list[float | None]:
    """``icm(previous observation, previous action, this observation, mask)`` per row that
    has those inputs; ``None`` elsewhere and where the graph answers a non-finite value."""
    icm: list[float | None] = [None] * batch
    use = [j for j, i in enumerate(rows.icm_rows) if decided.icm_ready[i]]
    if not use:
        return icm
    at = [rows.icm_rows[j] for j in use]
    n_slots = model.n_slots
    rewards = model.intrinsic_reward(
        np.stack([rows.icm_observations[j] for j in use]),
        np.stack([rows.icm_actions[j] for j in use]),
        decided.observations[at],
        rows.mask[at, :n_slots].astype(np.float32),
    )
    for i, r in zip(at, rewards.tolist(), strict=True):
        icm[i] = r if math.isfinite(r) else None
    return icm


@dataclass(frozen=True, slots=True)
class Decisions:
    """A batch's answers per row (``outputs``, ``states``) and as whole arrays, for whoever
    encodes them in bulk: ``raw``, ``smoothed`` and ``current`` in request order, cash first,
    row i's first ``sizes[i]`` entries being its own (the rest repeat cash: padding);
    read-only, the outputs' vectors are row views of them."""

    outputs: list[DecisionOutput]
    states: list[PortfolioState]
    raw: Float64Array
    smoothed: Float64Array
    current: Float64Array
    sizes: list[int]


def decide_batch(
    model: LoadedModel,
    requests: Sequence[ValidRequest],
    states: Sequence[PortfolioState | None],
) -> list[tuple[DecisionOutput, PortfolioState]]:
    """Decide for every request with one model call; ``states[i]`` is request i's previous state.

    Returns each request's answer and its new state, in request order. Pure: nothing is stored;
    ``serving.step`` persists the new states under the portfolios' locks. The requests were
    checked against this model's shape by ``serving.validation``; nothing is checked again.
    """
    decided = decide_many(model, requests, states)
    return list(zip(decided.outputs, decided.states, strict=True))


def decide_many(
    model: LoadedModel,
    requests: Sequence[ValidRequest],
    states: Sequence[PortfolioState | None],
) -> Decisions:
    """``decide_batch``, with the batch's arrays kept whole (``Decisions``)."""
    batch = len(requests)
    if len(states) != batch:
        raise ValueError(f"{batch} requests but {len(states)} states")
    if batch == 0:
        empty = np.zeros((0, 1))
        return Decisions([], [], empty, empty, empty, [])
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
        n1 = sizes[i]
        previous = states[i]
        width = widths[i]
        outputs.append(
            DecisionOutput(
                (CASH_ID, *request.asset_ids),
                raw_req[i, :n1],
                smoothed_req[i, :n1],
                current_req[i, :n1],
                turnovers[i],
                icm[i],
            )
        )
        icm_inputs = with_icm[i]
        new_states.append(
            PortfolioState(
                ModelKey(name, version, width),
                rows.slot_assets[i],
                smoothed[i, :width],
                decided.observations[i] if icm_inputs else None,
                decided.action[i, :width] if icm_inputs else None,
                previous.steps + 1 if previous is not None and continued[i] else 1,
            )
        )
    return Decisions(outputs, new_states, raw_req, smoothed_req, current_req, sizes)


def decide(
    model: LoadedModel, request: ValidRequest, state: PortfolioState | None
) -> tuple[DecisionOutput, PortfolioState]:
    """``decide_batch`` for one portfolio."""
    return decide_batch(model, (request,), (state,))[0]
