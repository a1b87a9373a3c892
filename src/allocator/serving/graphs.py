"""What an exported graph must look like before it may serve: names, types, shapes, a probe run.

Two kinds of policy graph exist. The flat (``mlp``) graph takes one fixed-width observation and
returns the action and the weights, every tensor ``[batch, width]``. The shared graph takes a
set of assets of any size N: ``asset_features [batch, N, F]``, ``weights`` and ``mask``
``[batch, N + 1]``, and returns the ``action [batch, N + 1]``. A graph whose asset axis was
frozen at export would serve only one universe size, so both the declared shapes and a probe
run at two sizes are checked: a server must refuse such a graph at load, not on a request.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    "Signature",
    "check_shared_signature",
    "check_signature",
    "icm_signature",
    "model_signature",
    "probe",
    "probe_shared",
]

FLOAT = "tensor(float)"
PROBE_SIZES = (1, 3)
"""Universe sizes a shared graph is probed with at load: a frozen asset axis fails one."""


@dataclass(frozen=True)
class Signature:
    """Expected width of every named ``[batch, width]`` input and output of a flat graph."""

    inputs: dict[str, int]
    outputs: dict[str, int]


def model_signature(obs_dim: int, n_slots: int) -> Signature:
    """The flat policy graph: raw observation and mask in, action and weights out."""
    return Signature(
        inputs=dict(zip(POLICY_INPUTS, (obs_dim, n_slots), strict=True)),
        outputs=dict(zip(POLICY_OUTPUTS, (n_slots, n_slots), strict=True)),
    )


def icm_signature(obs_dim: int, n_slots: int) -> Signature:
    """The curiosity graph: two flat observations, the action between them, the mask."""
    return Signature(
        inputs=dict(zip(ICM_INPUTS, (obs_dim, n_slots, obs_dim, n_slots), strict=True)),
        outputs={ICM_OUTPUT: 1},
    )


def _check_names(
    path: Path, inputs: set[str], outputs: set[str], want_in: set[str], want_out: set[str]
) -> None:
    if inputs != want_in:
        raise ModelLoadError(f"{path}: graph inputs {sorted(inputs)}, expected {sorted(want_in)}")
    missing = sorted(want_out - outputs)
    if missing:
        raise ModelLoadError(
            f"{path}: graph outputs {sorted(outputs)} lack {missing} (expected {sorted(want_out)})"
        )


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


def check_signature(path: Path, session: Any, expected: Signature) -> None:
    """Names, float32 type, dynamic batch and widths of a flat graph against the feature spec."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    _check_names(path, set(inputs), set(outputs), set(expected.inputs), set(expected.outputs))
    for kind, args, widths in (
        ("input", inputs, expected.inputs),
        ("output", outputs, expected.outputs),
    ):
        for name, width in widths.items():
            shape = _check_arg(path, kind, args[name], 2)
            # Inputs must state their width; outputs may leave it symbolic (probed below).
            if shape[1] != width and (kind == "input" or isinstance(shape[1], int)):
                raise ModelLoadError(
                    f"{path}: {kind} {name!r} has shape {shape}, the manifest's feature spec "
                    f"needs [batch, {width}]"
                )


def check_shared_signature(path: Path, session: Any, n_features: int) -> None:
    """A shared graph: ``F`` fixed at the manifest's feature count, the asset axis dynamic."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    _check_names(
        path, set(inputs), set(outputs), set(SHARED_POLICY_INPUTS), set(SHARED_POLICY_OUTPUTS)
    )
    features_name = SHARED_POLICY_INPUTS[0]
    shape = _check_arg(path, "input", inputs[features_name], 3)
    if shape[2] != n_features:
        raise ModelLoadError(
            f"{path}: input {features_name!r} has shape {shape}, the manifest's feature set "
            f"needs [batch, assets, {n_features}]"
        )
    if isinstance(shape[1], int):
        raise ModelLoadError(
            f"{path}: input {features_name!r} has a fixed asset axis {shape[1]}; a shared "
            "policy must be exported with a dynamic number of assets"
        )
    for kind, name, arg in (
        *(("input", n, inputs[n]) for n in SHARED_POLICY_INPUTS[1:]),
        *(("output", n, outputs[n]) for n in SHARED_POLICY_OUTPUTS),
    ):
        slot_axis = _check_arg(path, kind, arg, 2)[1]
        if isinstance(slot_axis, int):
            raise ModelLoadError(
                f"{path}: {kind} {name!r} has a fixed slot axis {slot_axis}; a shared policy "
                "must be exported with a dynamic number of assets"
            )


def _run(path: Path, session: Any, names: list[str], feeds: dict[str, Any]) -> list[Any]:
    try:
        return list(session.run(names, feeds))
    except Exception as exc:
        raise ModelLoadError(f"{path}: a probe batch failed to run: {exc}") from exc


def _check_probe_shape(path: Path, name: str, value: Any, want: tuple[int, ...]) -> None:
    if tuple(np.shape(value)) != want:
        raise ModelLoadError(
            f"{path}: output {name!r} has shape {tuple(np.shape(value))} for a batch of "
            f"{want[0]}, expected {want}"
        )


def probe(path: Path, session: Any, expected: Signature) -> None:
    """Run a flat graph on a batch of two neutral rows: output shapes are real, not declared."""
    feeds = {}
    for name, width in expected.inputs.items():
        feeds[name] = (
            np.ones((2, width), np.float32) if name == "mask" else np.zeros((2, width), np.float32)
        )
    names = list(expected.outputs)
    for name, value in zip(names, _run(path, session, names, feeds), strict=True):
        _check_probe_shape(path, name, value, (2, expected.outputs[name]))


def probe_shared(path: Path, session: Any, n_features: int) -> None:
    """Run a shared graph on two rows at each of ``PROBE_SIZES`` assets: finite, right shape."""
    features_name, weights_name, mask_name = SHARED_POLICY_INPUTS
    names = list(SHARED_POLICY_OUTPUTS)
    for n in PROBE_SIZES:
        feeds = {
            features_name: np.zeros((2, n, n_features), np.float32),
            weights_name: np.full((2, n + 1), 1.0 / (n + 1), np.float32),
            mask_name: np.ones((2, n + 1), np.float32),
        }
        for name, value in zip(names, _run(path, session, names, feeds), strict=True):
            _check_probe_shape(path, name, value, (2, n + 1))
            if not np.all(np.isfinite(value)):
                raise ModelLoadError(f"{path}: output {name!r} is not finite on a probe batch")
