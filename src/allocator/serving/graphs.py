"""What an exported graph must look like before it may serve: names, types, shapes, a probe run.

The flat (``mlp``) graph maps ``[batch, width]`` tensors to ``[batch, width]`` tensors. The
shared graph takes a set of N assets, ``asset_features [batch, N, F]``, ``weights`` and ``mask``
``[batch, N + 1]``, and returns ``action [batch, N + 1]``. A graph whose asset axis was frozen
at export would serve one universe size only, so the declared shapes are checked and the graph
is probed at two sizes: a server refuses such a graph at load, not on a request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from allocator.registry.errors import ModelLoadError
from allocator.registry.layout import (
    ICM_INPUTS,
    ICM_OUTPUT,
    POLICY_INPUTS,
    POLICY_OUTPUTS,
    SHARED_POLICY_INPUTS,
    SHARED_POLICY_OUTPUTS,
)

__all__ = [
    "PROBE_SIZES",
    "Widths",
    "check_flat",
    "check_shared",
    "icm_signature",
    "model_signature",
]

FLOAT = "tensor(float)"
PROBE_SIZES = (1, 3)
"""Universe sizes a shared graph is probed with at load: a frozen asset axis fails one."""


Widths = tuple[dict[str, int], dict[str, int]]
"""Expected width of every named ``[batch, width]`` input, then output, of a flat graph."""


def model_signature(obs_dim: int, n_slots: int) -> Widths:
    inputs = dict(zip(POLICY_INPUTS, (obs_dim, n_slots), strict=True))
    return inputs, dict.fromkeys(POLICY_OUTPUTS, n_slots)


def icm_signature(obs_dim: int, n_slots: int) -> Widths:
    inputs = dict(zip(ICM_INPUTS, (obs_dim, n_slots, obs_dim, n_slots), strict=True))
    return inputs, {ICM_OUTPUT: 1}


def _args(
    path: Path, session: Any, want_in: set[str], want_out: set[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The graph's inputs and outputs by name, refused unless they are the expected ones."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    if set(inputs) != want_in:
        raise ModelLoadError(f"{path}: graph inputs {sorted(inputs)}, expected {sorted(want_in)}")
    missing = sorted(want_out - set(outputs))
    if missing:
        raise ModelLoadError(
            f"{path}: graph outputs {sorted(outputs)} lack {missing} (expected {sorted(want_out)})"
        )
    return inputs, outputs


def _check_arg(path: Path, kind: str, arg: Any, rank: int) -> list[Any]:
    """Float32, the right rank, a dynamic batch axis; returns the declared shape."""
    if arg.type != FLOAT:
        raise ModelLoadError(f"{path}: {kind} {arg.name!r} is {arg.type}, expected float32")
    shape = list(arg.shape)
    if len(shape) != rank:
        raise ModelLoadError(
            f"{path}: {kind} {arg.name!r} has shape {shape}, expected {rank} axes (batch first)"
        )
    if isinstance(shape[0], int):
        raise ModelLoadError(
            f"{path}: {kind} {arg.name!r} has a fixed batch {shape[0]}; export it with a "
            "dynamic batch axis"
        )
    return shape


def _probe(
    path: Path, session: Any, feeds: dict[str, Any], want: dict[str, tuple[int, int]]
) -> list[Any]:
    """Run the graph on ``feeds``: output shapes are real, not declared."""
    try:
        values = list(session.run(list(want), feeds))
    except Exception as exc:
        raise ModelLoadError(f"{path}: a probe batch failed to run: {exc}") from exc
    for (name, shape), value in zip(want.items(), values, strict=True):
        if tuple(np.shape(value)) != shape:
            raise ModelLoadError(
                f"{path}: output {name!r} has shape {tuple(np.shape(value))} for a batch of "
                f"{shape[0]}, expected {shape}"
            )
    return values


def check_flat(path: Path, session: Any, expected: Widths) -> None:
    """Names, float32, dynamic batch and widths against the feature spec, then a probe of two
    neutral rows."""
    want_in, want_out = expected
    inputs, outputs = _args(path, session, set(want_in), set(want_out))
    for kind, args, widths in (("input", inputs, want_in), ("output", outputs, want_out)):
        for name, width in widths.items():
            shape = _check_arg(path, kind, args[name], 2)
            # Inputs must state their width; outputs may leave it symbolic (probed below).
            if shape[1] != width and (kind == "input" or isinstance(shape[1], int)):
                raise ModelLoadError(
                    f"{path}: {kind} {name!r} has shape {shape}, the manifest's feature spec "
                    f"needs [batch, {width}]"
                )
    feeds = {
        name: (np.ones if name == "mask" else np.zeros)((2, width), np.float32)
        for name, width in want_in.items()
    }
    _probe(path, session, feeds, {name: (2, w) for name, w in want_out.items()})


def check_shared(path: Path, session: Any, n_features: int) -> None:
    """``F`` fixed at the manifest's feature count, the asset axis dynamic; then a probe at each
    of ``PROBE_SIZES`` assets, whose outputs must be finite."""
    inputs, outputs = _args(path, session, set(SHARED_POLICY_INPUTS), set(SHARED_POLICY_OUTPUTS))
    features_name, weights_name, mask_name = SHARED_POLICY_INPUTS
    for kind, name, arg in (
        *(("input", n, inputs[n]) for n in SHARED_POLICY_INPUTS),
        *(("output", n, outputs[n]) for n in SHARED_POLICY_OUTPUTS),
    ):
        rank = 3 if name == features_name else 2
        shape = _check_arg(path, kind, arg, rank)
        if rank == 3 and shape[2] != n_features:
            raise ModelLoadError(
                f"{path}: input {name!r} has shape {shape}, the manifest's feature set "
                f"needs [batch, assets, {n_features}]"
            )
        if isinstance(shape[1], int):
            raise ModelLoadError(
                f"{path}: {kind} {name!r} has a fixed {'asset' if rank == 3 else 'slot'} axis "
                f"{shape[1]}; a shared policy must be exported with a dynamic number of assets"
            )
    for n in PROBE_SIZES:
        feeds = {
            features_name: np.zeros((2, n, n_features), np.float32),
            weights_name: np.full((2, n + 1), 1.0 / (n + 1), np.float32),
            mask_name: np.ones((2, n + 1), np.float32),
        }
        want = {name: (2, n + 1) for name in SHARED_POLICY_OUTPUTS}
        for name, value in zip(want, _probe(path, session, feeds, want), strict=True):
            if not np.all(np.isfinite(value)):
                raise ModelLoadError(f"{path}: output {name!r} is not finite on a probe batch")
