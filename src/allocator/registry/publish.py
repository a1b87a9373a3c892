"""Publishing versions: staged in a hidden directory on the same file system, fsync'd and
renamed into place, so a reader sees no version or a whole one; versions are never overwritten."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

from allocator.artifacts.files import atomic_write_bytes, fsync_path
from allocator.artifacts.manifest import Manifest, checksums, write_manifest
from allocator.registry.errors import PublishError
from allocator.registry.naming import STAGING_PREFIX, is_valid_name
from allocator.registry.pointer import PRODUCTION_FILE, write_production_pointer

log = logging.getLogger("allocator.registry")


def check_name(kind: str, value: str) -> str:
    """``value`` if it may name a registry ``kind`` ("name" or "version"), else PublishError."""
    if not is_valid_name(value):
        raise PublishError(
            f"registry {kind} {value!r} must be letters, digits, '_', '.', '-' "
            "and must not start with '.' or '-'"
        )
    return value


def refuse_existing(target: Path) -> None:
    """Versions are immutable: once served, a version's files never change under a reader."""
    if target.exists():
        raise PublishError(f"{target}: version already exists; versions are never overwritten")


def move_version(src: Path, dst: Path) -> Path:
    """Rename a complete version directory to ``dst`` (atomic on one file system), durably."""
    refuse_existing(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(src, dst)
    except OSError as exc:  # another writer took the version first
        raise PublishError(f"{dst}: cannot publish: {exc}") from exc
    fsync_path(dst.parent)
    fsync_path(src.parent)
    return dst


def publish_files(files: list[Path], manifest: Manifest, model_dir: Path, version: str) -> Path:
    """Stage ``files`` and the manifest (with their sha256) in ``model_dir``, rename into place;
    the staging directory is removed on any failure."""
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = model_dir / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        for src in files:
            shutil.copyfile(src, staging / src.name)
            fsync_path(staging / src.name)
        digests = checksums(staging, [f.name for f in files])
        written = write_manifest(staging, manifest.model_copy(update={"files": digests}))
        # The manifest is read by whoever reads the model files: give it their mode.
        os.chmod(written, stat.S_IMODE((staging / files[0].name).stat().st_mode))
        fsync_path(staging)
        return move_version(staging, model_dir / version)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class PendingPromotion:
    """The file-system side of promoting a candidate of ``name``, undoable until recorded: the
    pointer as it was at construction, published directories moved back."""

    def __init__(self, registry: Path, name: str) -> None:
        self.registry = registry
        self.name = name
        self.pointer_file = registry / name / PRODUCTION_FILE
        self.saved = self.pointer_file.read_bytes() if self.pointer_file.is_file() else None
        self.moves: list[tuple[Path, Path]] = []

    def publish(self, candidate_dir: Path, version: str) -> Path:
        target = move_version(candidate_dir, self.registry / self.name / version)
        self.moves.append((candidate_dir, target))
        return target

    def point(self, version: str, **details: Any) -> dict[str, Any]:
        return write_production_pointer(self.registry, self.name, version, **details)

    def undo(self) -> None:
        """Best effort: a failure is logged, the caller's own error is the one to report."""
        try:
            if self.saved is None:
                self.pointer_file.unlink(missing_ok=True)
            else:
                atomic_write_bytes(self.pointer_file, self.saved)
            for src, dst in reversed(self.moves):
                if dst.exists() and not src.exists():
                    os.rename(dst, src)
        except OSError:
            log.exception("%s: could not undo the promotion's file-system changes", self.name)
