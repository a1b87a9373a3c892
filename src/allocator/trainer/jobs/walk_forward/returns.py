"""``returns.csv``: one row per test day of every window (time order) with ``date``, ``window``,
``agent`` and one column per baseline. The statistics read nothing else, so they can be
recomputed without training or replaying anything."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from allocator.artifacts.files import atomic_write_text
from allocator.trainer.jobs.walk_forward.config import EQUAL_WEIGHT, WalkForwardError
from allocator.trainer.jobs.walk_forward.results import AGENT, WindowResult

RETURNS_FILE = "returns.csv"
SUMMARY_FILE = "summary.json"
DATE = "date"
WINDOW = "window"


def returns_frame(windows: Sequence[WindowResult]) -> pd.DataFrame:
    """Every window's daily net returns, stacked in window order (the ``returns.csv`` rows)."""
    parts = [
        labelled(w.daily_returns(), w.window.label)
        for w in sorted(windows, key=lambda r: r.window.index)
    ]
    if not parts:
        return pd.DataFrame(columns=[DATE, WINDOW, AGENT, EQUAL_WEIGHT])
    return pd.concat(parts, ignore_index=True)


def labelled(returns: pd.DataFrame, label: str) -> pd.DataFrame:
    """One window's returns (indexed by date) as ``returns.csv`` rows: date, window, policies."""
    part = returns.rename_axis(DATE).reset_index()
    part.insert(1, WINDOW, label)
    return part


def write_returns(frame: pd.DataFrame, out_dir: str | Path) -> Path:
    """``returns.csv`` in ``out_dir`` (floats at full precision: reading it back is exact)."""
    text = frame.to_csv(index=False, date_format="%Y-%m-%d", float_format=None)
    return atomic_write_text(Path(out_dir) / RETURNS_FILE, text)


def read_returns(path: str | Path) -> pd.DataFrame:
    """A ``returns.csv``, checked for the columns the statistics need."""
    frame = pd.read_csv(path, parse_dates=[DATE], dtype={WINDOW: str})
    missing = [c for c in (DATE, WINDOW, AGENT, EQUAL_WEIGHT) if c not in frame.columns]
    if missing:
        raise WalkForwardError(f"{path} lacks column(s) {', '.join(missing)}")
    return frame


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """A finished run's ``summary.json``."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        raise WalkForwardError(f"{run_dir} has no {SUMMARY_FILE}: not a finished walk-forward run")
    payload: dict[str, Any] = json.loads(path.read_text())
    return payload
