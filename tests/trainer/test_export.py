"""ONNX export: graphs match torch and the numpy contract, and registry versions appear whole."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

from allocator.artifacts.manifest import (
    read_manifest,
    sha256_file,
    verify_checksums,
    write_manifest,
)
from allocator.cli import main
from allocator.portfolio import (
    FeatureSpec,
    NormalizationStats,
    action_to_weights,
    is_distribution,
    normalize_observation,
)
from allocator.trainer.export.run import (
    ICM_INPUTS,
    ICM_ONNX,
    MODEL_ONNX,
    POLICY_INPUTS,
    POLICY_OUTPUTS,
    ActionToWeights,
    ExportError,
    ObservationNormalizer,
    check_parity,
    export_graph,
    export_run,
    load_run,
    onnx_session,
    random_raw_observations,
    real_transitions,
)
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run import train
from tests.markets import random_walk_market, write_market

TOL = 1e-5
MAX_ASSETS = 4  # the market has 3 assets, so one slot is always masked on real data
TINY = [
    "data.train_start=2019-01-01",
    "data.train_end=2019-09-30",
    "data.validation_start=2019-10-01",
    "data.validation_end=2020-02-20",
    f"env.max_assets={MAX_ASSETS}",
    "env.window=10",
    "env.episode_length=60",
    "total_timesteps=300",
    "algorithm.learning_starts=100",
    "algorithm.batch_size=32",
    "algorithm.net_arch=[32,32]",
    "progress_bar=false",
    "tensorboard=false",
    "torch_threads=1",
]
SAC_ICM = [
    "algorithm.name=sac",
    "icm.enabled=true",
    "icm.warmup_steps=100",
    "icm.feature_dim=16",
    "icm.hidden_dim=32",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny TD3 run and a tiny SAC run with curiosity, trained once for the module."""
    root = tmp_path_factory.mktemp("export-runs")
    csv = write_market(
        random_walk_market(n_dates=300, n_assets=3, seed=1).to_frame(), root / "m.csv"
    )
    base = [f"data.dataset={csv}", f"output_dir={root}", *TINY]
    out = {}
    for algo, extra in (("td3", ["name=tiny-td3"]), ("sac", ["name=tiny-sac", *SAC_ICM])):
        out[algo] = train(load_config(None, base + extra), root / algo).run_dir
    return out


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("registry")


@pytest.fixture(scope="module")
def exported(runs: dict[str, Path], registry: Path) -> dict[str, Path]:
    """Version 1 of each run in the module's registry."""
    return {algo: export_run(run, registry) for algo, run in runs.items()}


def diffs(parity: dict) -> dict[str, float]:
    out = {}
    for key, value in parity.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in diffs(value).items()})
        elif key.startswith("max_abs_"):
            out[key] = value
    return out


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_export_matches_torch_on_random_and_real_observations(exported, algo):
    parity = read_manifest(exported[algo]).export["parity"]
    assert parity["random"]["n"] == 1000
    assert parity["real"]["n"] == 1000
    figures = diffs(parity)
    for key in ("random.max_abs_action_diff", "real.max_abs_weight_diff"):
        assert key in figures
    # Raw observations rebuilt from real price windows are what the environment showed.
    assert figures["real.max_abs_observation_diff"] <= 1e-6
    assert all(0.0 <= v <= TOL for v in figures.values()), figures
    if algo == "sac":
        assert figures["icm.random.max_abs_reward_diff"] <= TOL
        assert figures["icm.real.max_abs_reward_diff"] <= TOL
        assert parity["icm"]["real"]["n"] == 1000
    else:
        assert "icm" not in parity


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_exported_manifest_is_v2_with_onnx_checksums(exported, runs, algo):
    out = exported[algo]
    manifest = read_manifest(out)
    source = read_manifest(runs[algo])
    expected = {MODEL_ONNX, ICM_ONNX} if algo == "sac" else {MODEL_ONNX}
    assert manifest.schema_version == 2
    assert set(manifest.files) == expected
    assert {p.name for p in out.iterdir()} == {*expected, "manifest.json"}
    assert manifest.files[MODEL_ONNX] == sha256_file(out / MODEL_ONNX)
    verify_checksums(out, manifest)
    info = manifest.export
    assert info["opset"] >= 17
    assert info["registry_version"] == "1"
    assert info["source_run"] == str(runs[algo].resolve())
    assert info["source_files"] == source.files
    assert info["exported_at"]
    assert manifest.normalization == source.normalization
    assert manifest.feature_spec == source.feature_spec


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_graphs_pass_the_full_checker_with_a_dynamic_batch(exported, algo):
    paths = [exported[algo] / MODEL_ONNX] + ([exported[algo] / ICM_ONNX] if algo == "sac" else [])
    for path in paths:
        onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(exported[algo] / MODEL_ONNX))
    assert [i.name for i in model.graph.input] == list(POLICY_INPUTS)
    assert [o.name for o in model.graph.output] == list(POLICY_OUTPUTS)
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        assert dims[0].dim_param, f"{value.name}: batch axis is not dynamic"
    if algo == "sac":
        icm = onnx.load(str(exported[algo] / ICM_ONNX))
        assert [i.name for i in icm.graph.input] == list(ICM_INPUTS)
        assert [o.name for o in icm.graph.output] == ["intrinsic_reward"]


@pytest.mark.parametrize("algo", ["td3", "sac"])
@pytest.mark.parametrize("batch", [1, 7])
def test_onnx_weights_are_the_numpy_mapping_of_the_onnx_action(exported, runs, algo, batch):
    spec = load_run(runs[algo]).spec
    session = onnx_session(exported[algo] / MODEL_ONNX)
    rng = np.random.default_rng(batch)
    obs, mask = random_raw_observations(spec, batch, rng)
    mask[0, 1:] = 0.0  # only cash live
    obs, _ = random_raw_observations(spec, batch, rng, live=mask > 0)
    action, weights = session.run(None, {"observation": obs, "mask": mask})
    assert action.shape == weights.shape == (batch, spec.n_slots)
    np.testing.assert_allclose(weights, action_to_weights(action, mask), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(weights[0], np.eye(spec.n_slots, dtype=np.float32)[0])
    assert is_distribution(weights, mask > 0, atol=1e-6)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_graph_normalizes_raw_observations_itself(exported, runs, algo):
    loaded = load_run(runs[algo])
    session = onnx_session(exported[algo] / MODEL_ONNX)
    obs, mask = random_raw_observations(loaded.spec, 64, np.random.default_rng(3))
    (action,) = session.run(["action"], {"observation": obs, "mask": mask})
    actor = loaded.reference_actor()
    on_normalized = actor(normalize_observation(obs, loaded.spec, loaded.stats))
    np.testing.assert_allclose(action, on_normalized, rtol=0, atol=TOL)
    # Feeding the raw features straight to the actor would give another policy.
    assert np.max(np.abs(action - actor(obs))) > 1e-4


def test_curiosity_graph_normalizes_both_observations(exported, runs):
    loaded = load_run(runs["sac"])
    assert loaded.icm is not None
    session = onnx_session(exported["sac"] / ICM_ONNX)
    rng = np.random.default_rng(5)
    for batch in (1, 7):
        prev, mask = random_raw_observations(loaded.spec, batch, rng)
        cur, _ = random_raw_observations(loaded.spec, batch, rng, live=mask > 0)
        act = rng.uniform(-1, 1, size=(batch, loaded.spec.n_slots)).astype(np.float32)
        feeds = dict(zip(ICM_INPUTS, (prev, act, cur, mask), strict=True))
        (reward,) = session.run(None, feeds)
        with torch.no_grad():
            ref = loaded.icm.net(
                torch.as_tensor(normalize_observation(prev, loaded.spec, loaded.stats)),
                torch.as_tensor(act),
                torch.as_tensor(normalize_observation(cur, loaded.spec, loaded.stats)),
            ).numpy()
        assert reward.shape == (batch, 1)
        np.testing.assert_allclose(reward, ref, rtol=0, atol=TOL)


def test_mapping_graph_matches_numpy_on_degenerate_actions(tmp_path):
    n_slots = 4
    path = export_graph(
        ActionToWeights(n_slots),
        (torch.zeros(3, n_slots), torch.ones(3, n_slots)),
        ("action", "mask"),
        ("weights",),
        tmp_path / "mapping.onnx",
    )
    nan, inf = np.nan, np.inf
    action = np.array(
        [
            [0.2, -0.5, 0.9, 1.0],
            [-1.0, -1.0, -1.0, -1.0],  # nothing wanted -> cash
            [nan, nan, nan, nan],  # NaN is no preference -> cash
            [-inf, inf, 3.0, -7.0],  # saturation
            [-1.0, 0.5, nan, 0.5],
            [0.3, 0.9, 0.9, 0.9],  # only cash live
            [-1.0, 0.4, 0.2, -0.2],  # mask says cash masked: cash is live anyway
            [-1.0, -1.0, -1.0, 1.0],  # the only wanted slot is masked -> cash
        ],
        dtype=np.float32,
    )
    mask = np.array(
        [
            [1, 1, 1, 1],
            [1, 1, 1, 0],
            [1, 1, 1, 1],
            [1, 1, 1, 1],
            [1, 1, 0, 1],
            [1, 0, 0, 0],
            [0, 1, 1, 0],
            [1, 1, 1, 0],
        ],
        dtype=np.float32,
    )
    (weights,) = onnx_session(path).run(None, {"action": action, "mask": mask})
    np.testing.assert_allclose(weights, action_to_weights(action, mask), rtol=0, atol=1e-7)
    cash = np.eye(n_slots, dtype=np.float32)[0]
    for row in (1, 2, 5, 7):
        np.testing.assert_array_equal(weights[row], cash)
    assert is_distribution(weights, mask.astype(bool) | (np.arange(n_slots) == 0), atol=1e-6)


def test_normalizer_graph_is_bit_exact_with_normalize_observation(tmp_path):
    # An awkward clip and mean: the graph must carry them as float64, not float32 constants.
    spec = FeatureSpec(max_assets=5, window=8, clip=0.7)
    stats = NormalizationStats(mean=0.00031, std=0.0137)
    path = export_graph(
        ObservationNormalizer(spec, stats),
        (torch.zeros(3, spec.obs_size), torch.ones(3, spec.n_slots)),
        ("observation", "mask"),
        ("normalized",),
        tmp_path / "normalizer.onnx",
    )
    obs, mask = random_raw_observations(spec, 2000, np.random.default_rng(2))
    (out,) = onnx_session(path).run(None, {"observation": obs, "mask": mask})
    np.testing.assert_array_equal(out, normalize_observation(obs, spec, stats))


def test_random_parity_set_covers_cash_only_masks_and_clipped_features():
    spec = FeatureSpec(max_assets=5, window=8, clip=3.0)
    obs, mask = random_raw_observations(spec, 200, np.random.default_rng(0))
    assert obs.shape == (200, spec.obs_size)
    assert np.all(mask[:, 0] == 1.0)
    assert np.any(mask[:, 1:].sum(axis=1) == 0)
    assert is_distribution(obs[:, 40:46], mask > 0, atol=1e-6)
    normalized = normalize_observation(obs, spec, NormalizationStats(mean=0.0, std=0.01))
    assert np.any(np.abs(normalized[:, :40]) == 3.0)


def test_check_parity_names_every_difference_above_the_tolerance():
    check_parity({"random": {"max_abs_action_diff": 5e-6, "n": 10}}, tolerance=TOL)
    with pytest.raises(ExportError, match=r"real\.max_abs_action_diff = 2e-05"):
        check_parity(
            {
                "random": {"max_abs_action_diff": 1e-7},
                "real": {"max_abs_action_diff": 2e-5},
            },
            tolerance=TOL,
        )
    with pytest.raises(ExportError, match=r"icm\.real\.max_abs_reward_diff = nan"):
        check_parity({"icm": {"real": {"max_abs_reward_diff": float("nan")}}})


def test_failed_parity_writes_nothing_to_the_registry(runs, tmp_path):
    registry = tmp_path / "registry"
    # No float32 weight equals its float64 reference everywhere, so tolerance 0 must fail.
    with pytest.raises(ExportError, match="parity"):
        export_run(runs["td3"], registry, tolerance=0.0, n_parity=50)
    assert not registry.exists()


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
    assert (registry / "cli-model" / "1" / MODEL_ONNX).is_file()
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
    from allocator.serving import ModelLoadError, load_model

    loaded = load_run(runs[algo])
    model = load_model(exported[algo], prefer_cuda=False)
    assert model.provider == "CPUExecutionProvider"
    real = real_transitions(loaded, 64)
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
