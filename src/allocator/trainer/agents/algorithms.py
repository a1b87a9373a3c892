"""The algorithms a config or a manifest names (``algorithm: td3``), by that name."""

from __future__ import annotations

from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.td3 import SmoothTD3

Algorithm = SmoothTD3 | SmoothSAC
"""A trained model of either algorithm: both carry an ``actor`` and ``critic``."""

ALGORITHMS: dict[str, type[Algorithm]] = {"td3": SmoothTD3, "sac": SmoothSAC}
"""Algorithm name (``TrainConfig.algorithm.name``, ``Manifest.algorithm``) -> its class."""
