"""Schema 3: the representation fields, their checks, and schema-2 manifests read as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from allocator.artifacts.manifest import (
    ACTION_MAPPING,
    DEFAULT_MAX_SERVED_ASSETS,
    MANIFEST_FILE,
    SCHEMA_VERSION,
    TILT_MAPPING,
    FeatureNormalizationInfo,
    FeatureSpecInfo,
    ManifestError,
    read_manifest,
    write_manifest,
)
from allocator.portfolio import AnchorKind, AssetFeatureSpec, FeatureSpec
from tests.artifacts.test_manifest import make_dir

SPEC = AssetFeatureSpec(window=5, horizons=(3, 5), vol_window=4, clip=8.0)


def shared_fields(spec: AssetFeatureSpec = SPEC) -> dict[str, Any]:
    f = spec.n_features
    return {
        "policy": {"kind": "shared", "hidden": 16},
        "feature_spec": FeatureSpecInfo.for_assets(6, spec).model_dump(),
        "feature_normalization": {"mean": [0.1] * f, "std": [0.5] * f},
        "action_mapping": TILT_MAPPING,
        "tilt": {"k": 2.0, "anchor": {"kind": "inverse_volatility", "cash_share": 0.1}},
    }


def v3_raw(tmp_path: Path, **changes: Any) -> tuple[Path, dict[str, Any]]:
    d, manifest = make_dir(tmp_path)
    raw = {**manifest.model_dump(mode="json"), **shared_fields(), **changes}
    (d / MANIFEST_FILE).write_text(json.dumps(raw))
    return d, raw


def test_schema_2_manifests_read_with_the_defaults_they_meant(tmp_path):
    d, manifest = make_dir(tmp_path)
    raw = json.loads((d / MANIFEST_FILE).read_text())
    for key in ("policy", "feature_normalization", "tilt", "max_served_assets"):
        del raw[key]
    for key in ("kind", "horizons", "vol_window", "version"):
        del raw["feature_spec"][key]
    raw["schema_version"] = 2
    (d / MANIFEST_FILE).write_text(json.dumps(raw))
    loaded = read_manifest(d)
    assert loaded.schema_version == 2  # what the file is, so a caller can tell
    assert loaded.policy.kind == "mlp"
    assert loaded.policy.hidden is None
    assert loaded.feature_spec.kind == "returns"
    assert loaded.feature_spec.n_features == loaded.feature_spec.window == 5
    assert loaded.feature_spec.layout == FeatureSpec(max_assets=3, window=5, clip=10.0)
    assert loaded.feature_normalization is None
    assert loaded.action_mapping == ACTION_MAPPING
    assert loaded.tilt is None
    assert loaded.max_served_assets is None
    assert loaded.served_asset_limit == 3
    assert loaded.model_copy(update={"schema_version": SCHEMA_VERSION}) == manifest


def test_a_shared_manifest_round_trips_with_its_representation(tmp_path):
    d, _ = v3_raw(tmp_path)
    loaded = read_manifest(d)
    assert loaded.policy.kind == "shared"
    assert loaded.max_served_assets == DEFAULT_MAX_SERVED_ASSETS  # filled when not stated
    assert loaded.served_asset_limit == DEFAULT_MAX_SERVED_ASSETS
    assert loaded.feature_spec.asset_spec() == SPEC
    assert loaded.feature_spec.features == list(SPEC.names)
    assert loaded.feature_spec.n_features == SPEC.n_features
    assert loaded.feature_spec.layout == FeatureSpec(6, SPEC.n_features, SPEC.clip)
    assert loaded.feature_normalization is not None
    assert loaded.feature_normalization.normalization().n_features == SPEC.n_features
    assert loaded.tilt is not None
    anchor = loaded.tilt.anchor.spec()
    assert (anchor.kind, anchor.cash_share, anchor.vol_window) == (
        AnchorKind.INVERSE_VOLATILITY,
        0.1,
        20,
    )
    write_manifest(d, loaded.model_copy(update={"max_served_assets": 40}))
    again = read_manifest(d)
    assert again.max_served_assets == again.served_asset_limit == 40
    assert again.model_copy(update={"max_served_assets": loaded.max_served_assets}) == loaded


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"feature_normalization": None}, "needs feature_normalization"),
        ({"feature_normalization": {"mean": [0.0], "std": [1.0]}}, "has 1 features"),
        ({"feature_normalization": {"mean": [0.0] * 17, "std": [0.0] * 17}}, "std"),
        ({"tilt": None}, "tilt settings are required"),
        ({"action_mapping": ACTION_MAPPING}, "tilt settings are required"),
        ({"action_mapping": "softmax_v9"}, "action_mapping"),
        ({"policy": {"kind": "mlp"}, "max_served_assets": 10}, "max_served_assets is for shared"),
        ({"policy": {"kind": "transformer"}}, "policy"),
        ({"tilt": {"k": 0.0}}, "tilt.k"),
        ({"tilt": {"k": 1.0, "anchor": {"kind": "risk_parity"}}}, "risk_parity"),
        ({"max_served_assets": 0}, "max_served_assets"),
    ],
)
def test_inconsistent_representations_are_refused(tmp_path, changes, message):
    d, _ = v3_raw(tmp_path, **changes)
    with pytest.raises(ManifestError, match=message):
        read_manifest(d)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"features": ["log_return"]}, "asset_v1 features must be"),
        ({"horizons": None}, "needs horizons and vol_window"),
        ({"horizons": [3, 3]}, "distinct"),
        ({"version": 2}, "version 2 is not supported"),
        ({"kind": "returns"}, "belong to the asset_v1 feature set"),
    ],
)
def test_inconsistent_feature_specs_are_refused(changes, message):
    raw = {**FeatureSpecInfo.for_assets(6, SPEC).model_dump(), **changes}
    with pytest.raises(ValueError, match=message):
        FeatureSpecInfo.model_validate(raw)


def test_returns_feature_spec_has_no_asset_spec():
    with pytest.raises(ValueError, match="not a per-asset feature set"):
        FeatureSpecInfo(max_assets=3, window=5, clip=10.0).asset_spec()


def test_feature_normalization_info_round_trips():
    info = FeatureNormalizationInfo(mean=[0.0, 1.0], std=[1.0, 2.0])
    assert FeatureNormalizationInfo.of(info.normalization()) == info


@pytest.mark.parametrize("version", [1, 4, "3", True])
def test_other_schema_versions_are_refused_naming_the_readable_ones(tmp_path, version):
    d, _ = v3_raw(tmp_path, schema_version=version)
    with pytest.raises(ManifestError, match=r"this Allocator reads 2, 3; run .*migrate"):
        read_manifest(d)
