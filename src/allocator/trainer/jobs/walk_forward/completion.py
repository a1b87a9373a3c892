"""How far a window got, judged from its files: trained, exported, kept.

A window's artifacts are trusted only when whole: a training run directory whose
``manifest.json`` (the last file training writes) lists files that all match their sha256, and
a registry version whose manifest does the same. Anything less is a window that was cut short,
and it redoes what it lacks (``window``: export again, continue from a checkpoint, or train
from scratch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from allocator.artifacts.manifest import ManifestError, read_manifest, verify_checksums
from allocator.trainer.training.run_dir import RUN_SUMMARY_FILE


def whole(directory: Path) -> bool:
    """A directory with a readable manifest whose every listed file matches its checksum."""
    try:
        verify_checksums(directory, read_manifest(directory))
    except (ManifestError, OSError):
        return False
    return True


def finished_training(run_dir: str | Path) -> dict[str, Any] | None:
    """The ``run.json`` of a training run that finished (its manifest whole), else None."""
    run = Path(run_dir)
    if not whole(run):
        return None
    try:
        summary = json.loads((run / RUN_SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def exported(version_dir: str | Path) -> bool:
    """A registry version that was published whole."""
    return whole(Path(version_dir))
