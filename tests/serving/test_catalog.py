"""The catalog over real registry files: a refused version heals when any of its files changes,
refusals are counted once each (not once per scan) by reason, and a loaded version whose files
go bad keeps serving what it loaded.

Each test drives ``ModelCatalog.refresh()`` (one scan) on a real registry directory with the
real loader; the server-level check (a watching server, over gRPC) is in
``tests/serving/server/test_registry_healing.py``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from allocator.artifacts.manifest import checksums, read_manifest, write_manifest
from allocator.metrics.serving import ServingMetrics
from allocator.serving.catalog import ModelCatalog
from allocator.serving.server import SERVICE
from tests.serving.conftest import write_tiny_model


def refused_total(metrics: CollectorRegistry, reason: str) -> float:
    value = metrics.get_sample_value("allocator_serving_model_refused_total", {"reason": reason})
    assert value is not None
    return value


def refused_now(metrics: CollectorRegistry, reason: str) -> float:
    value = metrics.get_sample_value("allocator_serving_models_refused", {"reason": reason})
    assert value is not None
    return value


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, ModelCatalog, CollectorRegistry]:
    """A registry with ``tiny/1`` loaded, its catalog (CPU) and the catalog's metrics."""
    root = tmp_path / "registry"
    write_tiny_model(root / "tiny" / "1")
    metrics = CollectorRegistry()
    catalog = ModelCatalog(root, prefer_cuda=False, metrics=ServingMetrics(metrics, 0.01, SERVICE))
    catalog.refresh()
    assert set(catalog.snapshot.models) == {("tiny", "1")}
    return root, catalog, metrics


def test_a_version_whose_model_arrives_after_its_manifest_loads_once_complete(
    setup: tuple[Path, ModelCatalog, CollectorRegistry],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``copy2`` keeps the source's mtimes, as ``rsync -a`` does: the new file still counts."""
    root, catalog, metrics = setup
    source = write_tiny_model(tmp_path / "source")
    target = root / "tiny" / "2"
    target.mkdir()
    shutil.copy2(source / "manifest.json", target / "manifest.json")
    shutil.copy2(source / "icm.onnx", target / "icm.onnx")
    manifest_stat = os.stat(target / "manifest.json")

    with caplog.at_level(logging.INFO, logger="allocator.serving"):
        for _ in range(3):  # several scans of the half-copied version
            catalog.refresh()
    refusal = catalog.snapshot.refused[("tiny", "2")]
    assert refusal.reason == "missing_file"
    assert refusal.message.endswith("model.onnx: listed in manifest.json but missing")
    assert catalog.snapshot.default.version == "1"
    assert refused_total(metrics, "missing_file") == 1.0  # one refusal, three scans
    assert refused_now(metrics, "missing_file") == 1.0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "refused tiny/2 [missing_file]" in errors[0].getMessage()

    shutil.copy2(source / "model.onnx", target / "model.onnx")
    assert catalog.refresh()
    assert set(catalog.snapshot.models) == {("tiny", "1"), ("tiny", "2")}
    assert catalog.snapshot.default.version == "2"
    assert catalog.snapshot.refused == {}
    assert refused_now(metrics, "missing_file") == 0.0
    after = os.stat(target / "manifest.json")
    assert (after.st_mtime_ns, after.st_size) == (manifest_stat.st_mtime_ns, manifest_stat.st_size)


def test_a_model_still_being_written_is_refused_once_then_loads(
    setup: tuple[Path, ModelCatalog, CollectorRegistry], tmp_path: Path
) -> None:
    """Each scan of a growing file sees new files but the same refusal: counted once."""
    root, catalog, metrics = setup
    source = write_tiny_model(tmp_path / "source")
    target = root / "tiny" / "2"
    target.mkdir()
    shutil.copy2(source / "manifest.json", target / "manifest.json")
    shutil.copy2(source / "icm.onnx", target / "icm.onnx")
    data = (source / "model.onnx").read_bytes()
    for size in (len(data) // 4, len(data) // 2, 3 * len(data) // 4):
        (target / "model.onnx").write_bytes(data[:size])
        catalog.refresh()
        assert catalog.snapshot.refused[("tiny", "2")].reason == "checksum_mismatch"
    assert refused_total(metrics, "checksum_mismatch") == 1.0
    (target / "model.onnx").write_bytes(data)
    catalog.refresh()
    assert ("tiny", "2") in catalog.snapshot.models
    assert refused_now(metrics, "checksum_mismatch") == 0.0


def test_a_loaded_version_whose_files_go_bad_keeps_serving_and_shows_the_refusal(
    setup: tuple[Path, ModelCatalog, CollectorRegistry],
) -> None:
    root, catalog, metrics = setup
    model_file = root / "tiny" / "1" / "model.onnx"
    good = model_file.read_bytes()
    served = catalog.snapshot.models[("tiny", "1")]
    model_file.write_bytes(good[: len(good) // 2])
    catalog.refresh()
    assert catalog.snapshot.models[("tiny", "1")] is served  # what it loaded keeps answering
    assert catalog.snapshot.refused[("tiny", "1")].reason == "checksum_mismatch"
    assert refused_now(metrics, "checksum_mismatch") == 1.0

    model_file.write_bytes(good)
    catalog.refresh()
    assert catalog.snapshot.refused == {}
    assert catalog.snapshot.models[("tiny", "1")] is not served  # reloaded from the good files


def test_a_loaded_version_restored_to_the_files_it_loaded_is_no_longer_refused(
    setup: tuple[Path, ModelCatalog, CollectorRegistry], tmp_path: Path
) -> None:
    """``rsync -a`` from a backup puts back the very names, sizes and mtimes it loaded."""
    root, catalog, metrics = setup
    model_file = root / "tiny" / "1" / "model.onnx"
    backup = tmp_path / "model.onnx.backup"
    shutil.copy2(model_file, backup)
    served = catalog.snapshot.models[("tiny", "1")]
    model_file.write_bytes(b"garbage")
    catalog.refresh()
    assert catalog.snapshot.refused[("tiny", "1")].reason == "checksum_mismatch"
    shutil.copy2(backup, model_file)
    catalog.refresh()
    assert catalog.snapshot.refused == {}
    assert catalog.snapshot.models[("tiny", "1")] is served
    assert refused_now(metrics, "checksum_mismatch") == 0.0


def test_each_kind_of_bad_version_is_refused_with_its_reason(
    setup: tuple[Path, ModelCatalog, CollectorRegistry], tmp_path: Path
) -> None:
    root, catalog, metrics = setup
    bad_json = write_tiny_model(root / "tiny" / "2")
    (bad_json / "manifest.json").write_text("{not json")
    old_schema = write_tiny_model(root / "tiny" / "3")
    raw = json.loads((old_schema / "manifest.json").read_text())
    (old_schema / "manifest.json").write_text(json.dumps({**raw, "schema_version": 9}))
    training_run = write_tiny_model(root / "tiny" / "4")
    (training_run / "model.zip").write_bytes(b"PK")
    not_a_graph = write_tiny_model(tmp_path / "source")
    (not_a_graph / "model.onnx").write_bytes(b"not an onnx graph")
    manifest = read_manifest(not_a_graph)
    fixed = manifest.model_copy(update={"files": checksums(not_a_graph, list(manifest.files))})
    write_manifest(not_a_graph, fixed)
    shutil.copytree(not_a_graph, root / "tiny" / "5")

    catalog.refresh()
    reasons = {version: r.reason for (_, version), r in catalog.snapshot.refused.items()}
    assert reasons == {
        "2": "bad_manifest",
        "3": "unsupported_format",
        "4": "unsupported_format",
        "5": "bad_graph",
    }
    assert catalog.snapshot.default.version == "1"
    assert refused_total(metrics, "unsupported_format") == 2.0
    assert refused_now(metrics, "bad_graph") == 1.0


def test_a_refused_version_that_leaves_the_registry_is_forgotten(
    setup: tuple[Path, ModelCatalog, CollectorRegistry],
) -> None:
    root, catalog, metrics = setup
    broken = write_tiny_model(root / "tiny" / "2")
    (broken / "model.onnx").unlink()
    catalog.refresh()
    assert refused_now(metrics, "missing_file") == 1.0
    shutil.rmtree(broken)
    catalog.refresh()
    assert catalog.snapshot.refused == {}
    assert catalog.snapshot.refused == {}
    assert refused_now(metrics, "missing_file") == 0.0
    assert refused_total(metrics, "missing_file") == 1.0  # a counter never goes back
