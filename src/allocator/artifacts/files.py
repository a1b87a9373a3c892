"""Durable file writes: the one place that knows how a write survives a crash.

A plain ``write_text`` can leave a half-written file behind when the process or the machine
dies mid-write, and a rename is only durable once the directory holding it is fsync'd (POSIX
keeps directory entries in the directory's own data). So every file that a reader must see
either whole or not at all is written to a temporary file in the same directory, fsync'd,
renamed over the target (atomic on one file system), and then the directory is fsync'd.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_with",
    "fsync_path",
    "write_json",
]

DEFAULT_MODE = 0o644
"""Mode of atomically written files: ``mkstemp`` makes 0600, but other users (a server running
as another account) read registries and run directories."""


def fsync_path(path: str | Path) -> None:
    """Flush ``path`` to disk: a file's contents (e.g. after ``shutil.copyfile``), or a
    directory's entries (a file created, renamed or deleted in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int = DEFAULT_MODE) -> Path:
    """Replace ``path`` with ``data`` so a reader sees the old file or the new one, never a mix.

    The temporary file (``.STEM-XXXX.SUFFIX`` beside the target: hidden, so listings that skip
    dot-names never see it) is removed on any failure.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-", suffix=target.suffix)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(target.parent)
    return target


def atomic_write_text(path: str | Path, text: str, *, mode: int = DEFAULT_MODE) -> Path:
    """``atomic_write_bytes`` of ``text`` encoded as UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_with(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Replace ``path`` with the file ``write(tmp)`` creates at a temporary path beside it.

    For writers that insist on a path of their own (SB3's ``save``, ``torch.save``,
    ``shutil.copyfile``): the result is as atomic and durable as ``atomic_write_bytes``. The
    temporary name keeps the target's suffix, so a writer that appends one leaves it alone.
    """
    target = Path(path)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-", suffix=target.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, DEFAULT_MODE)
        fsync_path(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(target.parent)
    return target


def _clean(obj: Any) -> Any:
    """NaN and infinities are not JSON: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _clean(obj.item())
    return obj


def json_text(payload: Any) -> str:
    """``payload`` as indented JSON that strict readers (browsers, Grafana, jq) accept."""
    return json.dumps(_clean(payload), indent=2, default=str)


def write_json(path: str | Path, payload: Any) -> Path:
    """Write ``payload`` as ``json_text``, creating parent folders."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json_text(payload) + "\n")
    return out
