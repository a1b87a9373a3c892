"""Where a batch job writes: the folder it is given, else ``output_dir/NAME-LABEL``."""

from __future__ import annotations

import datetime as dt
from pathlib import Path


def make_label() -> str:
    """A UTC timestamp: unique per run, sortable, valid in a registry version."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")


def run_directory(output_dir: str, name: str, out_dir: str | Path | None, label: str) -> Path:
    """``out_dir`` when given, else ``output_dir/NAME-LABEL``."""
    return Path(out_dir) if out_dir else Path(output_dir) / f"{name}-{label}"
