"""The checkpoint manifest: schema checks, checksums, atomic writes, and `checkpoint inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from allocator.artifacts.manifest import (
    MANIFEST_FILE,
    SCHEMA_VERSION,
    DataInfo,
    FeatureSpecInfo,
    Manifest,
    ManifestError,
    NormalizationInfo,
    checksums,
    read_manifest,
    sha256_file,
    verify_checksums,
    write_manifest,
)
from allocator.cli import main


def make_dir(tmp_path: Path) -> tuple[Path, Manifest]:
    d = tmp_path / "run"
    d.mkdir()
    (d / "model.zip").write_bytes(b"weights" * 100)
    (d / "config.yaml").write_text("seed: 0\n")
    manifest = Manifest(
        algorithm="td3",
        feature_spec=FeatureSpecInfo(max_assets=3, window=5, clip=10.0),
        normalization=NormalizationInfo(mean=0.0005, std=0.02),
        beta=0.5,
        cost_bps=10.0,
        data=DataInfo(
            dataset="sp500",
            universe=["A", "B", "C"],
            train_start="2005-01-01",
            train_end="2014-12-31",
        ),
        files=checksums(d, ["model.zip", "config.yaml", "absent.pt"]),
    )
    write_manifest(d, manifest)
    return d, manifest


def test_sha256_matches_hashlib_of_the_bytes(tmp_path):
    import hashlib

    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(256)) * 5000)  # spans several read chunks
    assert sha256_file(p) == hashlib.sha256(p.read_bytes()).hexdigest()


def test_round_trip_and_checksums(tmp_path):
    d, manifest = make_dir(tmp_path)
    assert set(manifest.files) == {"model.zip", "config.yaml"}  # absent files are not listed
    loaded = read_manifest(d)
    assert loaded == manifest
    assert loaded.schema_version == SCHEMA_VERSION
    verify_checksums(d, loaded)  # untouched files pass
    assert not list(d.glob(".manifest-*"))  # the atomic write left no temp file


def test_altered_truncated_or_missing_files_are_named(tmp_path):
    d, manifest = make_dir(tmp_path)
    data = (d / "model.zip").read_bytes()
    (d / "model.zip").write_bytes(data[:-1])
    with pytest.raises(ManifestError, match=r"model\.zip: sha256 does not match"):
        verify_checksums(d, manifest)
    (d / "model.zip").unlink()
    with pytest.raises(ManifestError, match=r"model\.zip: listed in manifest\.json but missing"):
        verify_checksums(d, manifest)


def test_other_schema_versions_and_bad_json_are_refused(tmp_path):
    d, _ = make_dir(tmp_path)
    raw = json.loads((d / MANIFEST_FILE).read_text())
    raw["schema_version"] = 1
    (d / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match=r"schema version 1.*checkpoint migrate"):
        read_manifest(d)
    (d / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        read_manifest(d)
    (d / MANIFEST_FILE).unlink()
    with pytest.raises(ManifestError, match=r"no manifest\.json"):
        read_manifest(d)


def test_invalid_fields_are_named(tmp_path):
    d, _ = make_dir(tmp_path)
    raw = json.loads((d / MANIFEST_FILE).read_text())
    raw["beta"] = 1.5
    (d / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match="beta"):
        read_manifest(d)


def test_inspect_prints_the_manifest_and_checks_files(tmp_path):
    d, _ = make_dir(tmp_path)
    res = CliRunner().invoke(main, ["checkpoint", "inspect", str(d)])
    assert res.exit_code == 0, res.output
    for text in (
        f"schema version  {SCHEMA_VERSION}",
        "td3",
        "max_assets      3",
        "smoothing beta  0.5",
        "model.zip",
        "checksums ok",
    ):
        assert text in res.output
    (d / "config.yaml").write_text("seed: 1\n")
    bad = CliRunner().invoke(main, ["checkpoint", "inspect", str(d)])
    assert bad.exit_code == 2
    assert "config.yaml: sha256 does not match" in bad.output
