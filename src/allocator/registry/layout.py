"""What a published version directory holds: the exporter writes it, the loader checks it. Every
graph input and output is float32 with a dynamic batch axis; a shared policy's graph also has a
dynamic asset axis N and returns only the action (the server computes the anchor and the tilt
from the request's prices, outside the graph)."""

from __future__ import annotations

MODEL_FILE = "model.onnx"
ICM_FILE = "icm.onnx"

POLICY_INPUTS = ("observation", "mask")
"""Flat MLP: raw observation (``portfolio.build_raw_observation``, normalized inside) and mask."""
POLICY_OUTPUTS = ("action", "weights")
"""Flat MLP: the actor's action and the portfolio weights it maps to (slot 0 is cash)."""
SHARED_POLICY_INPUTS = ("asset_features", "weights", "mask")
"""Shared policy: raw per-asset features ``[batch, N, F]`` (``portfolio.asset_features``; the
graph normalizes with the manifest's ``feature_normalization``), current weights and mask
``[batch, N + 1]`` (cash first)."""
SHARED_POLICY_OUTPUTS = ("action",)
"""Shared policy: the action ``[batch, N + 1]`` in [-1, 1], 0 on masked slots; the server maps it
to weights (``portfolio.tilt_weights`` around ``portfolio.anchor_weights``)."""
ICM_INPUTS = ("previous_observation", "action", "observation", "mask")
"""Both kinds: raw flat observations of the ``max_assets`` training slots (for a shared policy
the asset block holds the raw ``asset_features`` rows, ``F`` values per slot), the action and
the mask ``[batch, max_assets + 1]``."""
ICM_OUTPUT = "intrinsic_reward"
ICM_OUTPUTS = (ICM_OUTPUT,)
"""The curiosity signal, ``[batch, 1]``."""
