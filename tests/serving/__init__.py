"""Builders of small exported-model directories, shaped like the exporter's output.

The real exporter is not needed (nor torch): graphs are written with ``onnx.helper`` with the
registry's input/output names and shapes. The math is deliberately simple; the loader only cares
about the signature, the manifest and the checksums.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from allocator.artifacts.manifest import (
    DataInfo,
    FeatureSpecInfo,
    Manifest,
    NormalizationInfo,
    checksums,
    write_manifest,
)

OPSET = 17
IR_VERSION = 10
"""onnx 1.23 writes IR 14 by default, which onnxruntime 1.31 refuses (max 13): pin it."""


@dataclass(frozen=True)
class Spec:
    max_assets: int = 3
    window: int = 4

    @property
    def n_slots(self) -> int:
        return self.max_assets + 1

    @property
    def obs_dim(self) -> int:
        return self.max_assets * self.window + 2 * self.n_slots


def _io(name: str, width: int, batch: str | int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, width])


def policy_weights(spec: Spec, seed: int = 0) -> np.ndarray:
    """The matrix W of ``action = tanh(observation @ W)``."""
    rng = np.random.default_rng(seed)
    return rng.normal(0, 0.3, size=(spec.obs_dim, spec.n_slots)).astype(np.float32)


def reference_policy(w: np.ndarray, obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, ...]:
    """What the test graph computes, in numpy: action, then masked-softmax weights."""
    action = np.tanh(obs.astype(np.float64) @ w.astype(np.float64))
    e = np.exp(action) * mask
    return action, e / e.sum(axis=1, keepdims=True)


def policy_model(
    spec: Spec,
    *,
    seed: int = 0,
    input_names: tuple[str, str] = ("observation", "mask"),
    obs_dim: int | None = None,
    batch: str | int = "batch",
    out_width: int | None = None,
    ir_version: int = IR_VERSION,
) -> onnx.ModelProto:
    """action = Tanh(observation @ W); weights = Exp(action) * mask / sum."""
    d = obs_dim if obs_dim is not None else spec.obs_dim
    n = out_width if out_width is not None else spec.n_slots
    w = policy_weights(spec, seed)
    if (d, n) != (spec.obs_dim, spec.n_slots):
        w = np.random.default_rng(seed).normal(0, 0.3, size=(d, n)).astype(np.float32)
    obs_name, mask_name = input_names
    nodes = [
        helper.make_node("MatMul", [obs_name, "W"], ["z"]),
        helper.make_node("Tanh", ["z"], ["action"]),
        helper.make_node("Exp", ["action"], ["e"]),
        helper.make_node("Mul", ["e", mask_name], ["em"]),
        helper.make_node("ReduceSum", ["em", "axes"], ["total"], keepdims=1),
        helper.make_node("Div", ["em", "total"], ["weights"]),
    ]
    graph = helper.make_graph(
        nodes,
        "policy",
        [_io(obs_name, d, batch), _io(mask_name, n, batch)],
        [_io("action", n, batch), _io("weights", n, batch)],
        initializer=[
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=ir_version
    )
    onnx.checker.check_model(model)
    return model


def icm_model(spec: Spec) -> onnx.ModelProto:
    """intrinsic_reward = 0.5 * sum((observation - previous_observation)^2) + 0 * action, mask."""
    nodes = [
        helper.make_node("Sub", ["observation", "previous_observation"], ["diff"]),
        helper.make_node("Mul", ["diff", "diff"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
        helper.make_node("Mul", ["s", "half"], ["r0"]),
        helper.make_node("Mul", ["action", "mask"], ["am"]),
        helper.make_node("ReduceSum", ["am", "axes"], ["amsum"], keepdims=1),
        helper.make_node("Mul", ["amsum", "zero"], ["amzero"]),
        helper.make_node("Add", ["r0", "amzero"], ["intrinsic_reward"]),
    ]
    graph = helper.make_graph(
        nodes,
        "icm",
        [
            _io("previous_observation", spec.obs_dim, "batch"),
            _io("action", spec.n_slots, "batch"),
            _io("observation", spec.obs_dim, "batch"),
            _io("mask", spec.n_slots, "batch"),
        ],
        [_io("intrinsic_reward", 1, "batch")],
        initializer=[
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
            numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    return model


def make_manifest(spec: Spec, files: dict[str, str], *, icm: bool = False) -> Manifest:
    return Manifest(
        name="test-run",
        algorithm="td3",
        feature_spec=FeatureSpecInfo(max_assets=spec.max_assets, window=spec.window, clip=10.0),
        normalization=NormalizationInfo(mean=0.0005, std=0.02),
        beta=0.5,
        cost_bps=10.0,
        data=DataInfo(
            dataset="synthetic",
            universe=[f"A{i}" for i in range(spec.max_assets)],
            train_start="2010-01-01",
            train_end="2015-12-31",
        ),
        icm={"enabled": True} if icm else None,
        export={"format": "onnx", "opset": OPSET},
        files=files,
    )


def write_exported_model(
    directory: Path,
    spec: Spec | None = None,
    *,
    model: onnx.ModelProto | None = None,
    icm: bool = False,
    seed: int = 0,
) -> Path:
    """``directory`` holding model.onnx (+ icm.onnx) and a v2 manifest listing their sha256."""
    spec = spec or Spec()
    directory.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else policy_model(spec, seed=seed)
    (directory / "model.onnx").write_bytes(model.SerializeToString())
    names = ["model.onnx"]
    if icm:
        (directory / "icm.onnx").write_bytes(icm_model(spec).SerializeToString())
        names.append("icm.onnx")
    write_manifest(directory, make_manifest(spec, checksums(directory, names), icm=icm))
    return directory
