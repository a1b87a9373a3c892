"""The versioned ``manifest.json`` beside every checkpoint and exported model: what runs a
policy exactly as trained and the sha256 of the files beside it. Torch-free: the server reads it.

A schema-2 manifest reads as schema 3 with the defaults, which are what schema 2 meant (flat
MLP, return window, affine mapping); version 1 (no manifest) must be migrated. The optional
``ensemble`` needs no schema bump: a manifest without it is a single model.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, ValidationError, model_validator

from allocator.artifacts.files import atomic_write_text
from allocator.portfolio import (
    MAX_TILT_STRENGTH,
    AnchorKind,
    AnchorSpec,
    AssetFeatureSpec,
    FeatureNormalization,
    FeatureSpec,
)
from allocator.typed_config import StrictModel, key_path, one_of

SCHEMA_VERSION = 3
READABLE_SCHEMA_VERSIONS = (2, 3)
MANIFEST_FILE = "manifest.json"
ACTION_MAPPING: Final = "affine_renormalize_v1"
"""``portfolio.action_to_weights``: preference (a + 1) / 2, masked, renormalized, else cash."""
TILT_MAPPING = "anchor_tilt_v1"
"""``portfolio.tilt_weights`` of the action around ``portfolio.anchor_weights`` (see ``tilt``)."""
ActionMapping = Literal["affine_renormalize_v1", "anchor_tilt_v1"]
DEFAULT_MAX_SERVED_ASSETS = 256
"""Most assets one request may carry for a shared policy, unless the manifest says otherwise:
the policy runs on any number, but latency and memory grow with it, so the server enforces a
limit the manifest states."""


MISSING_FILE = "missing_file"
"""A file the version needs is not there (yet): a copy in progress, or a deploy gone wrong."""
CHECKSUM_MISMATCH = "checksum_mismatch"
"""A listed file's sha256 differs from the manifest's: altered, truncated, or still arriving."""
BAD_MANIFEST = "bad_manifest"
"""The manifest is not valid JSON or does not validate."""
UNSUPPORTED_FORMAT = "unsupported_format"
"""Readable, but not something this Allocator serves (another schema version, a training run)."""
MANIFEST_PROBLEMS = (MISSING_FILE, CHECKSUM_MISMATCH, BAD_MANIFEST, UNSUPPORTED_FORMAT)


class ManifestError(ValueError):
    """A manifest that is missing, unreadable, of another schema version, or does not match;
    ``reason`` (one of ``MANIFEST_PROBLEMS``) lets the server count refusals by cause."""

    def __init__(self, message: str, reason: str = BAD_MANIFEST) -> None:
        super().__init__(message)
        self.reason = one_of("reason", reason, MANIFEST_PROBLEMS)


class FeatureSpecInfo(StrictModel):
    """How observations are built: ``returns`` (``portfolio.observation``) or ``asset_v1``
    (``portfolio.AssetFeatureSpec``, ``features`` listing its names in order). ``max_assets``:
    the asset slots the policy was trained with."""

    kind: Literal["returns", "asset_v1"] = "returns"
    max_assets: int = Field(ge=1)
    window: int = Field(ge=1)
    clip: float = Field(gt=0)
    features: list[str] = Field(default_factory=lambda: ["log_return"])
    horizons: list[int] | None = None
    vol_window: int | None = Field(None, ge=1)
    version: int = 1

    @model_validator(mode="after")
    def _check_kind(self) -> FeatureSpecInfo:
        if self.kind == "returns":
            if self.horizons is not None or self.vol_window is not None:
                raise ValueError("horizons and vol_window belong to the asset_v1 feature set")
            return self
        if self.horizons is None or self.vol_window is None:
            raise ValueError("the asset_v1 feature set needs horizons and vol_window")
        names = list(self.asset_spec().names)  # also checks the spec itself
        if self.features != names:
            raise ValueError(f"asset_v1 features must be {names}, got {self.features}")
        return self

    @classmethod
    def for_assets(cls, max_assets: int, spec: AssetFeatureSpec) -> FeatureSpecInfo:
        return cls(
            kind="asset_v1", max_assets=max_assets, features=list(spec.names), **spec.to_dict()
        )

    def asset_spec(self) -> AssetFeatureSpec:
        """The ``asset_v1`` feature set as the policy contract spells it."""
        if self.kind != "asset_v1" or self.horizons is None or self.vol_window is None:
            raise ValueError(f"feature set {self.kind!r} is not a per-asset feature set")
        return AssetFeatureSpec(**self.model_dump(exclude={"kind", "max_assets", "features"}))

    @property
    def n_features(self) -> int:
        """Features per asset slot: the return window, or the per-asset set's F."""
        return self.window if self.kind == "returns" else self.asset_spec().n_features

    @property
    def layout(self) -> FeatureSpec:
        """The flat training observation's layout, ``n_features`` values per slot."""
        return FeatureSpec(max_assets=self.max_assets, window=self.n_features, clip=self.clip)


class NormalizationInfo(StrictModel):
    """Statistics of daily log returns over the training period."""

    mean: float
    std: float = Field(gt=0)


class FeatureNormalizationInfo(StrictModel):
    """Per-feature mean and std of the ``asset_v1`` features over the training period."""

    mean: list[float]
    std: list[float]

    @model_validator(mode="after")
    def _check(self) -> FeatureNormalizationInfo:
        self.normalization()  # same lengths, finite, std > 0
        return self

    @classmethod
    def of(cls, norm: FeatureNormalization) -> FeatureNormalizationInfo:
        return cls(mean=list(norm.mean), std=list(norm.std))

    def normalization(self) -> FeatureNormalization:
        return FeatureNormalization(mean=tuple(self.mean), std=tuple(self.std))


class PolicyInfo(StrictModel):
    """``mlp``: one flat network over the ``max_assets`` slots; ``shared``: one network per
    asset with a pooled context, exported with a dynamic asset axis. ``center_assets`` (part of
    the graph) is recorded so an operator can tell two shared policies apart."""

    kind: Literal["mlp", "shared"] = "mlp"
    hidden: int | None = Field(None, ge=1)
    center_assets: bool = False


class AnchorInfo(StrictModel):
    """The anchor portfolio a zero tilt action holds (``portfolio.AnchorSpec``)."""

    kind: str = AnchorKind.EQUAL.value
    cash_share: float = Field(0.05, ge=0, lt=1)
    vol_window: int = Field(20, ge=1)

    @model_validator(mode="after")
    def _check(self) -> AnchorInfo:
        self.spec()
        return self

    def spec(self) -> AnchorSpec:
        return AnchorSpec(
            kind=AnchorKind(self.kind), cash_share=self.cash_share, vol_window=self.vol_window
        )


class TiltInfo(StrictModel):
    """Settings of the ``anchor_tilt_v1`` mapping: ``w ~ anchor * exp(k * action)``."""

    k: float = Field(gt=0, le=MAX_TILT_STRENGTH)
    anchor: AnchorInfo = AnchorInfo()


class DataInfo(StrictModel):
    """Where the training data came from and which periods were used."""

    dataset: str
    universe: list[str]
    train_start: str
    train_end: str
    validation_start: str | None = None
    validation_end: str | None = None


class EnsembleMember(StrictModel):
    """One run of a seed ensemble, with the normalization its own run fitted: the graph
    applies each member's to the shared raw input."""

    run_id: str
    run_dir: str = Field(description="the run directory at export, resolved")
    name: str
    seed: int
    model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of its model.zip")
    normalization: NormalizationInfo
    feature_normalization: FeatureNormalizationInfo | None = None
    icm: bool = Field(False, description="whether the run was trained with curiosity")


class EnsembleInfo(StrictModel):
    """``mean_action``: the graph's action is the mean of the members' actions, its other
    outputs follow from it as from a single model's, so an ensemble serves like one. It has no
    curiosity graph; the manifest's other run fields are its first member's."""

    combine: Literal["mean_action"] = "mean_action"
    members: list[EnsembleMember] = Field(min_length=2)


class MigrationRecord(StrictModel):
    """One step applied by ``allocator checkpoint migrate``."""

    from_version: int
    to_version: int
    at: str
    note: str = ""


class Manifest(StrictModel):
    """Schema version 3 (a schema-2 manifest validates into it with the defaults)."""

    schema_version: int = SCHEMA_VERSION
    created: str = Field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())
    name: str = "run"
    algorithm: str
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    feature_spec: FeatureSpecInfo
    normalization: NormalizationInfo
    policy: PolicyInfo = PolicyInfo()
    feature_normalization: FeatureNormalizationInfo | None = None
    action_mapping: ActionMapping = ACTION_MAPPING
    tilt: TiltInfo | None = None
    max_served_assets: int | None = Field(None, ge=1)
    beta: float = Field(ge=0, lt=1)
    cost_bps: float = Field(ge=0)
    reward: dict[str, Any] = Field(default_factory=dict)
    data: DataInfo
    seed: int = 0
    library_versions: dict[str, str] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    holds_anchor: bool = Field(
        False,
        description="the actor acts exactly 0 (the anchor under the tilt mapping): selection "
        "found no inner-span skill and kept the zero action (selection.fallback_level)",
    )
    icm: dict[str, Any] | None = None
    widened_from: int | None = None
    export: dict[str, Any] | None = None
    ensemble: EnsembleInfo | None = None
    migrations: list[MigrationRecord] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict, description="file name -> sha256")

    @model_validator(mode="before")
    @classmethod
    def _default_served_assets(cls, data: Any) -> Any:
        """A shared policy without a stated limit gets ``DEFAULT_MAX_SERVED_ASSETS``."""
        if not isinstance(data, dict):
            return data
        policy = data.get("policy")
        kind = policy.get("kind") if isinstance(policy, dict) else getattr(policy, "kind", None)
        if kind == "shared" and data.get("max_served_assets") is None:
            return {**data, "max_served_assets": DEFAULT_MAX_SERVED_ASSETS}
        return data

    @model_validator(mode="after")
    def _check_representation(self) -> Manifest:
        members = self.ensemble.members if self.ensemble is not None else []
        n = self.feature_spec.n_features
        for where, norm in [
            ("", self.feature_normalization),
            *((f"ensemble member {i}: ", m.feature_normalization) for i, m in enumerate(members)),
        ]:
            if (norm is not None) != (self.feature_spec.kind == "asset_v1"):
                raise ValueError(
                    f"{where}the asset_v1 feature set needs feature_normalization, "
                    "and only it takes one"
                )
            if norm is not None and len(norm.mean) != n:
                raise ValueError(
                    f"{where}feature_normalization has {len(norm.mean)} features, the feature "
                    f"set {n}"
                )
        if (self.action_mapping == TILT_MAPPING) != (self.tilt is not None):
            raise ValueError(f"tilt settings are required with {TILT_MAPPING} and only with it")
        if self.policy.kind == "mlp" and self.max_served_assets is not None:
            raise ValueError("max_served_assets is for shared policies (an mlp serves max_assets)")
        if members and self.icm is not None:
            raise ValueError("an ensemble has no curiosity graph: icm must be empty")
        return self

    @property
    def max_assets(self) -> int:
        return self.feature_spec.max_assets

    @property
    def served_asset_limit(self) -> int:
        """Most assets per request: ``max_served_assets`` (shared) or the trained slots (mlp)."""
        if self.policy.kind == "shared" and self.max_served_assets is not None:
            return self.max_served_assets
        return self.feature_spec.max_assets


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def checksums(directory: str | Path, names: list[str]) -> dict[str, str]:
    """sha256 of each named file in ``directory`` (those that exist)."""
    d = Path(directory)
    return {n: sha256_file(d / n) for n in sorted(names) if (d / n).is_file()}


def verify_checksums(directory: str | Path, manifest: Manifest) -> None:
    """Raise naming the first file that is missing or whose sha256 differs from the manifest."""
    d = Path(directory)
    for name, expected in manifest.files.items():
        path = d / name
        if not path.is_file():
            raise ManifestError(f"{path}: listed in {MANIFEST_FILE} but missing", MISSING_FILE)
        if sha256_file(path) != expected:
            raise ManifestError(
                f"{path}: sha256 does not match {MANIFEST_FILE} (altered or truncated)",
                CHECKSUM_MISMATCH,
            )


def library_versions() -> dict[str, str]:
    """Versions of the libraries a checkpoint depends on (those installed)."""
    out = {}
    names = "allocator numpy torch stable-baselines3 gymnasium onnx onnxruntime-gpu skfolio pandas"
    for pkg in names.split():
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def read_raw(directory: str | Path) -> dict[str, Any]:
    """The manifest as plain JSON (any schema version), for migration and inspection."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(
            f"{path}: no {MANIFEST_FILE} (a version 1 checkpoint? migrate it)", MISSING_FILE
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: top level must be an object")
    return raw


def read_manifest(directory: str | Path) -> Manifest:
    """Read and validate a manifest; schema 2 keeps its ``schema_version`` so callers can tell
    it from a migrated one."""
    path = Path(directory) / MANIFEST_FILE
    raw = read_raw(directory)
    version = raw.get("schema_version")
    if version not in READABLE_SCHEMA_VERSIONS or isinstance(version, bool):
        raise ManifestError(
            f"{path}: schema version {version!r}, this Allocator reads "
            f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}; run "
            f"`allocator checkpoint migrate {Path(directory)}`",
            UNSUPPORTED_FORMAT,
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ManifestError(f"{path}: {key_path(first['loc'])}: {first['msg']}") from exc


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically; an empty ``ensemble`` is left out, so a single
    model's manifest has no such key."""
    data = manifest.model_dump(
        mode="json", exclude={"ensemble"} if manifest.ensemble is None else None
    )
    return atomic_write_text(Path(directory) / MANIFEST_FILE, json.dumps(data, indent=2) + "\n")
