"""What an episode has done so far, in preallocated arrays that rewards and penalties read: row
0 before the first decision, row ``k + 1`` after step ``k``, per-slot columns in the current
slot layout (a joining asset's past is weight 0 at a flat price)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


class EpisodeHistory:
    """NAV, executed weights, slot prices, net returns and the anchor's returns of one episode."""

    def __init__(self, n_slots: int, capacity: int) -> None:
        self.n_slots = n_slots
        self.capacity = capacity
        self.nav = np.zeros(capacity + 1)
        self.weights = np.zeros((capacity + 1, n_slots))  # executed (smoothed) target weights
        self.prices = np.ones((capacity + 1, n_slots))  # slot closes; cash and masked slots = 1
        self.returns = np.zeros(capacity)  # net one-step portfolio return
        self.benchmark = np.zeros(capacity)  # the anchor's one-step gross return (0 if unused)
        self.mask = np.zeros(n_slots, dtype=bool)
        self.steps = 0

    def start(
        self,
        nav: float,
        weights: NDArray[np.float64],
        prices: NDArray[np.float64],
        mask: NDArray[np.bool_],
    ) -> None:
        self.steps = 0
        self.nav[0] = nav
        self.weights[0] = weights
        self.prices[0] = prices
        self.mask[:] = mask

    def record(
        self,
        nav: float,
        weights: NDArray[np.float64],
        prices: NDArray[np.float64],
        benchmark: float = 0.0,
    ) -> None:
        k = self.steps
        if k >= self.capacity:
            raise IndexError(f"episode history is full ({self.capacity} steps)")
        self.nav[k + 1] = nav
        self.weights[k + 1] = weights
        self.prices[k + 1] = prices
        self.returns[k] = nav / self.nav[k] - 1.0
        self.benchmark[k] = benchmark
        self.steps = k + 1

    def remap(
        self, source: NDArray[np.intp], mask: NDArray[np.bool_], prices: NDArray[np.float64]
    ) -> None:
        """Every recorded row in a new layout: slot i takes old slot ``source[i]``'s columns,
        or (-1) weight 0 and the flat price ``prices[i]``."""
        rows = slice(0, self.steps + 1)
        kept = source >= 0
        weights = np.zeros((self.steps + 1, self.n_slots))
        weights[:, kept] = self.weights[rows][:, source[kept]]
        flat = np.broadcast_to(np.asarray(prices, dtype=np.float64), weights.shape)
        self.prices[rows] = np.where(kept, self.prices[rows][:, np.maximum(source, 0)], flat)
        self.weights[rows] = weights
        self.mask[:] = mask

    def window_start(self, window: int) -> int:
        return max(0, self.steps - window)
