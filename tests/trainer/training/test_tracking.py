"""A tracked training run, read back from a real MLflow server through ``MlflowClient``."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from allocator.trainer.training.checkpointing import TrainingStoppedError
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run import TrainingRun, resume, train
from allocator.trainer.training.tracking import TRACKING_FILE, read_tracking
from tests.trainer.tiny import TINY_TRAINING
from tests.trainer.training.test_resume import AskToStopAt

TINY = [
    "data.assets=[AAPL,MSFT,JPM,XOM]",
    "data.train_start=2017-01-01",
    "data.train_end=2017-12-31",
    "data.validation_start=2018-01-01",
    "data.validation_end=2018-03-31",
    "env.max_assets=4",
    *TINY_TRAINING,
]


@dataclass
class Tracked:
    run: TrainingRun
    run_id: str
    client: MlflowClient


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> Tracked:
    """A tiny run tracked with no ``tracking.uri``: the server comes from the environment."""
    root = tmp_path_factory.mktemp("tracked")
    settings = [
        *TINY,
        f"output_dir={root}",
        "tracking.backend=mlflow",
        "tracking.experiment=tracking-tests",
    ]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
        run = train(load_config(None, settings), root / "run")
    record = read_tracking(run.run_dir)
    assert record is not None
    assert record["tracking_uri"] == mlflow_uri
    return Tracked(run, record["run_id"], MlflowClient(mlflow_uri))


def test_tracking_is_off_by_default() -> None:
    config = load_config(None, [])
    assert config.tracking.backend == "none"
    assert not config.tracking.enabled


def test_the_run_is_finished_in_its_experiment_with_the_flattened_config(
    tracked: Tracked,
) -> None:
    run = tracked.client.get_run(tracked.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == tracked.run.run_dir.name
    experiment = tracked.client.get_experiment(run.info.experiment_id)
    assert experiment.name == "tracking-tests"
    params = run.data.params
    assert params["algorithm.batch_size"] == "32"
    assert params["env.max_assets"] == "4"
    assert params["data.assets"] == str(["AAPL", "MSFT", "JPM", "XOM"])
    assert params["total_timesteps"] == "300"


def test_every_progress_csv_curve_is_a_metric_history_by_step(tracked: Tracked) -> None:
    progress = pd.read_csv(tracked.run.run_dir / "progress.csv")
    steps = progress["time/total_timesteps"]
    curves = [c for c in progress.columns if pd.api.types.is_numeric_dtype(progress[c])]
    assert {"train/actor_loss", "train/critic_loss"} <= set(curves)
    for column in curves:
        logged = progress[column].notna()
        history = sorted(
            (m.step, m.value) for m in tracked.client.get_metric_history(tracked.run_id, column)
        )
        assert [s for s, _ in history] == steps[logged].astype(int).tolist(), column
        assert [v for _, v in history] == pytest.approx(progress[column][logged].tolist()), column


def test_validation_and_audits_are_metrics(tracked: Tracked) -> None:
    metrics = tracked.client.get_run(tracked.run_id).data.metrics
    summary = tracked.run.summary
    sharpe = summary["validation"]["td3"]["sharpe"]
    assert metrics["validation/td3/sharpe"] == pytest.approx(sharpe)
    audit = json.loads((tracked.run.run_dir / "action_saturation.json").read_text())
    numbers = {k: v for k, v in audit.items() if isinstance(v, int | float)}
    assert numbers, "the audit has top-level figures"
    for key, value in numbers.items():
        assert metrics[f"action_saturation/{key}"] == pytest.approx(float(value))
    assert metrics["run/train_seconds"] == pytest.approx(summary["train_seconds"])


def test_records_plots_and_the_model_are_artifacts(tracked: Tracked, tmp_path: Path) -> None:
    client = tracked.client
    root = {Path(f.path).name for f in client.list_artifacts(tracked.run_id)}
    assert {"run.json", "validation.json", "validation.png", "progress.csv"} <= root
    assert {"action_saturation.json", "training_curves.png"} <= root
    assert TRACKING_FILE not in root
    model = {Path(f.path).name for f in client.list_artifacts(tracked.run_id, "model")}
    assert {"model.zip", "manifest.json", "normalization.json", "config.yaml"} <= model
    local = Path(client.download_artifacts(tracked.run_id, "model/manifest.json", str(tmp_path)))
    assert local.read_bytes() == (tracked.run.run_dir / "manifest.json").read_bytes()


def test_a_stopped_run_is_killed_and_its_resume_finishes_the_same_mlflow_run(
    tmp_path: Path, mlflow_uri: str
) -> None:
    settings = [*TINY, f"output_dir={tmp_path}", "tracking.backend=mlflow"]
    config = load_config(None, [*settings, f"tracking.uri={mlflow_uri}"])
    run_dir, stop = tmp_path / "run", threading.Event()
    with pytest.raises(TrainingStoppedError):
        train(config, run_dir, callbacks=[AskToStopAt(stop, 150)], stop=stop)
    record = read_tracking(run_dir)
    assert record is not None
    client = MlflowClient(mlflow_uri)
    assert client.get_run(record["run_id"]).info.status == "KILLED"

    resume(run_dir)
    assert read_tracking(run_dir) == record
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(record["run_id"], "train/critic_loss")
    progress = pd.read_csv(run_dir / "progress.csv").dropna(subset=["train/critic_loss"])
    logged = progress["time/total_timesteps"].astype(int).tolist()
    assert sorted(m.step for m in history) == logged  # both sessions, each step once
    assert min(logged) <= 150 < max(logged)
