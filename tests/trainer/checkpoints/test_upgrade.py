"""``allocator checkpoint migrate`` on the frozen version-1 runs in tests/fixtures/checkpoints:
version steps, backups, refusals and the command line (widening: test_widening.py).

Every test upgrades a copy in tmp_path; the fixtures themselves are never touched.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from allocator.artifacts.manifest import (
    MANIFEST_FILE,
    SCHEMA_VERSION,
    read_manifest,
    verify_checksums,
    write_manifest,
)
from allocator.cli import main
from allocator.trainer.checkpoints.errors import CheckpointUpgradeError
from allocator.trainer.checkpoints.upgrade import upgrade_run
from tests.trainer.checkpoints.runs import ALGO, FIXTURES, SAC, TD3, WIDTH, copy_fixture, tree

# --- version 1 -> current ---------------------------------------------------------------------


@pytest.mark.parametrize("name", [TD3, SAC])
def test_v1_fixture_migrates_to_current_with_identical_probe_actions(tmp_path, name):
    run_dir = copy_fixture(tmp_path, name)
    assert not (run_dir / MANIFEST_FILE).exists()
    result = upgrade_run(run_dir)
    assert (result.from_version, result.to_version) == (1, SCHEMA_VERSION)
    assert result.probe.observations == 64
    assert result.probe.float32_max_diff == 0.0
    manifest = read_manifest(run_dir)  # the current schema reads it
    verify_checksums(run_dir, manifest)
    assert manifest == result.manifest
    assert manifest.algorithm == ALGO[name]
    assert manifest.feature_spec.max_assets == WIDTH[name]
    assert manifest.feature_spec.window == 3
    assert manifest.widened_from is None
    assert manifest.data.universe == ["A0", "A1", "A2"]
    assert set(manifest.files) >= {"model.zip", "config.yaml", "normalization.json"}
    validation = json.loads((run_dir / "validation.json").read_text())
    assert manifest.metrics == validation["metrics"]
    stats = json.loads((run_dir / "normalization.json").read_text())
    assert manifest.normalization.model_dump() == stats
    assert manifest.library_versions["torch"].startswith("2.")
    assert manifest.created.startswith("2026-")  # when training ran (SB3's start_time)
    record, to_v3 = manifest.migrations
    assert (record.from_version, record.to_version) == (1, 2)
    assert (to_v3.from_version, to_v3.to_version) == (2, 3)
    assert str(result.backup) in record.note
    assert str(result.backup) in to_v3.note
    assert manifest.policy.kind == "mlp"  # what the config says: today's representation
    assert manifest.feature_spec.kind == "returns"
    assert manifest.action_mapping == "affine_renormalize_v1"
    assert manifest.tilt is None
    assert manifest.max_served_assets is None
    if name == SAC:
        assert manifest.icm is not None
        assert "icm.pt" in manifest.files
        assert "config data.assets" in record.note
    else:
        assert manifest.icm is None
        assert "market.csv" in record.note  # universe from the dataset beside the run


def test_backup_is_a_sibling_copy_of_the_original(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    result = upgrade_run(run_dir)
    assert result.backup.parent == run_dir.parent
    assert result.backup.name.startswith(f"{TD3}.bak-v1-")
    assert tree(result.backup) == tree(FIXTURES / TD3)
    assert set(tree(run_dir)) == set(tree(result.backup)) | {MANIFEST_FILE}


def test_migrating_a_current_directory_again_is_refused(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    upgrade_run(run_dir)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(
        CheckpointUpgradeError, match=f"already at schema version {SCHEMA_VERSION}; nothing to"
    ):
        upgrade_run(run_dir)
    assert sorted(tmp_path.iterdir()) == before  # no second backup, nothing changed


def test_a_failed_step_restores_the_directory(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    (run_dir / "market.csv").unlink()  # the universe must come from the dataset
    original = tree(run_dir)
    with pytest.raises(CheckpointUpgradeError, match=r"cannot be loaded.*restored"):
        upgrade_run(run_dir)
    assert tree(run_dir) == original
    [backup] = tmp_path.glob(f"{TD3}.bak-v1-*")
    assert tree(backup) == original


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"to_version": 9}, "unknown target schema version 9"),
        ({"to_version": 0}, "unknown target schema version 0"),
        ({"max_assets": 1}, "below the current max_assets 2"),
        ({"to_version": 1}, "already at schema version 1"),
        ({"to_version": 1, "max_assets": 3}, "widening needs the current schema"),
    ],
)
def test_bad_requests_are_refused_before_anything_changes(tmp_path, kwargs, message):
    run_dir = copy_fixture(tmp_path, TD3)
    with pytest.raises(CheckpointUpgradeError, match=message):
        upgrade_run(run_dir, **kwargs)
    assert [p.name for p in tmp_path.iterdir()] == [TD3]
    assert tree(run_dir) == tree(FIXTURES / TD3)


def test_missing_and_foreign_directories_are_refused(tmp_path):
    with pytest.raises(CheckpointUpgradeError, match="no such directory"):
        upgrade_run(tmp_path / "nope")
    with pytest.raises(CheckpointUpgradeError, match="not a run directory"):
        upgrade_run(tmp_path)


# --- command line -----------------------------------------------------------------------------


def test_cli_migrates_and_widens(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    runner = CliRunner()
    out = runner.invoke(main, ["checkpoint", "migrate", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert f"schema v1 -> v{SCHEMA_VERSION}" in out.output
    [backup] = tmp_path.glob(f"{TD3}.bak-v1-*")
    assert f"backup: {backup}" in out.output
    assert "max |action diff| 0" in out.output

    out = runner.invoke(main, ["checkpoint", "migrate", str(run_dir), "--max-assets", "3"])
    assert out.exit_code == 0, out.output
    assert "widened: max_assets 2 -> 3" in out.output
    assert "canonical float64 max |diff| actor 0, critics 0" in out.output
    assert "float32 predict max |diff|" in out.output
    inspect = runner.invoke(main, ["checkpoint", "inspect", str(run_dir)])
    assert inspect.exit_code == 0, inspect.output
    assert "widened from    2 assets" in inspect.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-assets", "1"], "below the current max_assets 2"),
        (["--to-version", "7"], "unknown target schema version 7"),
    ],
)
def test_cli_bad_input_exits_2(tmp_path, args, message):
    run_dir = copy_fixture(tmp_path, TD3)
    out = CliRunner().invoke(main, ["checkpoint", "migrate", str(run_dir), *args])
    assert out.exit_code == 2
    assert message in out.output


def test_cli_refuses_missing_and_current_directories(tmp_path):
    runner = CliRunner()
    out = runner.invoke(main, ["checkpoint", "migrate", str(tmp_path / "nope")])
    assert out.exit_code == 2
    assert "no such directory" in out.output
    run_dir = copy_fixture(tmp_path, SAC)
    assert runner.invoke(main, ["checkpoint", "migrate", str(run_dir)]).exit_code == 0
    out = runner.invoke(main, ["checkpoint", "migrate", str(run_dir)])
    assert out.exit_code == 2
    assert f"already at schema version {SCHEMA_VERSION}; nothing to migrate" in out.output


def test_exported_models_are_not_widened(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    manifest = upgrade_run(run_dir).manifest
    write_manifest(run_dir, manifest.model_copy(update={"export": {"registry_name": "x"}}))
    with pytest.raises(CheckpointUpgradeError, match="an exported model"):
        upgrade_run(run_dir, max_assets=3)
