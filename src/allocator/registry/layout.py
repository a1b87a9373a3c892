"""What a published version directory holds: the exporter writes it, the loader checks it.

``REGISTRY/NAME/VERSION/`` holds ``model.onnx`` (the policy graph), optionally ``icm.onnx``
(the curiosity graph, for monitoring) and ``manifest.json`` listing both with their sha256.
Every graph input and output is float32 ``[batch, width]`` with a dynamic batch axis.
"""

from __future__ import annotations

__all__ = [
    "ICM_FILE",
    "ICM_INPUTS",
    "ICM_OUTPUT",
    "ICM_OUTPUTS",
    "MODEL_FILE",
    "POLICY_INPUTS",
    "POLICY_OUTPUTS",
]

MODEL_FILE = "model.onnx"
ICM_FILE = "icm.onnx"

POLICY_INPUTS = ("observation", "mask")
"""Raw observation (``portfolio.build_raw_observation``; the graph normalizes) and slot mask."""
POLICY_OUTPUTS = ("action", "weights")
"""The actor's action and the portfolio weights it maps to (slot 0 is cash)."""
ICM_INPUTS = ("previous_observation", "action", "observation", "mask")
ICM_OUTPUT = "intrinsic_reward"
ICM_OUTPUTS = (ICM_OUTPUT,)
"""The curiosity signal, ``[batch, 1]``."""
