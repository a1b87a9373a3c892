"""Load exported models from the registry and run them with onnxruntime.

A version directory (``allocator.registry.layout``; which directories are versions:
``allocator.registry.versions``) holds ``model.onnx``, optionally ``icm.onnx``, and
``manifest.json`` (schema v2) whose ``files`` lists both with their sha256. Serving trusts
nothing it has not verified: the manifest's schema version, every listed file's checksum, and
the graph's input/output signature against the manifest's feature spec.

House rule: this module reads ONNX and JSON only. It never imports torch and never unpickles
(a training run's ``model.zip`` is refused, unopened).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from allocator.artifacts.manifest import (
    MANIFEST_FILE,
    Manifest,
    ManifestError,
    read_manifest,
    verify_checksums,
)
from allocator.registry.errors import ModelLoadError, ModelNotFoundError
from allocator.registry.layout import (
    ICM_FILE,
    ICM_INPUTS,
    ICM_OUTPUT,
    MODEL_FILE,
    POLICY_INPUTS,
    POLICY_OUTPUTS,
)
from allocator.registry.versions import resolve

try:
    import onnxruntime as ort
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "allocator.serving needs onnxruntime: install `allocator[serve]` (onnxruntime-gpu)"
    ) from exc

logger = logging.getLogger("allocator.serving")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

ALLOWED_SUFFIXES = frozenset({".onnx", ".json"})
"""What a manifest of an exported model may list: everything else is refused unopened."""
PICKLE_SUFFIXES = frozenset(
    {".zip", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npz", ".npy"}
)
"""Files that are (or may hold) pickles: their presence means this is not an exported model."""

Float32Array = NDArray[np.float32]


@dataclass(frozen=True)
class _Signature:
    """Expected width of every named ``[batch, width]`` input and output of a graph."""

    inputs: dict[str, int]
    outputs: dict[str, int]


def _model_signature(obs_dim: int, n_slots: int) -> _Signature:
    return _Signature(
        inputs=dict(zip(POLICY_INPUTS, (obs_dim, n_slots), strict=True)),
        outputs=dict(zip(POLICY_OUTPUTS, (n_slots, n_slots), strict=True)),
    )


def _icm_signature(obs_dim: int, n_slots: int) -> _Signature:
    return _Signature(
        inputs=dict(zip(ICM_INPUTS, (obs_dim, n_slots, obs_dim, n_slots), strict=True)),
        outputs={ICM_OUTPUT: 1},
    )


@dataclass(frozen=True)
class LoadedModel:
    """A verified exported model with its onnxruntime session(s), ready to serve batches."""

    name: str
    version: str
    directory: Path
    manifest: Manifest
    session: Any = field(repr=False)
    icm_session: Any | None = field(repr=False)
    provider: str

    @property
    def max_assets(self) -> int:
        return self.manifest.feature_spec.max_assets

    @property
    def n_slots(self) -> int:
        """Width of action, weights and mask: cash + ``max_assets``."""
        return self.max_assets + 1

    @property
    def obs_dim(self) -> int:
        return _obs_dim(self.manifest)

    def run(
        self, raw_observations: ArrayLike, masks: ArrayLike
    ) -> tuple[Float32Array, Float32Array]:
        """Actions and portfolio weights, each ``(batch, max_assets + 1)``, for a batch.

        ``raw_observations`` come from ``portfolio.build_raw_observation``: the graph applies
        the manifest's normalization itself, so the server never normalizes twice.
        """
        obs = _batch(raw_observations, self.obs_dim, "raw_observations")
        mask = _batch(masks, self.n_slots, "masks")
        _same_batch(obs, mask)
        action, weights = self.session.run(list(POLICY_OUTPUTS), {"observation": obs, "mask": mask})
        return np.asarray(action, dtype=np.float32), np.asarray(weights, dtype=np.float32)

    def intrinsic_reward(
        self,
        previous_observations: ArrayLike,
        actions: ArrayLike,
        observations: ArrayLike,
        masks: ArrayLike,
    ) -> Float32Array:
        """The ICM's curiosity signal, one value per row (shape ``(batch,)``), for monitoring."""
        if self.icm_session is None:
            raise ModelLoadError(
                f"{self.directory / ICM_FILE}: this model was exported without an ICM"
            )
        prev = _batch(previous_observations, self.obs_dim, "previous_observations")
        act = _batch(actions, self.n_slots, "actions")
        obs = _batch(observations, self.obs_dim, "observations")
        mask = _batch(masks, self.n_slots, "masks")
        _same_batch(prev, act, obs, mask)
        (reward,) = self.icm_session.run(
            [ICM_OUTPUT],
            {"previous_observation": prev, "action": act, "observation": obs, "mask": mask},
        )
        return np.asarray(reward, dtype=np.float32).reshape(-1)


def _batch(values: ArrayLike, width: int, what: str) -> Float32Array:
    """A C-contiguous float32 ``(batch, width)`` array, or a ValueError saying what is wrong."""
    a = np.ascontiguousarray(values, dtype=np.float32)
    if a.ndim != 2 or a.shape[1] != width:
        raise ValueError(f"{what} must have shape (batch, {width}), got {a.shape}")
    if a.shape[0] == 0:
        raise ValueError(f"{what} is an empty batch")
    return a


def _same_batch(*arrays: Float32Array) -> None:
    sizes = {a.shape[0] for a in arrays}
    if len(sizes) != 1:
        raise ValueError(f"inputs have different batch sizes {sorted(sizes)}")


def _obs_dim(manifest: Manifest) -> int:
    """The raw observation width: M * W asset features + (M + 1) weights + (M + 1) mask."""
    spec = manifest.feature_spec
    return spec.max_assets * spec.window + 2 * (spec.max_assets + 1)


def _check_listing(directory: Path, manifest: Manifest) -> None:
    """Refuse, before opening anything, directories that are not exported models."""
    manifest_path = directory / MANIFEST_FILE
    for name in manifest.files:
        if Path(name).name != name or name in {"", ".", ".."}:
            raise ModelLoadError(f"{manifest_path}: file entry {name!r} is not a plain file name")
    if MODEL_FILE not in manifest.files:
        listed = ", ".join(sorted(manifest.files)) or "nothing"
        raise ModelLoadError(
            f"{directory / MODEL_FILE}: not an exported model: {manifest_path} lists {listed} "
            f"but no {MODEL_FILE} (a training run? export it with `allocator export`)"
        )
    for name in sorted(manifest.files):
        if Path(name).suffix.lower() not in ALLOWED_SUFFIXES:
            raise ModelLoadError(
                f"{directory / name}: not an exported model file (serving reads only ONNX and "
                "JSON, never pickles)"
            )
    for path in sorted(directory.iterdir()):
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise ModelLoadError(
                f"{path}: pickle-type file in an exported model directory; refusing to serve "
                "from it (serving reads only ONNX and JSON)"
            )
    icm = directory / ICM_FILE
    if ICM_FILE not in manifest.files and icm.exists():
        raise ModelLoadError(f"{icm}: present but not listed in {manifest_path}: unverified")


def _read_verified(path: Path, expected_sha256: str) -> bytes:
    """The file's bytes, hashed again as read so the session gets exactly what was verified."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != expected_sha256:
        raise ModelLoadError(f"{path}: sha256 changed while loading (altered during load?)")
    return data


def _providers(prefer_cuda: bool) -> list[str]:
    available = ort.get_available_providers()
    if prefer_cuda and CUDA in available:
        return [CUDA, CPU]
    return [CPU]


def _make_session(path: Path, data: bytes, prefer_cuda: bool) -> Any:
    """An InferenceSession, CUDA first when wanted and listed, CPU when CUDA cannot start.

    The onnxruntime-gpu wheel lists CUDA even on machines without a GPU or CUDA libraries and
    then silently falls back to CPU; ``session.get_providers()[0]`` is what really runs.
    """
    providers = _providers(prefer_cuda)
    try:
        return ort.InferenceSession(data, providers=providers)
    except Exception as exc:
        if providers[0] != CUDA:
            raise ModelLoadError(f"{path}: onnxruntime cannot load it: {exc}") from exc
        logger.warning("%s: CUDA session failed (%s); retrying on CPU", path, exc)
    try:
        return ort.InferenceSession(data, providers=[CPU])
    except Exception as exc:
        raise ModelLoadError(f"{path}: onnxruntime cannot load it: {exc}") from exc


def _check_signature(path: Path, session: Any, expected: _Signature) -> None:
    """Names, float32 type, dynamic batch and widths of the graph against the feature spec."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    if set(inputs) != set(expected.inputs):
        raise ModelLoadError(
            f"{path}: graph inputs {sorted(inputs)}, expected {sorted(expected.inputs)}"
        )
    missing = sorted(set(expected.outputs) - set(outputs))
    if missing:
        raise ModelLoadError(
            f"{path}: graph outputs {sorted(outputs)} lack {missing} "
            f"(expected {sorted(expected.outputs)})"
        )
    for kind, args, widths in (
        ("input", inputs, expected.inputs),
        ("output", outputs, expected.outputs),
    ):
        for name, width in widths.items():
            arg = args[name]
            if arg.type != "tensor(float)":
                raise ModelLoadError(f"{path}: {kind} {name!r} is {arg.type}, expected float32")
            shape = list(arg.shape)
            if len(shape) != 2:
                raise ModelLoadError(
                    f"{path}: {kind} {name!r} has shape {shape}, expected [batch, {width}]"
                )
            if isinstance(shape[0], int):
                raise ModelLoadError(
                    f"{path}: {kind} {name!r} has a fixed batch {shape[0]}; export it with a "
                    "dynamic batch axis"
                )
            # Inputs must state their width; outputs may leave it symbolic (probed below).
            if shape[1] != width and (kind == "input" or isinstance(shape[1], int)):
                raise ModelLoadError(
                    f"{path}: {kind} {name!r} has shape {shape}, the manifest's feature spec "
                    f"needs [batch, {width}]"
                )


def _probe(path: Path, session: Any, expected: _Signature) -> None:
    """Run a batch of two neutral rows: output shapes are real, not just declared."""
    feeds = {}
    for name, width in expected.inputs.items():
        feeds[name] = (
            np.ones((2, width), np.float32) if name == "mask" else np.zeros((2, width), np.float32)
        )
    names = list(expected.outputs)
    try:
        results = session.run(names, feeds)
    except Exception as exc:
        raise ModelLoadError(f"{path}: a probe batch failed to run: {exc}") from exc
    for name, value in zip(names, results, strict=True):
        want = (2, expected.outputs[name])
        if tuple(np.shape(value)) != want:
            raise ModelLoadError(
                f"{path}: output {name!r} has shape {tuple(np.shape(value))} for a batch of 2, "
                f"expected {want}"
            )


def load_model(
    directory: str | Path,
    *,
    prefer_cuda: bool = True,
    name: str | None = None,
    version: str | None = None,
) -> LoadedModel:
    """Verify and load ``directory`` (``REGISTRY/NAME/VERSION``); refusals name the file.

    ``name`` and ``version`` default to the directory layout's NAME and VERSION.
    """
    d = Path(directory)
    if not d.is_dir():
        raise ModelNotFoundError(f"{d}: no such model directory")
    try:
        manifest = read_manifest(d)
    except ManifestError as exc:
        raise ModelLoadError(str(exc)) from exc
    _check_listing(d, manifest)
    try:
        verify_checksums(d, manifest)
    except ManifestError as exc:
        raise ModelLoadError(str(exc)) from exc

    obs_dim = _obs_dim(manifest)
    n_slots = manifest.feature_spec.max_assets + 1

    model_path = d / MODEL_FILE
    session = _make_session(
        model_path, _read_verified(model_path, manifest.files[MODEL_FILE]), prefer_cuda
    )
    provider = session.get_providers()[0]
    _check_signature(model_path, session, _model_signature(obs_dim, n_slots))
    _probe(model_path, session, _model_signature(obs_dim, n_slots))

    icm_session = None
    if ICM_FILE in manifest.files:
        icm_path = d / ICM_FILE
        icm_session = _make_session(
            icm_path, _read_verified(icm_path, manifest.files[ICM_FILE]), prefer_cuda
        )
        _check_signature(icm_path, icm_session, _icm_signature(obs_dim, n_slots))
        _probe(icm_path, icm_session, _icm_signature(obs_dim, n_slots))

    if prefer_cuda and CUDA in ort.get_available_providers() and provider != CUDA:
        logger.warning(
            "%s: onnxruntime lists %s but the session runs on %s (no usable GPU/CUDA libraries)",
            model_path,
            CUDA,
            provider,
        )
    model = LoadedModel(
        name=name if name is not None else d.resolve().parent.name,
        version=version if version is not None else d.resolve().name,
        directory=d,
        manifest=manifest,
        session=session,
        icm_session=icm_session,
        provider=provider,
    )
    logger.info(
        "loaded model %s version %s from %s on %s (icm: %s)",
        model.name,
        model.version,
        d,
        provider,
        "yes" if icm_session is not None else "no",
    )
    return model


def load_from_registry(
    registry: str | Path,
    name: str,
    version: str | None = None,
    *,
    prefer_cuda: bool = True,
) -> LoadedModel:
    """``load_model(resolve(registry, name, version))``."""
    d = resolve(registry, name, version)
    return load_model(d, prefer_cuda=prefer_cuda, name=name, version=d.name)
