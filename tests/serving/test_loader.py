"""The model loader: verified exported models load and run; everything else is refused.

Model directories are built here with ``onnx.helper`` (see ``tests.serving``), shaped like the
exporter's output; no GPU is assumed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import allocator.artifacts.manifest as manifest_module
from allocator.artifacts.manifest import MANIFEST_FILE, checksums, read_manifest, write_manifest
from allocator.portfolio import FeatureSpec, build_raw_observation
from allocator.registry.errors import ModelLoadError, ModelNotFoundError
from allocator.serving import LoadedModel, load_model
from allocator.serving import loader as loader_module
from allocator.serving.catalog import ModelCatalog
from tests.registry import build_registry
from tests.serving import (
    Spec,
    make_manifest,
    policy_model,
    policy_weights,
    reference_policy,
    write_exported_model,
)

SPEC = Spec(max_assets=3, window=4)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return write_exported_model(tmp_path / "registry" / "alpha" / "1", SPEC, icm=True)


def raw_batch(spec: Spec, batch: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Raw observations from the shared contract (``build_raw_observation``) and masks."""
    rng = np.random.default_rng(seed)
    fs = FeatureSpec(max_assets=spec.max_assets, window=spec.window)
    prices = 100 * np.exp(
        np.cumsum(rng.normal(0, 0.01, (batch, spec.max_assets, spec.window + 1)), -1)
    )
    mask = np.ones((batch, spec.n_slots), np.float32)
    mask[:, -1] = rng.integers(0, 2, batch)  # last asset slot sometimes masked
    weights = np.full((batch, spec.n_slots), 1.0 / spec.n_slots, np.float32)
    return build_raw_observation(prices, weights, mask, fs), mask


# --- loading and running ------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 5])
def test_loads_and_runs_a_batch(model_dir: Path, batch: int) -> None:
    model = load_model(model_dir, prefer_cuda=False)
    assert isinstance(model, LoadedModel)
    assert (model.name, model.version) == ("alpha", "1")
    assert model.obs_dim == SPEC.obs_dim == 3 * 4 + 2 * 4
    obs, mask = raw_batch(SPEC, batch)
    action, weights = model.run(obs, mask)
    assert action.shape == weights.shape == (batch, SPEC.n_slots)
    assert action.dtype == weights.dtype == np.float32
    want_action, want_weights = reference_policy(policy_weights(SPEC), obs, mask)
    np.testing.assert_allclose(action, want_action, atol=1e-5)
    np.testing.assert_allclose(weights, want_weights, atol=1e-5)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)
    assert np.all(weights[mask == 0] == 0)


def test_provider_is_reported_and_logged(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="allocator.serving"):
        cpu = load_model(model_dir, prefer_cuda=False)
    assert cpu.provider == "CPUExecutionProvider"
    assert cpu.provider == cpu.session.get_providers()[0]
    assert any("CPUExecutionProvider" in r.getMessage() for r in caplog.records)

    preferred = load_model(model_dir)  # CUDA when really usable; no GPU assumed
    assert preferred.provider == preferred.session.get_providers()[0]
    assert preferred.provider in {"CUDAExecutionProvider", "CPUExecutionProvider"}


def test_cuda_listed_but_unusable_falls_back_to_cpu(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CUDA that looked usable but fails to start a session means CPU."""
    real = ort.InferenceSession
    attempts: list[list[str]] = []

    def session(
        data: bytes, options: ort.SessionOptions, providers: list[str]
    ) -> ort.InferenceSession:
        attempts.append(list(providers))
        if "CUDAExecutionProvider" in providers:
            raise RuntimeError("CUDA failure 100: no CUDA-capable device is detected")
        return real(data, options, providers=providers)

    monkeypatch.setattr(loader_module, "cuda_usable", lambda: True)
    monkeypatch.setattr(loader_module.ort, "InferenceSession", session)
    with caplog.at_level(logging.WARNING, logger="allocator.serving"):
        model = load_model(model_dir)
    assert model.provider == "CPUExecutionProvider"
    assert attempts[0][0] == "CUDAExecutionProvider"
    assert attempts[1] == ["CPUExecutionProvider"]
    assert any("retrying on CPU" in r.getMessage() for r in caplog.records)


def test_cuda_not_tried_when_not_preferred(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ort.InferenceSession
    seen: list[list[str]] = []

    def session(
        data: bytes, options: ort.SessionOptions, providers: list[str]
    ) -> ort.InferenceSession:
        seen.append(list(providers))
        return real(data, options, providers=providers)

    monkeypatch.setattr(loader_module.ort, "InferenceSession", session)
    load_model(model_dir, prefer_cuda=False)
    assert seen
    assert all(p == ["CPUExecutionProvider"] for p in seen)


def test_sessions_run_on_the_calling_thread_and_do_not_spin(model_dir: Path) -> None:
    """A pool thread per run costs a wake-up per call, and a spinning one a core at light
    load: every session runs on its caller's thread, with idle pool threads asleep."""
    model = load_model(model_dir, prefer_cuda=False)
    assert model.icm_session is not None
    for session in (model.session, model.icm_session):
        options = session.get_session_options()
        assert options.intra_op_num_threads == 1
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"


def test_intrinsic_reward(model_dir: Path) -> None:
    model = load_model(model_dir, prefer_cuda=False)
    assert model.icm_session is not None
    prev, mask = raw_batch(SPEC, 4, seed=2)
    obs, _ = raw_batch(SPEC, 4, seed=3)
    action, _ = model.run(obs, mask)
    reward = model.intrinsic_reward(prev, action, obs, mask)
    assert reward.shape == (4,)
    want = 0.5 * ((obs.astype(np.float64) - prev) ** 2).sum(axis=1)
    np.testing.assert_allclose(reward, want, rtol=1e-5)


def test_model_without_icm(tmp_path: Path) -> None:
    d = write_exported_model(tmp_path / "m" / "1", SPEC)
    model = load_model(d, prefer_cuda=False)
    assert model.icm_session is None
    obs, mask = raw_batch(SPEC, 2)
    with pytest.raises(ModelLoadError, match=r"icm\.onnx: this model was exported without an ICM"):
        model.intrinsic_reward(obs, mask, obs, mask)


def test_run_rejects_wrong_shapes(model_dir: Path) -> None:
    model = load_model(model_dir, prefer_cuda=False)
    obs, mask = raw_batch(SPEC, 3)
    with pytest.raises(ValueError, match=r"raw_observations must have shape \(batch, 20\)"):
        model.run(obs[:, :-1], mask)
    with pytest.raises(ValueError, match="masks"):
        model.run(obs, mask[:, :-1])
    with pytest.raises(ValueError, match="batch sizes"):
        model.run(obs, mask[:2])
    with pytest.raises(ValueError, match="shape"):
        model.run(obs[0], mask[0])  # a single row must still be a batch


# --- refusals: integrity ------------------------------------------------------------------------


def test_truncated_model_refused_naming_the_file(model_dir: Path) -> None:
    path = model_dir / "model.onnx"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"model\.onnx.*(altered or truncated)") as info:
        load_model(model_dir, prefer_cuda=False)
    assert str(path) in str(info.value)


def test_altered_byte_refused_naming_the_file(model_dir: Path) -> None:
    path = model_dir / "model.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="sha256") as info:
        load_model(model_dir, prefer_cuda=False)
    assert str(path) in str(info.value)


def test_altered_icm_refused_naming_the_file(model_dir: Path) -> None:
    path = model_dir / "icm.onnx"
    path.write_bytes(path.read_bytes() + b"\x00")
    with pytest.raises(ModelLoadError, match=r"icm\.onnx.*sha256"):
        load_model(model_dir, prefer_cuda=False)


def test_corrupt_model_with_matching_checksum_is_an_onnxruntime_refusal(model_dir: Path) -> None:
    """Checksums only prove the file is what was exported; onnxruntime errors are wrapped too."""
    path = model_dir / "model.onnx"
    path.write_bytes(path.read_bytes()[:100])
    m = read_manifest(model_dir)
    write_manifest(model_dir, m.model_copy(update={"files": checksums(model_dir, list(m.files))}))
    with pytest.raises(ModelLoadError, match="onnxruntime cannot load it") as info:
        load_model(model_dir, prefer_cuda=False)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["model.onnx", "icm.onnx"])
def test_missing_listed_file_refused(model_dir: Path, name: str) -> None:
    (model_dir / name).unlink()
    with pytest.raises(ModelLoadError, match=rf"{name}: listed in manifest.json but missing"):
        load_model(model_dir, prefer_cuda=False)


def test_unlisted_icm_refused(tmp_path: Path) -> None:
    d = write_exported_model(tmp_path / "m" / "1", SPEC)
    (d / "icm.onnx").write_bytes((d / "model.onnx").read_bytes())
    with pytest.raises(ModelLoadError, match=r"icm\.onnx: present but not listed"):
        load_model(d, prefer_cuda=False)


def test_newer_ir_version_refused_naming_the_file(tmp_path: Path) -> None:
    """onnx 1.23's default IR 14 is beyond onnxruntime 1.31: a clear refusal, not a crash."""
    d = write_exported_model(tmp_path / "m" / "1", SPEC, model=policy_model(SPEC, ir_version=14))
    with pytest.raises(ModelLoadError, match=r"model\.onnx: onnxruntime cannot load it.*IR"):
        load_model(d, prefer_cuda=False)


# --- refusals: manifest ------------------------------------------------------------------------


def test_missing_manifest_refused_with_migrate_hint(model_dir: Path) -> None:
    (model_dir / MANIFEST_FILE).unlink()
    with pytest.raises(ModelLoadError, match="migrate") as info:
        load_model(model_dir, prefer_cuda=False)
    assert MANIFEST_FILE in str(info.value)


def test_schema_version_1_refused_with_migrate_hint(model_dir: Path) -> None:
    path = model_dir / MANIFEST_FILE
    raw = json.loads(path.read_text())
    raw["schema_version"] = 1
    path.write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match=r"schema version 1.*migrate") as info:
        load_model(model_dir, prefer_cuda=False)
    assert str(path) in str(info.value)


def test_invalid_manifest_refused(model_dir: Path) -> None:
    path = model_dir / MANIFEST_FILE
    path.write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"manifest\.json: not valid JSON"):
        load_model(model_dir, prefer_cuda=False)


def test_file_entry_outside_the_directory_refused(model_dir: Path) -> None:
    m = read_manifest(model_dir)
    write_manifest(model_dir, m.model_copy(update={"files": {**m.files, "../x.onnx": "0" * 64}}))
    with pytest.raises(ModelLoadError, match="not a plain file name"):
        load_model(model_dir, prefer_cuda=False)


# --- refusals: not an exported model ------------------------------------------------------------


def test_training_run_with_only_model_zip_refused_unopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "runs" / "r1"
    d.mkdir(parents=True)
    (d / "model.zip").write_bytes(b"PK\x03\x04 not to be opened")
    write_manifest(d, make_manifest(SPEC, checksums(d, ["model.zip"])))
    hashed: list[str] = []
    real = manifest_module.sha256_file
    monkeypatch.setattr(manifest_module, "sha256_file", lambda p: hashed.append(str(p)) or real(p))
    with pytest.raises(ModelLoadError, match="not an exported model") as info:
        load_model(d, prefer_cuda=False)
    assert "model.onnx" in str(info.value)
    assert "model.zip" in str(info.value)
    assert hashed == []


@pytest.mark.parametrize("name", ["model.zip", "policy.pt", "stats.pkl"])
def test_pickle_files_refused(model_dir: Path, name: str) -> None:
    (model_dir / name).write_bytes(b"\x80\x04 not to be opened")
    with pytest.raises(ModelLoadError, match="pickle-type file") as info:
        load_model(model_dir, prefer_cuda=False)
    assert name in str(info.value)


def test_listed_non_onnx_file_refused(model_dir: Path) -> None:
    (model_dir / "icm.pt").write_bytes(b"x")
    m = read_manifest(model_dir)
    write_manifest(
        model_dir, m.model_copy(update={"files": {**m.files, **checksums(model_dir, ["icm.pt"])}})
    )
    with pytest.raises(ModelLoadError, match=r"icm\.pt: not an exported model file"):
        load_model(model_dir, prefer_cuda=False)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such model directory"):
        load_model(tmp_path / "absent", prefer_cuda=False)


# --- refusals: graph signature ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_kwargs", "message"),
    [
        ({"input_names": ("obs", "mask")}, r"graph inputs \['mask', 'obs'\]"),
        ({"obs_dim": SPEC.obs_dim + 1}, r"input 'observation' has shape \['batch', 21\]"),
        ({"batch": 1}, "fixed batch 1"),
    ],
)
def test_wrong_signature_refused(tmp_path: Path, model_kwargs: dict, message: str) -> None:
    d = write_exported_model(tmp_path / "m" / "1", SPEC, model=policy_model(SPEC, **model_kwargs))
    with pytest.raises(ModelLoadError, match=message) as info:
        load_model(d, prefer_cuda=False)
    assert str(d / "model.onnx") in str(info.value)


def test_graph_for_another_feature_spec_refused(tmp_path: Path) -> None:
    """A graph exported for window 5 under a manifest saying window 4: obs_dim disagrees."""
    other = Spec(max_assets=SPEC.max_assets, window=5)
    d = write_exported_model(tmp_path / "m" / "1", SPEC, model=policy_model(other))
    with pytest.raises(ModelLoadError, match=r"feature spec needs \[batch, 20\]"):
        load_model(d, prefer_cuda=False)


def test_graph_for_more_assets_refused(tmp_path: Path) -> None:
    other = Spec(max_assets=4, window=SPEC.window)
    d = write_exported_model(tmp_path / "m" / "1", SPEC, model=policy_model(other))
    with pytest.raises(ModelLoadError, match=r"model\.onnx: input"):
        load_model(d, prefer_cuda=False)


# --- loading from a registry --------------------------------------------------------------------


def test_load_from_registry(tmp_path: Path) -> None:
    registry = build_registry(tmp_path / "registry", SPEC)
    catalog = ModelCatalog(registry, prefer_cuda=False)
    catalog.refresh()
    model = catalog.snapshot.resolve("alpha")
    assert (model.name, model.version) == ("alpha", "10")
    obs, mask = raw_batch(SPEC, 2)
    _, weights = model.run(obs, mask)
    np.testing.assert_allclose(
        weights, reference_policy(policy_weights(SPEC, 10), obs, mask)[1], atol=1e-5
    )
