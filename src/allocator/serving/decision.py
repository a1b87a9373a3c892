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
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from allocator.portfolio import FeatureSpec, build_raw_observation, ema_smooth, renormalize
from allocator.recording.records import CASH_ID
from allocator.serving.loader import LoadedModel

__all__ = [
    "WEIGHT_SUM_TOLERANCE",
    "DecisionError",
    "DecisionInput",
    "DecisionOutput",
    "ModelKey",
    "PortfolioState",
    "StateDecodeError",
    "decide",
    "decide_batch",
]

Float64Array = NDArray[np.float64]
Float32Array = NDArray[np.float32]

WEIGHT_SUM_TOLERANCE = 1e-6
"""How far sent current weights may sum from 1 (clients often hold float32 weights)."""


class DecisionError(ValueError):
    """A bad input in a batch; ``index`` is its position, ``field`` the request field named."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(f"input {index}: {field}: {message}")
        self.index = index
        self.field = field
        self.detail = message


class StateDecodeError(ValueError):
    """Bytes that are not a ``PortfolioState`` (corrupted, or from an unknown format)."""


class ModelKey(NamedTuple):
    """The model a state was made under; only ``n_slots`` decides whether it continues."""

    name: str
    version: str
    n_slots: int


@dataclass(frozen=True, slots=True)
class DecisionInput:
    """One portfolio's request.

    ``prices`` is ``(len(asset_ids), window + 1)`` closes, oldest first, in request order;
    ``current_weights`` (optional) is ``(len(asset_ids) + 1,)``, cash first, in request order.
    """

    asset_ids: tuple[str, ...]
    prices: Float64Array
    current_weights: Float64Array | None = None


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


def _check_ids(index: int, ids: Any, max_assets: int) -> tuple[str, ...]:
    if not isinstance(ids, tuple):
        ids = tuple(ids)
    if not ids:
        raise DecisionError(index, "asset_ids", "must name at least one asset")
    if len(ids) > max_assets:
        raise DecisionError(
            index, "asset_ids", f"{len(ids)} assets exceed the model's max_assets={max_assets}"
        )
    for asset in ids:
        if not isinstance(asset, str) or not asset or asset == CASH_ID:
            raise DecisionError(
                index, "asset_ids", f"invalid asset id {asset!r} (non-empty, not {CASH_ID!r})"
            )
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(a for a in ids if a in seen or seen.add(a))  # type: ignore[func-returns-value]
        raise DecisionError(index, "asset_ids", f"duplicate asset id {dup!r}")
    return ids


def _floats(index: int, field: str, values: Any) -> Float64Array:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise DecisionError(index, field, "must be an array of numbers") from None


def _feature_spec(model: LoadedModel) -> FeatureSpec:
    fs = model.manifest.feature_spec
    return FeatureSpec(max_assets=fs.max_assets, window=fs.window, clip=fs.clip)


def decide_batch(
    model: LoadedModel,
    inputs: Sequence[DecisionInput],
    states: Sequence[PortfolioState | None],
) -> list[tuple[DecisionOutput, PortfolioState]]:
    """Decide for every input with one model call; ``states[i]`` is input i's previous state.

    Returns each input's answer and its new state, in input order. Pure: nothing is stored;
    the caller persists the new states (``state.decide_with_store`` does, under locks). Bad
    input raises ``DecisionError`` naming the input and the field, and decides nothing.
    """
    batch = len(inputs)
    if len(states) != batch:
        raise ValueError(f"{batch} inputs but {len(states)} states")
    if batch == 0:
        return []
    spec = _feature_spec(model)
    m, w1, n_slots = spec.max_assets, spec.prices_per_asset, spec.n_slots
    key = ModelKey(model.name, model.version, n_slots)

    prices = np.ones((batch, m, w1))
    current = np.zeros((batch, n_slots))
    mask = np.zeros((batch, n_slots), dtype=bool)
    mask[:, 0] = True
    previous = np.zeros((batch, n_slots))
    has_previous = np.zeros(batch, dtype=bool)
    implied = np.zeros(batch, dtype=bool)  # current weights = previous smoothed (not sent)
    sent = np.zeros(batch, dtype=bool)
    gather = np.zeros((batch, m + 1), dtype=np.intp)
    sizes = np.empty(batch, dtype=np.intp)
    slot_assets: list[tuple[str, ...]] = []
    icm_rows: list[int] = []
    icm_observations: list[Float32Array] = []
    icm_actions: list[Float32Array] = []
    has_icm = model.icm_session is not None
    obs_dim = model.obs_dim
    arange = np.arange(n_slots)

    for i, (inp, st) in enumerate(zip(inputs, states, strict=True)):
        ids = _check_ids(i, inp.asset_ids, m)
        n = len(ids)
        p = _floats(i, "prices", inp.prices)
        if p.shape != (n, w1):
            raise DecisionError(
                i, "prices", f"shape {p.shape}, expected ({n}, window + 1 = {w1}) like asset_ids"
            )
        if st is not None and st.model.n_slots != n_slots:
            st = None  # made under a model with another max_assets: start again
        old = None if st is None else st.slots
        new, req = _assign_slots(ids, old, m)
        slot_assets.append(new)
        sizes[i] = n
        if req is None:
            slots: slice | list[int] = slice(1, n + 1)
            prices[i, :n] = p
            gather[i, 1 : n + 1] = arange[1 : n + 1]
        else:
            slots = req
            prices[i, np.subtract(req, 1)] = p
            gather[i, 1 : n + 1] = req
        mask[i, slots] = True
        if st is not None:
            has_previous[i] = True
            if new == old:
                previous[i] = st.smoothed
                if (
                    has_icm
                    and st.observation is not None
                    and st.action is not None
                    and st.observation.size == obs_dim
                ):
                    icm_rows.append(i)
                    icm_observations.append(st.observation)
                    icm_actions.append(st.action)
            else:  # slots changed: a departed (or replaced) asset's smoothed mass is dropped
                kept = np.array([True] + [a == b for a, b in zip(new, old, strict=True)])
                previous[i] = np.where(kept, st.smoothed, 0.0)
        cw = inp.current_weights
        if cw is not None:
            c = _floats(i, "current_weights", cw)
            if c.shape != (n + 1,):
                raise DecisionError(
                    i, "current_weights", f"shape {c.shape}, expected ({n + 1},): cash + assets"
                )
            current[i, 0] = c[0]
            current[i, slots] = c[1:]
            sent[i] = True
        elif st is not None:
            implied[i] = True
        else:
            current[i, 0] = 1.0

    _check_prices(prices, mask, slot_assets)
    _check_current(current, sent)
    if implied.any():
        current[implied] = renormalize(previous[implied], mask[implied])

    observations = build_raw_observation(prices, current, mask, spec)
    mask32 = mask.astype(np.float32)
    action, weights = model.run(observations, mask32)
    raw = renormalize(weights.astype(np.float64), mask)
    beta = model.manifest.beta
    if has_previous.all():
        smoothed = ema_smooth(previous, raw, mask, beta)
    else:
        smoothed = np.empty_like(raw)
        new_rows = ~has_previous
        smoothed[new_rows] = ema_smooth(None, raw[new_rows], mask[new_rows], beta)
        if has_previous.any():
            smoothed[has_previous] = ema_smooth(
                previous[has_previous], raw[has_previous], mask[has_previous], beta
            )
    turnover = np.abs(smoothed[:, 1:] - current[:, 1:]).sum(axis=1)

    icm: list[float | None] = [None] * batch
    if icm_rows:
        rewards = model.intrinsic_reward(
            np.stack(icm_observations),
            np.stack(icm_actions),
            observations[icm_rows],
            mask32[icm_rows],
        )
        for i, r in zip(icm_rows, rewards.tolist(), strict=True):
            icm[i] = r if math.isfinite(r) else None

    for a in (observations, action, smoothed):
        a.setflags(write=False)  # states keep row views of these
    # Request order, cash first: one gather for the three vectors of every row.
    raw_req, smoothed_req, current_req = np.stack((raw, smoothed, current))[
        :, np.arange(batch)[:, None], gather
    ]
    for a in (raw_req, smoothed_req, current_req):
        a.setflags(write=False)
    turnovers = turnover.tolist()

    out: list[tuple[DecisionOutput, PortfolioState]] = []
    for i, inp in enumerate(inputs):
        n1 = int(sizes[i]) + 1
        st = states[i]
        steps = st.steps + 1 if st is not None and st.model.n_slots == n_slots else 1
        out.append(
            (
                DecisionOutput(
                    asset_ids=(CASH_ID, *inp.asset_ids),
                    raw_weights=raw_req[i, :n1],
                    smoothed_weights=smoothed_req[i, :n1],
                    current_weights=current_req[i, :n1],
                    turnover=turnovers[i],
                    icm_reward=icm[i],
                ),
                PortfolioState(
                    model=key,
                    slots=slot_assets[i],
                    smoothed=smoothed[i],
                    observation=observations[i] if has_icm else None,
                    action=action[i] if has_icm else None,
                    steps=steps,
                ),
            )
        )
    return out


def decide(
    model: LoadedModel, inp: DecisionInput, state: PortfolioState | None
) -> tuple[DecisionOutput, PortfolioState]:
    """``decide_batch`` for one portfolio."""
    return decide_batch(model, (inp,), (state,))[0]


def _check_prices(
    prices: Float64Array, mask: NDArray[np.bool_], slot_assets: list[tuple[str, ...]]
) -> None:
    """Live price rows must be finite and positive; the error names the input and asset.

    Empty slots hold 1.0, so two reductions over the whole array settle the usual case (NaN
    fails both comparisons).
    """
    if prices.min() > 0.0 and prices.max() < np.inf:
        return
    ok = np.isfinite(prices) & (prices > 0.0)
    bad = ~ok & mask[:, 1:, None]
    if bad.any():
        i, k, _ = (int(x) for x in np.argwhere(bad)[0])
        raise DecisionError(
            i, "prices", f"prices of asset {slot_assets[i][k]!r} must be finite and positive"
        )


def _check_current(current: Float64Array, sent: NDArray[np.bool_]) -> None:
    """Sent current weights must be a distribution (finite, >= 0, summing to 1)."""
    if not sent.any():
        return
    rows = current if sent.all() else current[sent]
    if rows.min() >= 0.0 and np.all(np.abs(rows.sum(axis=1) - 1.0) <= WEIGHT_SUM_TOLERANCE):
        return  # the usual case; NaN and inf fail one of the two tests
    bad = ~np.all(np.isfinite(rows) & (rows >= 0.0), axis=1)
    bad |= ~(np.abs(rows.sum(axis=1) - 1.0) <= WEIGHT_SUM_TOLERANCE)
    if bad.any():
        i = int(np.flatnonzero(sent)[np.argmax(bad)])
        raise DecisionError(
            i,
            "current_weights",
            f"must be finite, non-negative and sum to 1 (within {WEIGHT_SUM_TOLERANCE:g})",
        )
