"""The decision step: "what weights now?" for a batch of portfolios, as the policy was trained.

For every portfolio of a batch, in one onnxruntime call:

1. **Slots.** The request's assets map to the model's slots 1..max_assets (slot 0 is cash). An
   asset keeps its slot while it stays in the requests; a new asset takes the lowest free slot;
   an asset missing from a request frees its slot, and the previous smoothed mass of a slot
   whose asset left (or changed) is dropped before smoothing, so ``ema_smooth``'s
   mask-and-renormalize never hands a departed asset's weight to its successor.
2. **Observation.** ``portfolio.build_raw_observation`` from the price windows, the current
   weights and the mask. The exported graph normalizes it with the manifest's statistics and
   maps the action to weights (mask-and-renormalize) itself. The current weights are what the
   portfolio holds now (the environment's drifted holdings); when a request sends none, the
   previous smoothed weights stand in (all cash for a new portfolio).
3. **Weights.** The graph's float32 weights, renormalized in float64 over the live slots (so
   they sum to 1 at float64 precision; entries move by < 1e-7), are the raw weights; the
   executed (smoothed) weights are ``portfolio.ema_smooth(previous, raw, mask, beta)`` with the
   manifest's ``beta``; ``turnover = sum over assets |smoothed - current|``, as in the
   environment.
4. **Curiosity.** The ICM was trained on replay transitions ``(obs, action, next_obs)``: the
   environment's observation before a step, the policy's action in [-1, 1] (the ``action``
   output, *not* the weights) and the observation after the step, with one mask for both (an
   episode never changes its assets). The exported ``icm.onnx`` takes the *raw* observations
   and normalizes them itself. So a decision's ICM reward is
   ``icm(previous raw observation, previous action, this raw observation, mask)``. It is
   ``None`` when the model has no ICM, for a portfolio's first decision, and when the slot
   assignment changed since the previous decision (a transition across a universe change is
   one the ICM never saw, and its graph takes a single mask).

A ``PortfolioState`` carries what the next decision needs. It belongs to a model shape: a state
made under a model with another ``max_assets`` (another slot count) restarts as if new; a state
from another name or version with the same slot count continues (the smoothing is about what
the portfolio executes, which does not change with a model upgrade), only its ICM inputs are
skipped if the observation width differs.

Responses are in request order, cash first (``CASH_ID``).

The inputs are ``ValidRequest``s: validation (``serving.validation``) is the one place that checks
ids, shapes, prices and current weights, and this step trusts what it produced. Every caller (the
server, the replay, the jobs' evaluations) reaches it through ``serving.step``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from allocator.portfolio import (
    CASH_ID,
    FeatureSpec,
    build_raw_observation,
    ema_smooth,
    renormalize,
)
from allocator.serving.loader import LoadedModel
from allocator.serving.validation import ValidRequest

__all__ = [
    "DecisionOutput",
    "ModelKey",
    "PortfolioState",
    "StateDecodeError",
    "decide",
    "decide_batch",
]

Float64Array = NDArray[np.float64]
Float32Array = NDArray[np.float32]


class StateDecodeError(ValueError):
    """Bytes that are not a ``PortfolioState`` (corrupted, or from an unknown format)."""


class ModelKey(NamedTuple):
    """The model a state was made under; only ``n_slots`` decides whether it continues."""

    name: str
    version: str
    n_slots: int


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


# Layout of ``PortfolioState.to_bytes``: a fixed 24-byte header (magic, format, flags, slot count,
# string count, observation width, steps), then the arrays (8-aligned first, so ``frombuffer``
# views are aligned), then the strings' lengths in characters and the strings (name, version,
# slot assets) as one UTF-8 text, decoded in one call.
_MAGIC = b"AS"
_FORMAT = 1
_HEADER = struct.Struct("<2sBBHHIQ4x")
_HAS_OBSERVATION = 1
_HAS_ACTION = 2


@dataclass(frozen=True, eq=False, slots=True)
class PortfolioState:
    """What a portfolio's next decision needs; immutable (its arrays are read-only).

    ``slots[k]`` is the asset in slot ``k + 1`` (``""`` when free); ``smoothed`` the executed
    weights per slot (``n_slots``); ``observation`` and ``action`` the previous decision's raw
    observation and policy action (the ICM's inputs; ``None`` before the first decision and
    under a model without ICM, which keeps such states ~10x smaller); ``steps`` the decisions
    made since the state started.
    """

    model: ModelKey
    slots: tuple[str, ...]
    smoothed: Float64Array
    observation: Float32Array | None
    action: Float32Array | None
    steps: int

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PortfolioState):
            return NotImplemented
        return (
            self.model == other.model
            and self.slots == other.slots
            and self.steps == other.steps
            and np.array_equal(self.smoothed, other.smoothed)
            and _same_optional(self.observation, other.observation)
            and _same_optional(self.action, other.action)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking arrays: never a dict key

    def to_bytes(self) -> bytes:
        """Compact binary form for Redis: a struct header, raw array bytes, then the ids.

        On the request path, so no JSON or base64: about 3 kB for 20 assets and a window of 30.
        """
        strings = (self.model.name, self.model.version, *self.slots)
        flags = (_HAS_OBSERVATION if self.observation is not None else 0) | (
            _HAS_ACTION if self.action is not None else 0
        )
        obs_len = 0 if self.observation is None else int(self.observation.size)
        parts = [
            _HEADER.pack(
                _MAGIC, _FORMAT, flags, self.model.n_slots, len(strings), obs_len, self.steps
            ),
            np.ascontiguousarray(self.smoothed, dtype="<f8").tobytes(),
        ]
        if self.observation is not None:
            parts.append(np.ascontiguousarray(self.observation, dtype="<f4").tobytes())
        if self.action is not None:
            parts.append(np.ascontiguousarray(self.action, dtype="<f4").tobytes())
        parts.append(struct.pack(f"<{len(strings)}I", *map(len, strings)))  # in characters
        parts.append("".join(strings).encode())
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> PortfolioState:
        """Inverse of ``to_bytes``; anything malformed raises ``StateDecodeError``."""
        try:
            return cls._decode(memoryview(data))
        except StateDecodeError:
            raise
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise StateDecodeError(f"malformed portfolio state: {exc}") from None

    @classmethod
    def _decode(cls, view: memoryview) -> PortfolioState:
        if len(view) < _HEADER.size:
            raise StateDecodeError(f"portfolio state of {len(view)} bytes is too short")
        magic, fmt, flags, n_slots, n_strings, obs_len, steps = _HEADER.unpack_from(view)
        if magic != _MAGIC or fmt != _FORMAT:
            raise StateDecodeError(f"not a portfolio state (magic {magic!r}, format {fmt})")
        if n_slots < 2 or n_strings != n_slots + 1:
            raise StateDecodeError(f"inconsistent slot count {n_slots} / {n_strings} strings")
        at = _HEADER.size
        smoothed = np.frombuffer(view, "<f8", n_slots, at)
        at += 8 * n_slots
        observation = None
        if flags & _HAS_OBSERVATION:
            observation = np.frombuffer(view, "<f4", obs_len, at)
            at += 4 * obs_len
        action = None
        if flags & _HAS_ACTION:
            action = np.frombuffer(view, "<f4", n_slots, at)
            at += 4 * n_slots
        lengths = struct.unpack_from(f"<{n_strings}I", view, at)
        text = str(view[at + 4 * n_strings :], "utf-8")  # one decode, then slices
        if sum(lengths) != len(text):
            raise StateDecodeError("portfolio state length does not match its header")
        strings = []
        at = 0
        for n in lengths:
            strings.append(text[at : at + n])
            at += n
        return cls(
            model=ModelKey(strings[0], strings[1], n_slots),
            slots=tuple(strings[2:]),
            smoothed=smoothed,
            observation=observation,
            action=action,
            steps=steps,
        )


def _same_optional(a: NDArray[Any] | None, b: NDArray[Any] | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(a, b))


def _assign_slots(
    ids: tuple[str, ...], old: tuple[str, ...] | None, max_assets: int
) -> tuple[tuple[str, ...], list[int] | None]:
    """New slot occupants (``""`` = free) and each requested asset's slot (1-based).

    The slots are ``None`` when they are simply 1..n in request order (the common case).
    """
    n = len(ids)
    if old is None:
        return ids + ("",) * (max_assets - n), None
    if old[:n] == ids and not any(old[n:]):  # the usual case: same assets, same order
        return old, None
    position = {a: k for k, a in enumerate(old) if a}
    new = [""] * max_assets
    req = [0] * n
    pending: list[int] = []
    for j, asset in enumerate(ids):
        k = position.get(asset)
        if k is None:
            pending.append(j)
        else:
            new[k] = asset
            req[j] = k + 1
    if pending:
        free = (k for k in range(max_assets) if not new[k])
        for j in pending:
            k = next(free)
            new[k] = ids[j]
            req[j] = k + 1
    return tuple(new), req


def _feature_spec(model: LoadedModel) -> FeatureSpec:
    fs = model.manifest.feature_spec
    return FeatureSpec(max_assets=fs.max_assets, window=fs.window, clip=fs.clip)


@dataclass(slots=True)
class _SlotBatch:
    """A batch laid out in the model's slots, row i for request i, ready for one model call.

    ``prices`` holds 1.0 in empty slots (a finite, positive filler the mask hides);
    ``previous`` is the smoothing base, with the mass of departed assets dropped;
    ``implied`` marks rows whose current weights are the previous smoothed ones (none were
    sent); ``gather[i]`` lists request i's slots, cash first, to answer in request order;
    ``icm_rows`` are the rows whose previous observation and action feed the ICM.
    """

    prices: Float64Array
    current: Float64Array
    mask: NDArray[np.bool_]
    previous: Float64Array
    has_previous: NDArray[np.bool_]
    implied: NDArray[np.bool_]
    gather: NDArray[np.intp]
    sizes: NDArray[np.intp]
    slot_assets: list[tuple[str, ...]]
    icm_rows: list[int]
    icm_observations: list[Float32Array]
    icm_actions: list[Float32Array]

    @classmethod
    def empty(cls, batch: int, spec: FeatureSpec) -> _SlotBatch:
        mask = np.zeros((batch, spec.n_slots), dtype=bool)
        mask[:, 0] = True
        return cls(
            prices=np.ones((batch, spec.max_assets, spec.prices_per_asset)),
            current=np.zeros((batch, spec.n_slots)),
            mask=mask,
            previous=np.zeros((batch, spec.n_slots)),
            has_previous=np.zeros(batch, dtype=bool),
            implied=np.zeros(batch, dtype=bool),
            gather=np.zeros((batch, spec.max_assets + 1), dtype=np.intp),
            sizes=np.empty(batch, dtype=np.intp),
            slot_assets=[],
            icm_rows=[],
            icm_observations=[],
            icm_actions=[],
        )

    def place(self, i: int, request: ValidRequest, state: PortfolioState | None) -> None:
        """Row i: the request's assets in their slots, its prices, current weights and mask."""
        ids = request.asset_ids
        n = len(ids)
        old = None if state is None else state.slots
        new, req = _assign_slots(ids, old, self.prices.shape[1])
        self.slot_assets.append(new)
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
        elif state is not None:
            self.implied[i] = True
        else:
            self.current[i, 0] = 1.0  # a new portfolio holds cash

    def continue_from(
        self, i: int, state: PortfolioState, model: LoadedModel, same_slots: bool
    ) -> None:
        """Row i carries on from ``state``: its smoothed weights, and its ICM inputs when the
        slots did not change (a transition across a universe change is none the ICM saw)."""
        self.has_previous[i] = True
        if not same_slots:  # a departed (or replaced) asset's smoothed mass is dropped
            new = self.slot_assets[i]
            kept = np.array([True] + [a == b for a, b in zip(new, state.slots, strict=True)])
            self.previous[i] = np.where(kept, state.smoothed, 0.0)
            return
        self.previous[i] = state.smoothed
        if (
            model.icm_session is not None
            and state.observation is not None
            and state.action is not None
            and state.observation.size == model.obs_dim
        ):
            self.icm_rows.append(i)
            self.icm_observations.append(state.observation)
            self.icm_actions.append(state.action)


def _lay_out(
    model: LoadedModel,
    spec: FeatureSpec,
    requests: Sequence[ValidRequest],
    states: Sequence[PortfolioState | None],
) -> _SlotBatch:
    """Every request in its slots; a state made under another slot count starts again."""
    rows = _SlotBatch.empty(len(requests), spec)
    for i, (request, state) in enumerate(zip(requests, states, strict=True)):
        if state is not None and state.model.n_slots != spec.n_slots:
            state = None  # made under a model with another max_assets: start again
        rows.place(i, request, state)
        if state is not None:
            rows.continue_from(i, state, model, rows.slot_assets[i] == state.slots)
    if rows.implied.any():
        implied = rows.implied
        rows.current[implied] = renormalize(rows.previous[implied], rows.mask[implied])
    return rows


def _smooth(rows: _SlotBatch, raw: Float64Array, beta: float) -> Float64Array:
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
    model: LoadedModel,
    rows: _SlotBatch,
    observations: Float32Array,
    mask32: Float32Array,
    batch: int,
) -> list[float | None]:
    """``icm(previous observation, previous action, this observation, mask)`` per row that
    has those inputs; ``None`` elsewhere and where the graph answers a non-finite value."""
    icm: list[float | None] = [None] * batch
    if not rows.icm_rows:
        return icm
    rewards = model.intrinsic_reward(
        np.stack(rows.icm_observations),
        np.stack(rows.icm_actions),
        observations[rows.icm_rows],
        mask32[rows.icm_rows],
    )
    for i, r in zip(rows.icm_rows, rewards.tolist(), strict=True):
        icm[i] = r if math.isfinite(r) else None
    return icm


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
    batch = len(requests)
    if len(states) != batch:
        raise ValueError(f"{batch} requests but {len(states)} states")
    if batch == 0:
        return []
    spec = _feature_spec(model)
    rows = _lay_out(model, spec, requests, states)
    observations = build_raw_observation(rows.prices, rows.current, rows.mask, spec)
    mask32 = rows.mask.astype(np.float32)
    action, weights = model.run(observations, mask32)
    raw = renormalize(weights.astype(np.float64), rows.mask)
    smoothed = _smooth(rows, raw, model.manifest.beta)
    turnover = np.abs(smoothed[:, 1:] - rows.current[:, 1:]).sum(axis=1)
    icm = _icm_rewards(model, rows, observations, mask32, batch)

    for a in (observations, action, smoothed):
        a.setflags(write=False)  # states keep row views of these
    # Request order, cash first: one gather for the three vectors of every row.
    raw_req, smoothed_req, current_req = np.stack((raw, smoothed, rows.current))[
        :, np.arange(batch)[:, None], rows.gather
    ]
    for a in (raw_req, smoothed_req, current_req):
        a.setflags(write=False)
    turnovers = turnover.tolist()
    key = ModelKey(model.name, model.version, spec.n_slots)
    has_icm = model.icm_session is not None

    out: list[tuple[DecisionOutput, PortfolioState]] = []
    for i, request in enumerate(requests):
        n1 = int(rows.sizes[i]) + 1
        previous = states[i]
        steps = previous.steps + 1 if previous is not None and rows.has_previous[i] else 1
        answer = DecisionOutput(
            asset_ids=(CASH_ID, *request.asset_ids),
            raw_weights=raw_req[i, :n1],
            smoothed_weights=smoothed_req[i, :n1],
            current_weights=current_req[i, :n1],
            turnover=turnovers[i],
            icm_reward=icm[i],
        )
        state = PortfolioState(
            model=key,
            slots=rows.slot_assets[i],
            smoothed=smoothed[i],
            observation=observations[i] if has_icm else None,
            action=action[i] if has_icm else None,
            steps=steps,
        )
        out.append((answer, state))
    return out


def decide(
    model: LoadedModel, request: ValidRequest, state: PortfolioState | None
) -> tuple[DecisionOutput, PortfolioState]:
    """``decide_batch`` for one portfolio."""
    return decide_batch(model, (request,), (state,))[0]
