"""A batch of requests laid out in slots: which asset sits where, ready for one model call.

An asset keeps its slot while it stays in a portfolio's requests; a new one takes the lowest
free slot; a departed asset's smoothed mass is dropped, never passed to its successor. A flat
policy has exactly ``max_assets`` slots; a shared policy at least its training slots and as
many more as a request needs, the batch padded with masked slots to its widest row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from allocator.portfolio import renormalize
from allocator.serving.loader import LoadedModel
from allocator.serving.portfolio_state import PortfolioState
from allocator.serving.validation import ValidRequest

__all__ = ["SlotBatch", "assign_slots", "lay_out"]

Float64Array = NDArray[np.float64]
Float32Array = NDArray[np.float32]


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
    """Row i for request i. ``prices`` holds 1.0 in empty slots (a positive filler the mask
    hides); ``implied`` rows use the previous smoothed weights as current ones; ``gather[i]``
    lists request i's slots, cash first; ``widths[i]`` is row i's own slot count."""

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
    n_requested = max(r.n_assets for r in requests)
    rows = SlotBatch(slot_assets, model.prices_per_asset, n_requested)
    for i, (request, state, req) in enumerate(zip(requests, kept, reqs, strict=True)):
        rows.place(i, request, req, implied=state is not None)
        if state is not None:
            rows.continue_from(i, state, model)
    if rows.implied.any():
        implied = rows.implied
        rows.current[implied] = renormalize(rows.previous[implied], rows.mask[implied])
    return rows
