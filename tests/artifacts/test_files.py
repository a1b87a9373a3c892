"""Durable writes: a reader sees the old file or the new one, never a torn or missing one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import allocator.artifacts.files as files_module
from allocator.artifacts.files import atomic_write_bytes, atomic_write_text, fsync_path


def test_atomic_write_replaces_whole_and_leaves_nothing_beside(tmp_path: Path) -> None:
    target = tmp_path / "pointer.json"
    atomic_write_text(target, '{"version": "1"}')
    atomic_write_bytes(target, b'{"version": "2"}')
    assert target.read_bytes() == b'{"version": "2"}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # mkstemp's 0600 would lock out readers
    assert [p.name for p in tmp_path.iterdir()] == ["pointer.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "pointer.json"
    atomic_write_text(target, "old")

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["pointer.json"]


def test_the_directory_is_synced_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(files_module, "fsync_path", lambda path: synced.append(Path(path)))
    atomic_write_text(tmp_path / "a.json", "{}")
    assert synced == [tmp_path]
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == files_module.DEFAULT_MODE


def test_fsync_path_takes_files_and_directories(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    fsync_path(tmp_path / "f")
    fsync_path(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_path(tmp_path / "missing")
