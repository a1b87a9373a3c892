"""``export_run``: manifests, atomic never-overwritten versions, refusals, the CLI, and the
serving loader running what was exported."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from allocator.artifacts.manifest import (
    SCHEMA_VERSION,
    read_manifest,
    sha256_file,
    verify_checksums,
    write_manifest,
)
from allocator.cli import main
from allocator.portfolio import (
    action_to_weights,
    normalize_observation,
)
from allocator.registry.errors import ModelLoadError
from allocator.registry.layout import (
    ICM_FILE,
    MODEL_FILE,
)
from allocator.serving import load_model
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.loaded_run import load_run
from allocator.trainer.export.parity import rollout
from allocator.trainer.export.run import export_run
from tests.trainer.export import MAX_ASSETS, TOL


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_exported_manifest_is_current_with_onnx_checksums(exported, runs, algo):
    out = exported[algo]
    manifest = read_manifest(out)
    source = read_manifest(runs[algo])
    expected = {MODEL_FILE, ICM_FILE} if algo == "sac" else {MODEL_FILE}
    assert manifest.schema_version == SCHEMA_VERSION
    assert manifest.policy.kind == "mlp"
    assert manifest.max_served_assets is None
    assert manifest.export["action_mapping_in_graph"] is True
    assert set(manifest.files) == expected
    assert {p.name for p in out.iterdir()} == {*expected, "manifest.json"}
    assert manifest.files[MODEL_FILE] == sha256_file(out / MODEL_FILE)
    verify_checksums(out, manifest)
    info = manifest.export
    assert info["opset"] >= 17
    assert info["registry_version"] == "1"
    assert info["source_run"] == str(runs[algo].resolve())
    assert info["source_files"] == source.files
    assert info["exported_at"]
    assert manifest.normalization == source.normalization
    assert manifest.feature_spec == source.feature_spec


def test_versions_appear_atomically_and_are_never_overwritten(exported, runs, registry):
    model_dir = registry / "tiny-td3"
    second = export_run(runs["td3"], registry, n_parity=50)
    assert second == model_dir / "2"
    assert read_manifest(second).export["registry_version"] == "2"
    with pytest.raises(ExportError, match="already exists"):
        export_run(runs["td3"], registry, version="1")
    assert sorted(p.name for p in model_dir.iterdir()) == ["1", "2"]  # no staging left
    assert sorted(p.name for p in (registry / "tiny-sac").iterdir()) == ["1"]
    with pytest.raises(ExportError, match="version"):
        export_run(runs["td3"], registry, version="../escape")


def test_altered_runs_are_refused(runs, tmp_path):
    run = shutil.copytree(runs["td3"], tmp_path / "run")
    manifest = read_manifest(run)
    bumped = manifest.normalization.model_copy(update={"std": manifest.normalization.std * 2})
    write_manifest(run, manifest.model_copy(update={"normalization": bumped}))
    with pytest.raises(ExportError, match=r"normalization\.json"):
        export_run(run, tmp_path / "registry")
    write_manifest(run, manifest)
    with (run / "model.zip").open("ab") as f:
        f.write(b"tampered")
    with pytest.raises(ExportError, match="sha256"):
        export_run(run, tmp_path / "registry")
    assert not (tmp_path / "registry").exists()


def test_cli_export_prints_the_parity(runs, tmp_path):
    registry = tmp_path / "models"
    res = CliRunner().invoke(
        main, ["export", str(runs["sac"]), "--registry", str(registry), "--name", "cli-model"]
    )
    assert res.exit_code == 0, res.output
    assert "max_abs_action_diff" in res.output
    assert "max_abs_reward_diff" in res.output
    assert (registry / "cli-model" / "1" / MODEL_FILE).is_file()
    assert read_manifest(registry / "cli-model" / "1").name == "cli-model"


def test_cli_export_of_a_bad_run_dir_exits_2(tmp_path):
    registry = str(tmp_path / "models")
    res = CliRunner().invoke(main, ["export", str(tmp_path / "nope"), "--registry", registry])
    assert res.exit_code == 2
    assert "not a run directory" in res.output
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(main, ["export", str(tmp_path / "empty"), "--registry", registry])
    assert res.exit_code == 2
    assert "no manifest.json" in res.output
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_serving_loader_runs_the_exported_model_like_torch(exported, runs, algo, tmp_path):
    """The server's loader (no torch) gives the torch policy's weights on real inputs."""
    loaded = load_run(runs[algo])
    model = load_model(exported[algo], prefer_cuda=False)
    assert model.provider == "CPUExecutionProvider"
    real = rollout(loaded, 64)
    raw = real.observations
    masks = raw[:, -(MAX_ASSETS + 1) :]
    action, weights = model.run(raw, masks)
    with torch.no_grad():
        expected = loaded.model.actor(
            torch.as_tensor(normalize_observation(raw, loaded.spec, loaded.stats))
        ).numpy()
    if algo == "td3":  # SAC's SB3 actor samples unless asked; compare weights via the mapping
        np.testing.assert_allclose(action, expected, atol=TOL)
    np.testing.assert_allclose(weights, action_to_weights(action, masks > 0.5), atol=1e-6)
    if algo == "sac":
        assert model.icm_session is not None

    # A truncated copy of the exported model is refused, naming the file.
    broken = tmp_path / "broken"
    shutil.copytree(exported[algo], broken)
    data = (broken / "model.onnx").read_bytes()
    (broken / "model.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"model\.onnx"):
        load_model(broken, prefer_cuda=False)
