"""The decision step's maths: "what weights now?" for a batch of portfolios, as trained.

One onnxruntime call per batch, through the environment's own functions, so the server cannot
map an action differently from training: a flat graph's weights are renormalized over the live
slots; a shared graph's action tilts ``portfolio.anchor_weights``. The current weights are the
request's, else the previous smoothed ones (all cash for a new portfolio); executed weights are
``ema_smooth``ed with the manifest's ``beta``. The ICM reward reads the previous observation and
action: ``None`` without an ICM, on a first decision, after the slots changed, and under a
shared policy when the portfolio does not fit the training slots.

Slots: an asset keeps its slot while it stays in a portfolio's requests; a new one takes the
lowest free slot; a departed asset's smoothed mass is dropped, never passed to its successor. A
flat policy has exactly ``max_assets`` slots; a shared policy at least its training slots and as
many more as a request needs, the batch padded with masked slots to its widest row.
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
from allocator.serving.validation import ValidRequest

__all__ = ["DecisionOutput", "Decisions", "SlotBatch", "assign_slots", "decide_many", "lay_out"]

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


def assign_slots(
    ids: tuple[str, ...], old: tuple[str, ...] | None, min_slots: int, grow: bool
) -> tuple[tuple[str, ...], list[int] | None]:
    """New slot occupants (``""`` = free) and each requested asset's slot (1-based; ``None``
    when simply 1..n). At least ``min_slots``; with ``grow`` as many more as needed, else
    exactly ``len(old)``."""
    n = len(ids)
    if old is None:
        return ids + ("",) * (max(min_slots, n) - n), None
    if old[:n] == ids and not any(old[n:]):  # the usual case: same assets, same order
        width = max(min_slots, n) if grow else len(old)
        return (old, None) if len(old) == width else (ids + ("",) * (width - n), None)
    position = {a: k for k, a in enumerate(old) if a}
    width = len(old)
    if grow:
        extent = max((position[a] + 1 for a in ids if a in position), default=0)
        width = max(min_slots, n, extent)
    new = [""] * width
    req = [0] * n
    pending: list[int] = []
    for j, asset in enumerate(ids):
        k = position.get(asset)
        if k is None:
            pending.append(j)
        else:
            new[k] = asset
            req[j] = k + 1
    free = (k for k in range(width) if not new[k])
    for j in pending:
        k = next(free)
        new[k] = ids[j]
        req[j] = k + 1
    return tuple(new), req


@dataclass(slots=True, init=False)
class SlotBatch:
    """Requests laid out in slots for one model call, row i for request i. ``prices`` holds 1.0
    in empty slots (a positive filler the mask hides); ``implied`` rows use the previous smoothed
    weights as current ones; ``gather[i]`` lists request i's slots, cash first; ``widths[i]`` is
    row i's own slot count."""

    prices: Float64Array
    current: Float64Array
    mask: NDArray[np.bool_]
    previous: Float64Array
    has_previous: NDArray[np.bool_]
    implied: NDArray[np.bool_]
    gather: NDArray[np.intp]
    sizes: NDArray[np.intp]
    widths: NDArray[np.intp]
    slot_assets: list[tuple[str, ...]]
    icm_rows: list[int]
    icm_observations: list[Float32Array]
    icm_actions: list[Float32Array]

    def __init__(
        self, slot_assets: list[tuple[str, ...]], prices_per_asset: int, n_requested: int
    ) -> None:
        batch = len(slot_assets)
        self.widths = np.array([len(s) + 1 for s in slot_assets], dtype=np.intp)
        n_slots = int(self.widths.max())
        self.prices = np.ones((batch, n_slots - 1, prices_per_asset))
        self.current = np.zeros((batch, n_slots))
        self.mask = np.zeros((batch, n_slots), dtype=bool)
        self.mask[:, 0] = True
        self.previous = np.zeros((batch, n_slots))
        self.has_previous = np.zeros(batch, dtype=bool)
        self.implied = np.zeros(batch, dtype=bool)
        self.gather = np.zeros((batch, n_requested + 1), dtype=np.intp)
        self.sizes = np.empty(batch, dtype=np.intp)
        self.slot_assets = slot_assets
        self.icm_rows, self.icm_observations, self.icm_actions = [], [], []

    def place(self, i: int, request: ValidRequest, req: list[int] | None, implied: bool) -> None:
        """``implied``: no weights were sent and a previous state stands in for them."""
        n = request.n_assets
        self.sizes[i] = n
        slots: slice | list[int]
        if req is None:
            slots = slice(1, n + 1)
            self.prices[i, :n] = request.prices
            self.gather[i, 1 : n + 1] = np.arange(1, n + 1)
        else:
            slots = req
            self.prices[i, np.subtract(req, 1)] = request.prices
            self.gather[i, 1 : n + 1] = req
        self.mask[i, slots] = True
        current = request.current_weights
        if current is not None:
            self.current[i, 0] = current[0]
            self.current[i, slots] = current[1:]
        elif implied:
            self.implied[i] = True
        else:
            self.current[i, 0] = 1.0  # a new portfolio holds cash

    def continue_from(self, i: int, state: PortfolioState, model: LoadedModel) -> None:
        """Row i carries on from ``state``; its ICM inputs only if the slots did not change."""
        self.has_previous[i] = True
        new = self.slot_assets[i]
        if new != state.slots:  # a departed (or replaced) asset's smoothed mass is dropped
            n = min(len(new), len(state.slots)) + 1
            kept = np.array([True] + [a == b for a, b in zip(new, state.slots, strict=False)])
            self.previous[i, :n] = np.where(kept[:n], state.smoothed[:n], 0.0)
            return
        self.previous[i, : len(new) + 1] = state.smoothed
        if (
            model.icm_session is not None
            and state.observation is not None
            and state.action is not None
            and state.observation.size == model.obs_dim
            and state.action.size == model.n_slots
        ):
            self.icm_rows.append(i)
            self.icm_observations.append(state.observation)
            self.icm_actions.append(state.action)


def lay_out(
    model: LoadedModel,
    requests: Sequence[ValidRequest],
    states: Sequence[PortfolioState | None],
) -> SlotBatch:
    """Under a flat policy a state of another slot count starts again; a shared policy continues
    any state, its assets matched by id."""
    shared = model.set_policy is not None
    kept: list[PortfolioState | None] = []
    slot_assets: list[tuple[str, ...]] = []
    reqs: list[list[int] | None] = []
    for request, state in zip(requests, states, strict=True):
        if state is not None and not shared and state.model.n_slots != model.n_slots:
            state = None  # made under a model with another max_assets: start again
        old = None if state is None else state.slots
        new, req = assign_slots(request.asset_ids, old, model.max_assets, shared)
        kept.append(state)
        slot_assets.append(new)
        reqs.append(req)
    rows = SlotBatch(slot_assets, model.prices_per_asset, max(r.n_assets for r in requests))
    for i, (request, state, req) in enumerate(zip(requests, kept, reqs, strict=True)):
        rows.place(i, request, req, implied=state is not None)
        if state is not None:
            rows.continue_from(i, state, model)
    if rows.implied.any():
        implied = rows.implied
        rows.current[implied] = renormalize(rows.previous[implied], rows.mask[implied])
    return rows


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
