"""The algorithms a config or a manifest names (``algorithm: td3``), by that name."""

from __future__ import annotations

from stable_baselines3.common.base_class import BaseAlgorithm

from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.td3 import SmoothTD3

ALGORITHMS: dict[str, type[BaseAlgorithm]] = {"td3": SmoothTD3, "sac": SmoothSAC}
"""Algorithm name (``TrainConfig.algorithm.name``, ``Manifest.algorithm``) -> its class."""
