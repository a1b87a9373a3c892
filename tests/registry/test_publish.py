"""Publishing: a version appears whole or not at all, never twice; promotions can be undone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from allocator.artifacts.manifest import read_manifest, sha256_file
from allocator.registry.errors import PublishError
from allocator.registry.pointer import PRODUCTION_FILE, read_production_pointer
from allocator.registry.publish import (
    PendingPromotion,
    check_name,
    move_version,
    publish_files,
)
from allocator.registry.versions import CANDIDATES_DIR, versions
from tests.registry import SPEC
from tests.serving import write_exported_model


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A complete exported model outside any registry, to publish from."""
    return write_exported_model(tmp_path / "work" / "model", SPEC, icm=True)


def test_publish_files_writes_a_verified_version(source: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "registry" / "alpha"
    manifest = read_manifest(source)
    files = [source / "model.onnx", source / "icm.onnx"]
    target = publish_files(files, manifest, model_dir, "1")
    assert target == model_dir / "1"
    written = read_manifest(target)
    assert written.files == {f.name: sha256_file(f) for f in files}
    assert [p.name for p in model_dir.iterdir()] == ["1"]  # no staging left
    assert versions(model_dir) == ["1"]


def test_an_existing_version_is_never_overwritten(source: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "registry" / "alpha"
    files = [source / "model.onnx"]
    publish_files(files, read_manifest(source), model_dir, "1")
    before = (model_dir / "1" / "manifest.json").read_bytes()
    with pytest.raises(PublishError, match="already exists; versions are never overwritten"):
        publish_files(files, read_manifest(source), model_dir, "1")
    assert (model_dir / "1" / "manifest.json").read_bytes() == before
    assert [p.name for p in model_dir.iterdir()] == ["1"]


def test_a_failed_publish_leaves_no_staging(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staged directory is hidden while it is written and removed when publishing fails;
    it is never listed as a version."""
    model_dir = tmp_path / "registry" / "alpha"
    seen: list[list[str]] = []

    def failing_rename(src: str | Path, dst: str | Path) -> None:
        assert Path(src).name.startswith(".tmp-")
        assert (Path(src) / "manifest.json").is_file()  # complete, yet hidden
        seen.append(versions(model_dir))
        raise OSError("cross-device link")

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(PublishError, match="cannot publish: cross-device link"):
        publish_files([source / "model.onnx"], read_manifest(source), model_dir, "1")
    assert seen == [[]]
    assert list(model_dir.iterdir()) == []


@pytest.mark.parametrize("value", ["../escape", ".hidden", "-x", "a/b", ""])
def test_bad_names_are_refused(value: str) -> None:
    with pytest.raises(PublishError, match="must be letters, digits"):
        check_name("version", value)
    assert check_name("name", "tiny-td3") == "tiny-td3"


def test_move_version_refuses_an_existing_target(source: Path, tmp_path: Path) -> None:
    target = write_exported_model(tmp_path / "registry" / "alpha" / "1", SPEC)
    with pytest.raises(PublishError, match="already exists"):
        move_version(source, target)
    assert source.is_dir()


def test_a_promotion_is_undone_whole(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    write_exported_model(registry / "tiny" / "1", SPEC)
    promotion = PendingPromotion(registry, "tiny")
    promotion.point("1")
    first = (registry / "tiny" / PRODUCTION_FILE).read_bytes()

    candidate = write_exported_model(registry / CANDIDATES_DIR / "tiny" / "2", SPEC)
    promotion = PendingPromotion(registry, "tiny")
    published = promotion.publish(candidate, "2")
    assert published == registry / "tiny" / "2"
    assert not candidate.exists()
    assert promotion.point("2", previous="1")["previous"] == "1"
    assert read_production_pointer(registry, "tiny")["version"] == "2"

    promotion.undo()
    assert (registry / "tiny" / PRODUCTION_FILE).read_bytes() == first
    assert versions(registry / "tiny") == ["1"]
    assert (candidate / "manifest.json").is_file()


def test_undoing_a_first_promotion_removes_the_pointer(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    candidate = write_exported_model(registry / CANDIDATES_DIR / "tiny" / "1", SPEC)
    promotion = PendingPromotion(registry, "tiny")
    promotion.publish(candidate, "1")
    promotion.point("1")
    promotion.undo()
    assert not (registry / "tiny" / PRODUCTION_FILE).exists()
    assert versions(registry / "tiny") == []
