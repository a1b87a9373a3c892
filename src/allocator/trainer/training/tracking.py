"""A training run's copy in MLflow (the run directory stays the record; ``tracking.json`` names
the MLflow run a resume continues), through an ``MlflowClient`` with an explicit run id, never
MLflow's global active run, so runs side by side in one process never log into each other."""

from __future__ import annotations

import json
import numbers
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stable_baselines3.common.logger import KVWriter

from allocator.artifacts.manifest import MANIFEST_FILE
from allocator.trainer import require_extra
from allocator.trainer.training.audit import SATURATION_FILE
from allocator.trainer.training.checkpointing import TrainingStoppedError
from allocator.trainer.training.config import TrackingSettings
from allocator.trainer.training.run_dir import CHECKPOINT_FILES
from allocator.typed_config import flatten

TRACKING_FILE = "tracking.json"
"""In a tracked run's directory: the MLflow run id, experiment id and tracking URI."""

PARENT_TAG = "mlflow.parentRunId"
"""The tag by which MLflow's UI nests a run under another (walk-forward windows, trials)."""

BATCH = 100
"""Metrics or parameters per ``log_batch`` request (MLflow accepts at most 100 parameters)."""

MAX_PARAM = 6000
"""MLflow's longest parameter value; longer values (long asset lists) are cut."""

RECORD_SUFFIXES = frozenset({".json", ".yaml", ".csv", ".png"})
"""The run directory's records and plots, logged as artifacts at the root."""

MODEL_ARTIFACTS = "model"
"""Artifact folder of the checkpoint: the files export reads and the manifest of their sums."""

MODEL_FILES = frozenset({*CHECKPOINT_FILES, MANIFEST_FILE})


def require_mlflow(needed_for: str = "tracking.backend: mlflow") -> None:
    """A ``MissingExtraError`` naming the ``mlflow`` extra when MLflow is not installed."""
    require_extra("mlflow", "mlflow", needed_for)


def mlflow_client(settings: TrackingSettings) -> Any:
    """An ``MlflowClient`` on the configured URI; a clear error when the extra is missing."""
    require_mlflow()
    # the optional extra is there (checked just above); import its client class only now
    from mlflow.tracking import MlflowClient

    # the configured URI, else $MLFLOW_TRACKING_URI, else None (MLflow's own default)
    return MlflowClient(tracking_uri=settings.uri or os.environ.get("MLFLOW_TRACKING_URI") or None)


def mlflow_key(key: str) -> str:
    """``key`` with the characters MLflow refuses in a metric or parameter name replaced."""
    return re.sub(r"[^\w./\- ]", "_", key)


def scalar_metrics(tree: Any, prefix: str) -> dict[str, float]:
    """The finite numbers of a JSON-like tree, by dotted key under ``prefix`` (booleans: 0/1)."""
    out: dict[str, float] = {}
    for key, value in flatten(tree, prefix).items():
        if isinstance(value, bool | int | float) and abs(float(value)) < float("inf"):
            out[key.replace(".", "/")] = float(value)
    return out


class MLflowOutputFormat(KVWriter):
    """SB3 logger output that sends each dump's numbers to an MLflow run, at the dump's step."""

    def __init__(self, run: TrackedRun) -> None:
        self.run = run

    def write(
        self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0
    ) -> None:
        figures = {
            key: float(value)
            for key, value in key_values.items()
            if "mlflow" not in (key_excluded.get(key) or ())
            and isinstance(value, numbers.Real)  # numpy scalars too
            and not isinstance(value, bool)
        }
        self.run.log_metrics(figures, step)

    def close(self) -> None:
        """Nothing to close: the run ends with the training session, not with the logger."""


class TrackedRun:
    """One MLflow run, written to through ``client`` by its id."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id

    @classmethod
    def start(cls, settings: TrackingSettings, run_dir: Path, run_name: str) -> TrackedRun:
        """A new run in the configured experiment, nested under its parent if any."""
        client, name = mlflow_client(settings), settings.experiment
        found = client.get_experiment_by_name(name)
        experiment = str(found.experiment_id if found else client.create_experiment(name))
        tags = {PARENT_TAG: settings.parent_run_id} if settings.parent_run_id else {}
        run = client.create_run(experiment, tags=tags, run_name=run_name)
        record = {
            "run_id": run.info.run_id,
            "experiment_id": experiment,
            "tracking_uri": client.tracking_uri,
        }
        (run_dir / TRACKING_FILE).write_text(json.dumps(record, indent=2))
        return cls(client, run.info.run_id)

    @classmethod
    def reopen(cls, settings: TrackingSettings, run_dir: Path) -> TrackedRun | None:
        """The run ``run_dir``'s ``tracking.json`` names, running again; None if it has none."""
        record = read_tracking(run_dir)
        if record is None:
            return None
        client = mlflow_client(settings)
        client.update_run(record["run_id"], status="RUNNING")
        return cls(client, record["run_id"])

    def child_settings(self, settings: TrackingSettings) -> TrackingSettings:
        """``settings`` for a run nested under this one, on this run's server by URI (a worker
        elsewhere may not have ``$MLFLOW_TRACKING_URI``)."""
        uri = str(self.client.tracking_uri)
        return settings.model_copy(update={"parent_run_id": self.run_id, "uri": uri})

    def _log_batches(self, kind: str, items: list[Any]) -> None:
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, **{kind: items[i : i + BATCH]})

    def log_params(self, params: Mapping[str, Any]) -> None:
        # the optional extra is loaded: a TrackedRun exists only once its client was built
        from mlflow.entities import Param

        items = [Param(mlflow_key(k), str(v)[:MAX_PARAM]) for k, v in sorted(params.items())]
        self._log_batches("params", items)

    def log_metrics(self, values: Mapping[str, float], step: int) -> None:
        # the optional extra is loaded: a TrackedRun exists only once its client was built
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(mlflow_key(k), v, now, step) for k, v in sorted(values.items())]
        self._log_batches("metrics", items)

    def log_run_dir(self, run_dir: Path) -> None:
        """The checkpoint under ``model/`` (a run directory ``allocator export`` can read once
        downloaded), the other records and the plots at the root."""
        for path in sorted(Path(run_dir).iterdir()):
            if not path.is_file() or path.name == TRACKING_FILE:
                continue
            if path.name in MODEL_FILES:
                self.client.log_artifact(self.run_id, str(path), MODEL_ARTIFACTS)
            elif path.suffix in RECORD_SUFFIXES:
                self.client.log_artifact(self.run_id, str(path))

    def end(self, status: str = "FINISHED") -> None:
        """Mark the run ``FINISHED``, ``FAILED`` or ``KILLED`` (stopped, or pruned)."""
        self.client.set_terminated(self.run_id, status)


def read_tracking(run_dir: Path) -> dict[str, str] | None:
    """``run_dir``'s ``tracking.json`` (the MLflow run that logged it), or None."""
    path = Path(run_dir) / TRACKING_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        raise ValueError(f"{path}: no MLflow run_id in it")
    return record


def open_job_run(
    settings: TrackingSettings,
    out_dir: Path,
    name: str,
    params: Mapping[str, Any],
    reopen: bool = True,
) -> TrackedRun | None:
    """The MLflow run of a training session or batch job: None untracked, the run ``out_dir``
    names when it resumes (``reopen``), else a new one with ``params`` flattened."""
    if not settings.enabled:
        return None
    reopened = TrackedRun.reopen(settings, out_dir) if reopen else None
    if reopened is not None:
        return reopened
    run = TrackedRun.start(settings, out_dir, name)
    run.log_params(flatten(dict(params)))
    return run


def log_finished(run: TrackedRun, run_dir: Path, summary: dict[str, Any]) -> None:
    """A finished run's figures at its last step and its files, then the run marked finished."""
    audit_file = Path(run_dir) / SATURATION_FILE
    audit = json.loads(audit_file.read_text()) if audit_file.is_file() else {}
    speed = {k: summary.get(k) for k in ("train_seconds", "steps_per_second")}
    figures = {**scalar_metrics(audit, "action_saturation"), **scalar_metrics(speed, "run")}
    for key in ("validation", "selection", "saturation_watch"):
        figures.update(scalar_metrics(summary.get(key, {}), key))
    run.log_metrics(figures, int(summary.get("timesteps", 0)))
    run.log_run_dir(run_dir)
    run.end()


def log_trial(
    run: TrackedRun, run_dir: Path, selection: dict[str, Any], steps: int, pruned: bool
) -> None:
    """A tuning trial's selection figures and records (it keeps no model), then its run
    ended: ``KILLED`` when the pruner stopped it, ``FINISHED`` otherwise."""
    run.log_metrics(scalar_metrics(selection, "selection"), steps)
    run.log_run_dir(run_dir)
    run.end("KILLED" if pruned else "FINISHED")


def log_job_finished(run: TrackedRun, summary: dict[str, Any], files: list[Path]) -> None:
    """A finished batch job's summary figures and report files, then the run marked finished."""
    run.log_metrics(scalar_metrics(summary, "summary"), 0)
    for path in files:
        if path.is_file():
            run.client.log_artifact(run.run_id, str(path))
    run.end()


@contextmanager
def ended_on_error(run: TrackedRun | None) -> Iterator[None]:
    """A session that raises marks its MLflow run ``KILLED`` when it stopped resumably (or
    was interrupted), ``FAILED`` otherwise, so the UI never shows it running for ever."""
    try:
        yield
    except BaseException as exc:
        if run is not None:
            stopped = isinstance(exc, TrainingStoppedError | KeyboardInterrupt)
            run.end("KILLED" if stopped else "FAILED")
        raise
