"""The registry's versions mirrored in MLflow's model registry: a version per export, the
``production`` alias per promotion. The on-disk registry stays what serves, so the ONNX files
are plain artifacts, not an MLflow model flavor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from allocator.trainer.training.config import TrackingSettings, load_config
from allocator.trainer.training.run_dir import CONFIG_FILE
from allocator.trainer.training.tracking import mlflow_client, read_tracking

PRODUCTION_ALIAS = "production"
"""The alias a promotion sets on the registered MLflow version it promoted."""

VERSION_TAG = "allocator.registry_version"
"""Tag of a registered MLflow version: the registry version (directory name) it mirrors."""

REGISTRY_ARTIFACTS = "registry"
"""Artifact folder of a run holding its exports, one folder per registry version."""


def register_export(run_dir: Path, version_dir: Path) -> dict[str, str] | None:
    """Register ``version_dir`` (a published registry version of ``run_dir``'s run) in MLflow;
    the run id and the MLflow model name and version, or None when the run was not tracked."""
    record = read_tracking(run_dir)
    if record is None:
        return None
    settings = load_config(Path(run_dir) / CONFIG_FILE).tracking.model_copy(
        update={"uri": record["tracking_uri"]}
    )
    client = mlflow_client(settings)
    run_id, version = record["run_id"], version_dir.name
    path = f"{REGISTRY_ARTIFACTS}/{version}"
    client.log_artifacts(run_id, str(version_dir), path)
    name = settings.registered_model or version_dir.parent.name
    ensure_registered_model(client, name)
    source = f"{client.get_run(run_id).info.artifact_uri}/{path}"
    found = client.create_model_version(name, source, run_id=run_id, tags={VERSION_TAG: version})
    return {"run_id": run_id, "registered_model": name, "model_version": str(found.version)}


def ensure_registered_model(client: Any, name: str) -> None:
    """Create the registered model ``name`` unless it exists (another export may race us)."""
    # the optional extra is loaded: ``client`` was built by mlflow_client
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def set_production_alias(
    settings: TrackingSettings, registry_name: str, version: str
) -> str | None:
    """Point the ``production`` alias at the MLflow version mirroring registry ``version``;
    that MLflow version, or None when the version was never registered (an untracked run)."""
    client = mlflow_client(settings)
    name = settings.registered_model or registry_name
    found = [
        v
        for v in client.search_model_versions(f"name = '{name}'")
        if v.tags.get(VERSION_TAG) == version
    ]
    if not found:
        return None
    mirrored = str(max(int(v.version) for v in found))
    client.set_registered_model_alias(name, PRODUCTION_ALIAS, mirrored)
    return mirrored
