"""Load exported models from the registry and run them with onnxruntime.

Serving trusts nothing it has not verified: the manifest's schema version, every listed file's
sha256, and each graph's signature and a probe run (``serving.graphs``). A flat (``mlp``)
policy's graph maps a fixed-width observation to its weights; a shared policy's graph maps a
set of any number of assets to an action, which the server turns into weights in numpy
(``SetPolicy``) with the environment's own ``portfolio`` functions. House rule: ONNX and JSON
only; never torch, never unpickling (a training run's ``model.zip`` is refused unopened).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import sys
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

try:
    import onnxruntime as ort
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "allocator.serving needs onnxruntime: install `allocator[serve]` (onnxruntime-gpu)"
    ) from exc

from allocator.artifacts.manifest import (
    MANIFEST_FILE,
    TILT_MAPPING,
    Manifest,
    ManifestError,
    read_manifest,
    verify_checksums,
)
from allocator.portfolio import AnchorSpec, AssetFeatureSpec, check_tilt_strength
from allocator.registry.errors import (
    BAD_MANIFEST,
    CHECKSUM_MISMATCH,
    UNSUPPORTED_FORMAT,
    ModelLoadError,
    ModelNotFoundError,
)
from allocator.registry.layout import (
    ICM_FILE,
    ICM_INPUTS,
    ICM_OUTPUT,
    MODEL_FILE,
    POLICY_OUTPUTS,
    SHARED_POLICY_INPUTS,
    SHARED_POLICY_OUTPUTS,
)
from allocator.serving.graphs import check_flat, check_shared, icm_signature, model_signature

logger = logging.getLogger("allocator.serving")

SHARED_POLICY = "shared"
ASSET_FEATURES = "asset_v1"

ALLOWED_SUFFIXES = frozenset({".onnx", ".json"})
PICKLE_SUFFIXES = frozenset(
    {".zip", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npz", ".npy"}
)

Float32Array = NDArray[np.float32]

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
CUDA_DRIVER = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


@dataclass(frozen=True)
class SetPolicy:
    """How a shared policy is served: its feature set, its anchor and tilt, its asset limit."""

    features: AssetFeatureSpec
    anchor: AnchorSpec
    k: float
    max_assets: int

    @property
    def prices_per_asset(self) -> int:
        return max(self.features.prices_per_asset, self.anchor.prices_per_asset)

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> SetPolicy:
        fs = manifest.feature_spec
        if fs.kind != ASSET_FEATURES:
            raise ModelLoadError(
                f"shared policy with feature set {fs.kind!r}; serving knows {ASSET_FEATURES!r}",
                UNSUPPORTED_FORMAT,
            )
        if manifest.action_mapping != TILT_MAPPING or manifest.tilt is None:
            raise ModelLoadError(
                f"shared policy with action mapping {manifest.action_mapping!r}; serving "
                f"knows {TILT_MAPPING!r} with its tilt settings",
                UNSUPPORTED_FORMAT,
            )
        try:
            return cls(
                features=fs.asset_spec(),
                anchor=manifest.tilt.anchor.spec(),
                k=check_tilt_strength(manifest.tilt.k),
                max_assets=manifest.served_asset_limit,
            )
        except ValueError as exc:
            raise ModelLoadError(f"unusable shared-policy settings: {exc}", BAD_MANIFEST) from exc


@dataclass(frozen=True)
class LoadedModel:
    """A verified exported model and its sessions; ``set_policy`` ``None``: a flat policy."""

    name: str
    version: str
    directory: Path
    manifest: Manifest
    session: Any = field(repr=False)
    icm_session: Any | None = field(repr=False)
    provider: str
    set_policy: SetPolicy | None = None

    @property
    def max_assets(self) -> int:
        """The training slots M (the flat graph's width; the ICM's width for both kinds)."""
        return self.manifest.feature_spec.max_assets

    @property
    def n_slots(self) -> int:
        """Width of the flat graphs' action, weights and mask: cash + ``max_assets``."""
        return self.max_assets + 1

    @cached_property  # read per decided row: the layout is built once
    def obs_dim(self) -> int:
        """Width of the flat raw observation (the flat policy's and every ICM's input):
        M * F asset features + (M + 1) weights + (M + 1) mask."""
        return self.manifest.feature_spec.layout.obs_size

    @property
    def max_request_assets(self) -> int:
        return self.max_assets if self.set_policy is None else self.set_policy.max_assets

    @property
    def prices_per_asset(self) -> int:
        """Closes every request must send per asset, oldest first."""
        if self.set_policy is None:
            return self.manifest.feature_spec.window + 1
        return self.set_policy.prices_per_asset

    def run(
        self, raw_observations: ArrayLike, masks: ArrayLike
    ) -> tuple[Float32Array, Float32Array]:
        """Actions and weights, each ``(batch, max_assets + 1)``, for raw observations (the graph
        normalizes them itself)."""
        if self.set_policy is not None:
            raise TypeError(f"{self.name} {self.version} is a shared policy: use run_sets")
        obs, mask = _batches(
            raw_observations=(raw_observations, self.obs_dim), masks=(masks, self.n_slots)
        )
        action, weights = self.session.run(list(POLICY_OUTPUTS), {"observation": obs, "mask": mask})
        return np.asarray(action, dtype=np.float32), np.asarray(weights, dtype=np.float32)

    def run_sets(
        self, raw_features: ArrayLike, weights: ArrayLike, masks: ArrayLike
    ) -> Float32Array:
        """A shared policy's actions ``(batch, N + 1)`` for raw features ``(batch, N, F)`` (the
        graph normalizes them itself); masked slots' actions are 0."""
        if self.set_policy is None:
            raise TypeError(f"{self.name} {self.version} is a flat policy: use run")
        n_features = self.set_policy.features.n_features
        feats = np.ascontiguousarray(raw_features, dtype=np.float32)
        if feats.ndim != 3 or feats.shape[2] != n_features or 0 in feats.shape[:2]:
            raise ValueError(
                f"raw_features must have shape (batch, assets, {n_features}), got {feats.shape}"
            )
        n_slots = feats.shape[1] + 1
        w, mask = _batches(feats, weights=(weights, n_slots), masks=(masks, n_slots))
        (action,) = self.session.run(
            list(SHARED_POLICY_OUTPUTS),
            dict(zip(SHARED_POLICY_INPUTS, (feats, w, mask), strict=True)),
        )
        return np.asarray(action, dtype=np.float32)

    def intrinsic_reward(
        self,
        previous_observations: ArrayLike,
        actions: ArrayLike,
        observations: ArrayLike,
        masks: ArrayLike,
    ) -> Float32Array:
        """The ICM's curiosity signal, shape ``(batch,)``, for monitoring."""
        if self.icm_session is None:
            raise ModelLoadError(
                f"{self.directory / ICM_FILE}: this model was exported without an ICM"
            )
        feeds = _batches(
            previous_observations=(previous_observations, self.obs_dim),
            actions=(actions, self.n_slots),
            observations=(observations, self.obs_dim),
            masks=(masks, self.n_slots),
        )
        (reward,) = self.icm_session.run([ICM_OUTPUT], dict(zip(ICM_INPUTS, feeds, strict=True)))
        return np.asarray(reward, dtype=np.float32).reshape(-1)


def _batches(*given: Float32Array, **named: tuple[ArrayLike, int]) -> list[Float32Array]:
    """Each named ``(values, width)`` as float32 ``(batch, width)``, all and ``given`` of one
    batch size."""
    arrays = []
    for what, (values, width) in named.items():
        a = np.ascontiguousarray(values, dtype=np.float32)
        if a.ndim != 2 or a.shape[1] != width:
            raise ValueError(f"{what} must have shape (batch, {width}), got {a.shape}")
        if a.shape[0] == 0:
            raise ValueError(f"{what} is an empty batch")
        arrays.append(a)
    sizes = {a.shape[0] for a in (*given, *arrays)}
    if len(sizes) != 1:
        raise ValueError(f"inputs have different batch sizes {sorted(sizes)}")
    return arrays


def _check_listing(directory: Path, manifest: Manifest) -> None:
    manifest_path = directory / MANIFEST_FILE
    for name in manifest.files:
        if Path(name).name != name or name in {"", ".", ".."}:
            raise ModelLoadError(
                f"{manifest_path}: file entry {name!r} is not a plain file name", BAD_MANIFEST
            )
    if MODEL_FILE not in manifest.files:
        listed = ", ".join(sorted(manifest.files)) or "nothing"
        raise ModelLoadError(
            f"{directory / MODEL_FILE}: not an exported model: {manifest_path} lists {listed} "
            f"but no {MODEL_FILE} (a training run? export it with `allocator export`)",
            UNSUPPORTED_FORMAT,
        )
    for name in sorted(manifest.files):
        if Path(name).suffix.lower() not in ALLOWED_SUFFIXES:
            raise ModelLoadError(
                f"{directory / name}: not an exported model file (serving reads only ONNX and "
                "JSON, never pickles)",
                UNSUPPORTED_FORMAT,
            )
    for path in sorted(directory.iterdir()):
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise ModelLoadError(
                f"{path}: pickle-type file in an exported model directory; refusing to serve "
                "from it (serving reads only ONNX and JSON)",
                UNSUPPORTED_FORMAT,
            )
    icm = directory / ICM_FILE
    if ICM_FILE not in manifest.files and icm.exists():
        raise ModelLoadError(
            f"{icm}: present but not listed in {manifest_path}: unverified", UNSUPPORTED_FORMAT
        )


# The onnxruntime-gpu wheel lists CUDA everywhere; where the CUDA libraries or a GPU are
# missing, asking for it prints red errors and runs on the CPU anyway. Loading the provider's
# library and asking the driver for a device answers quietly, once per process.
def cuda_provider_library() -> Path:
    name = (
        "onnxruntime_providers_cuda.dll"
        if sys.platform == "win32"
        else "libonnxruntime_providers_cuda.so"
    )
    return Path(ort.__file__).parent / "capi" / name


def cuda_unavailable_reason() -> str | None:
    """Why onnxruntime's CUDA provider cannot run here, or ``None`` when it can."""
    if CUDA not in ort.get_available_providers():
        return "this onnxruntime build has no CUDA provider"
    library = cuda_provider_library()
    try:
        ctypes.CDLL(str(library))  # what onnxruntime would do, minus the red error on failure
    except OSError as exc:
        return str(exc).replace(f"{library}: ", "")
    try:
        driver = ctypes.CDLL(CUDA_DRIVER)
    except OSError:
        return f"no NVIDIA driver ({CUDA_DRIVER} not found)"
    count = ctypes.c_int(0)
    if driver.cuInit(0) or driver.cuDeviceGetCount(ctypes.byref(count)) or count.value < 1:
        return "the CUDA driver sees no GPU"
    return None


@cache
def cuda_usable() -> bool:
    """Whether to ask onnxruntime for CUDA; when not, say why once."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        logger.info(
            "onnxruntime's CUDA provider cannot run here (%s): models run on the CPU", reason
        )
    return reason is None


def session_options() -> Any:
    """One intra-op thread, run on the caller's: a batch takes microseconds, and handing it to
    a pool thread costs a wake-up per call (about 0.4 ms) for no speed."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    # No pool thread busy-waits between runs (a spinning one kept a core busy).
    for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
        options.add_session_config_entry(key, "0")
    return options


def _make_session(path: Path, expected_sha256: str, prefer_cuda: bool) -> Any:
    """The file hashed again as read (the session gets exactly what was verified), on CUDA first
    when wanted and usable (``cuda_usable``), else or on failure on the CPU."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != expected_sha256:
        raise ModelLoadError(
            f"{path}: sha256 changed while loading (altered during load?)", CHECKSUM_MISMATCH
        )
    if prefer_cuda and cuda_usable():
        try:
            return ort.InferenceSession(data, session_options(), providers=[CUDA, CPU])
        except Exception as exc:
            logger.warning("%s: CUDA session failed (%s); retrying on CPU", path, exc)
    try:
        return ort.InferenceSession(data, session_options(), providers=[CPU])
    except Exception as exc:
        raise ModelLoadError(f"{path}: onnxruntime cannot load it: {exc}") from exc


def load_model(
    directory: str | Path,
    *,
    prefer_cuda: bool = True,
    name: str | None = None,
    version: str | None = None,
) -> LoadedModel:
    """Verify and load ``REGISTRY/NAME/VERSION``; refusals name the file."""
    d = Path(directory)
    if not d.is_dir():
        raise ModelNotFoundError(f"{d}: no such model directory")
    try:
        manifest = read_manifest(d)
        _check_listing(d, manifest)
        verify_checksums(d, manifest)
    except ManifestError as exc:
        raise ModelLoadError(str(exc), exc.reason) from exc

    layout = manifest.feature_spec.layout
    obs_dim, n_slots = layout.obs_size, layout.n_slots
    set_policy = None
    if manifest.policy.kind == SHARED_POLICY:
        try:
            set_policy = SetPolicy.from_manifest(manifest)
        except ModelLoadError as exc:
            raise ModelLoadError(f"{d / MANIFEST_FILE}: {exc}", exc.reason) from exc

    model_path = d / MODEL_FILE
    session = _make_session(model_path, manifest.files[MODEL_FILE], prefer_cuda)
    provider = session.get_providers()[0]
    if set_policy is None:
        check_flat(model_path, session, model_signature(obs_dim, n_slots))
    else:
        check_shared(model_path, session, set_policy.features.n_features)

    icm_session = None
    if ICM_FILE in manifest.files:
        icm_path = d / ICM_FILE
        icm_session = _make_session(icm_path, manifest.files[ICM_FILE], prefer_cuda)
        check_flat(icm_path, icm_session, icm_signature(obs_dim, n_slots))

    if prefer_cuda and cuda_usable() and provider != CUDA:
        logger.warning(
            "%s: %s looked usable but the session runs on %s", model_path, CUDA, provider
        )
    model = LoadedModel(
        name=name if name is not None else d.resolve().parent.name,
        version=version if version is not None else d.resolve().name,
        directory=d,
        manifest=manifest,
        session=session,
        icm_session=icm_session,
        provider=provider,
        set_policy=set_policy,
    )
    logger.info(
        "loaded model %s version %s from %s on %s (policy: %s, icm: %s)",
        model.name,
        model.version,
        d,
        provider,
        "flat" if set_policy is None else "shared",
        "yes" if icm_session is not None else "no",
    )
    return model
