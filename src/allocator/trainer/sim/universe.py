"""An episode's universe: live slots are a prefix; after a change the staying assets keep their
order, the joiners follow, and every per-slot vector moves by asset id (``slot_sources``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.intp]


def universe_order(current: Sequence[str], requested: Sequence[str]) -> tuple[str, ...]:
    """The slot order after a change: staying assets as they were, then the joiners as asked."""
    wanted, held = set(requested), set(current)
    return (*(a for a in current if a in wanted), *(a for a in requested if a not in held))


def slot_sources(current: Sequence[str], new: Sequence[str], n_slots: int) -> IntArray:
    """Each new slot's previous slot (cash: 0; joiners and empty slots: -1)."""
    before = {a: j + 1 for j, a in enumerate(current)}
    source = np.full(n_slots, -1, dtype=np.intp)
    source[0] = 0
    source[1 : len(new) + 1] = [before.get(a, -1) for a in new]
    return source


def carry(vector: NDArray[np.float64], source: IntArray) -> NDArray[np.float64]:
    """``vector`` in the new layout: joining and empty slots 0, leavers dropped."""
    out = np.zeros(source.size)
    kept = source >= 0
    out[kept] = vector[source[kept]]
    return out


def left_slots(current: Sequence[str], new: Sequence[str]) -> IntArray:
    """Slots (in the current layout) of the assets that leave."""
    staying = set(new)
    return np.array([j + 1 for j, a in enumerate(current) if a not in staying], dtype=np.intp)


def parse_schedule(changes: Any, length: int) -> dict[int, tuple[str, ...]]:
    """The ``universe_changes`` reset option ``{step: asset names}``, checked, in step order."""
    if not isinstance(changes, Mapping):
        raise ValueError(f"universe_changes must map a step to asset names, got {changes!r}")
    for step in changes:
        if not isinstance(step, (int, np.integer)) or not 1 <= step < length:
            raise ValueError(
                f"universe_changes step {step!r} is not a decision after the first "
                f"(1 .. {length - 1})"
            )
    out: dict[int, tuple[str, ...]] = {}
    for step in sorted(changes):
        names = changes[step]
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise ValueError(f"universe_changes[{step}] must be a list of asset names")
        if not names:
            raise ValueError(f"universe_changes[{step}] names no asset")
        out[int(step)] = tuple(names)
    return out


def segment_end(schedule: Mapping[int, Any], step: int, length: int) -> int:
    """The next scheduled change after ``step``, else the episode's end."""
    return min((s for s in schedule if s > step), default=length)
