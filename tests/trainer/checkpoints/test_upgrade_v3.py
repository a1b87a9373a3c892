"""Version 2 -> 3: a version-2 run directory (or exported version) gains the schema-3 fields
with the meaning it always had, behind a backup, its files and actions unchanged."""

from __future__ import annotations

import hashlib
import json

from allocator.artifacts.manifest import (
    ACTION_MAPPING,
    MANIFEST_FILE,
    read_manifest,
    verify_checksums,
)
from allocator.trainer.checkpoints.upgrade import upgrade_run
from tests.trainer.checkpoints.runs import SAC, TD3, copy_fixture, tree


def test_a_v2_run_upgrades_to_v3_with_todays_representation(tmp_path):
    run_dir = copy_fixture(tmp_path, SAC)
    upgrade_run(run_dir, to_version=2)
    v2 = read_manifest(run_dir)
    assert v2.schema_version == 2
    files_before = {k: v for k, v in tree(run_dir).items() if k != MANIFEST_FILE}

    result = upgrade_run(run_dir)
    assert (result.from_version, result.to_version) == (2, 3)
    assert result.backup.name.startswith(f"{SAC}.bak-v2-")
    assert result.probe.observations == 64
    assert result.probe.float32_max_diff == 0.0
    manifest = read_manifest(run_dir)
    verify_checksums(run_dir, manifest)
    assert manifest.schema_version == 3
    assert manifest.policy.kind == "mlp"
    assert manifest.feature_spec == v2.feature_spec
    assert manifest.action_mapping == ACTION_MAPPING
    assert manifest.tilt is None
    assert manifest.feature_normalization is None
    assert manifest.max_served_assets is None
    assert manifest.files == v2.files
    assert manifest.icm == v2.icm
    assert [(r.from_version, r.to_version) for r in manifest.migrations] == [(1, 2), (2, 3)]
    assert "from config.yaml" in manifest.migrations[-1].note
    assert {k: v for k, v in tree(run_dir).items() if k != MANIFEST_FILE} == files_before
    raw = json.loads((run_dir / MANIFEST_FILE).read_text())
    assert raw["schema_version"] == 3
    assert raw["policy"] == {"kind": "mlp", "hidden": None, "center_assets": False}


def test_an_exported_v2_version_upgrades_its_manifest_only(tmp_path):
    """An exported version has no config or model.zip: the defaults are what it was."""
    run_dir = copy_fixture(tmp_path, TD3)
    upgrade_run(run_dir, to_version=2)
    exported = tmp_path / "exported"
    exported.mkdir()
    (exported / "model.onnx").write_bytes(b"graph")
    raw = json.loads((run_dir / MANIFEST_FILE).read_text())
    raw["files"] = {"model.onnx": hashlib.sha256(b"graph").hexdigest()}
    raw["export"] = {"registry_name": "x", "registry_version": "1"}
    (exported / MANIFEST_FILE).write_text(json.dumps(raw))

    result = upgrade_run(exported)
    assert (result.from_version, result.to_version) == (2, 3)
    assert result.probe.observations == 0  # no model to probe: only the manifest changed
    manifest = read_manifest(exported)
    assert manifest.schema_version == 3
    assert manifest.policy.kind == "mlp"
    assert manifest.export == raw["export"]
    assert "defaults (flat MLP, return window, affine mapping)" in manifest.migrations[-1].note
    assert (exported / "model.onnx").read_bytes() == b"graph"
