"""Tracked batch jobs against a real MLflow server: a walk-forward is a parent run with one
child per window, each window's export a registered version, a promotion the alias."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from allocator.artifacts.manifest import read_manifest
from allocator.registry.pointer import read_production_pointer
from allocator.trainer.jobs.retrain.config import load_retrain_config
from allocator.trainer.jobs.retrain.runner import retrain
from allocator.trainer.jobs.tuning.runner import run_tuning
from allocator.trainer.jobs.walk_forward.rundir import WalkForwardResult
from allocator.trainer.jobs.walk_forward.runner import run_walk_forward
from allocator.trainer.training.tracked_models import PRODUCTION_ALIAS, VERSION_TAG
from allocator.trainer.training.tracking import PARENT_TAG, read_tracking
from tests.trainer.jobs.helpers import CONFIGS, migrated_sqlite, tiny
from tests.trainer.jobs.test_tuning import tune_config, write_prices


def tracked(uri: str, experiment: str, prefix: str = "") -> list[str]:
    return [
        f"{prefix}tracking.backend=mlflow",
        f"{prefix}tracking.uri={uri}",
        f"{prefix}tracking.experiment={experiment}",
    ]


@pytest.fixture(scope="module")
def walk_forward(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> WalkForwardResult:
    """The tiny walk-forward (two windows), tracked, with one baseline to keep it short."""
    tmp = tmp_path_factory.mktemp("tracked-walk-forward")
    settings = [
        *tracked(mlflow_uri, "walk-forward-tests", "trainer."),
        "baselines=[equal-weight]",
        f"database_url={migrated_sqlite(tmp)}",
    ]
    return run_walk_forward(tiny(tmp, *settings), progress=False)


def test_a_walk_forward_is_a_parent_run_with_one_child_per_window(
    walk_forward: WalkForwardResult, mlflow_uri: str
) -> None:
    client = MlflowClient(mlflow_uri)
    record = read_tracking(walk_forward.out_dir)
    assert record is not None
    parent = client.get_run(record["run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.info.run_name == f"wf_tiny-{walk_forward.label}"
    assert parent.data.params["windows.freq"] == "QS"
    assert any(key.startswith("summary/") for key in parent.data.metrics)
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'"
    )
    by_name = {c.info.run_name: c for c in children}
    windows = walk_forward.windows
    assert len(windows) == 2
    assert set(by_name) == {Path(w.run_dir).name for w in windows}
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.params["tracking.parent_run_id"] == parent.info.run_id
        assert "validation/td3/sharpe" in child.data.metrics


def test_each_window_export_is_a_registered_version_of_its_run(
    walk_forward: WalkForwardResult, mlflow_uri: str
) -> None:
    client = MlflowClient(mlflow_uri)
    versions = client.search_model_versions("name = 'allocator-wf-tiny'")
    assert len(versions) == len(walk_forward.windows)
    by_tag = {v.tags[VERSION_TAG]: v for v in versions}
    for window in walk_forward.windows:
        record = read_tracking(Path(window.run_dir))
        assert record is not None
        mirrored = by_tag[window.version]
        assert mirrored.run_id == record["run_id"]
        manifest = read_manifest(window.version_dir)
        assert manifest.export is not None
        assert manifest.export["mlflow_run_id"] == record["run_id"]
        files = {Path(f.path).name for f in client.list_artifacts(record["run_id"], "registry")}
        assert files == {window.version}


def test_a_study_is_a_parent_run_with_one_child_per_trial(tmp_path: Path, mlflow_uri: str) -> None:
    prices = write_prices(tmp_path / "prices.csv", garbage_after_training=False)
    config = tune_config(tmp_path, prices, *tracked(mlflow_uri, "tuning-tests", "trainer."))
    config = config.model_copy(update={"n_trials": 2})
    result = run_tuning(config, progress=False)
    record = read_tracking(result.out_dir)
    assert record is not None
    client = MlflowClient(mlflow_uri)
    parent = client.get_run(record["run_id"])
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'"
    )
    assert sorted(c.info.run_name for c in children) == ["trial-0000", "trial-0001"]
    for child in children:
        assert child.info.status == "FINISHED"
        metrics = child.data.metrics
        assert metrics["selection/evaluations"] >= 1
        assert "selection/chosen_step" in metrics
        assert "train/critic_loss" in metrics
        files = {Path(f.path).name for f in client.list_artifacts(child.info.run_id)}
        assert "selection.json" in files


def test_a_retrain_promotion_moves_the_production_alias(tmp_path: Path, mlflow_uri: str) -> None:
    """No pointer yet and loose gates: the candidate is promoted, and MLflow says so."""
    url = migrated_sqlite(tmp_path)
    config = load_retrain_config(
        CONFIGS / "retrain_tiny.yaml",
        [
            f"registry={tmp_path / 'models'}",
            f"database_url={url}",
            f"trainer.output_dir={tmp_path / 'runs'}",
            *tracked(mlflow_uri, "retrain-tests", "trainer."),
            "trainer.tracking.registered_model=retrain-tiny",
        ],
    )
    lines: list[str] = []
    decision = retrain(config, echo=lines.append)
    assert decision.promoted
    pointer = read_production_pointer(tmp_path / "models", "tiny")
    assert pointer is not None
    client = MlflowClient(mlflow_uri)
    production = client.get_model_version_by_alias("retrain-tiny", PRODUCTION_ALIAS)
    assert production.tags[VERSION_TAG] == pointer["version"] == decision.candidate_version
    manifest = read_manifest(tmp_path / "models" / "tiny" / pointer["version"])
    assert manifest.export is not None
    assert production.run_id == manifest.export["mlflow_run_id"]
    assert any(f"on version {production.version}" in line for line in lines)
