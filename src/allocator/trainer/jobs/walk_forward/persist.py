"""Each finished window kept whole in the run directory, so a killed run resumes exactly.

``windows/w03.json`` holds a window's entire ``WindowResult``, written atomically before its
database row. ``--resume`` rebuilds the window from it alone, and Python's JSON floats round-trip
exactly (NaN as its token), so a resumed run's figures equal an uninterrupted one's."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pandas as pd

from allocator.artifacts.files import atomic_write_text
from allocator.trainer.jobs.walk_forward.config import WalkForwardError
from allocator.trainer.jobs.walk_forward.results import WindowResult
from allocator.trainer.market.windows import Window
from allocator.trainer.sim.backtest import BacktestResult

WINDOWS_DIR = "windows"
FORMAT = 1
"""Layout of a window file; a file of another layout is not trusted (the window reruns)."""


def window_file(out_dir: str | Path, label: str) -> Path:
    """Where a run keeps window ``label``'s result."""
    return Path(out_dir) / WINDOWS_DIR / f"{label}.json"


def series_payload(series: pd.Series) -> dict[str, Any]:
    return {
        "name": series.name,
        "index_name": series.index.name,
        "index_dtype": str(series.index.dtype),
        "dtype": str(series.dtype),
        "index": [str(v) for v in series.index],
        "values": series.tolist(),
    }


def series_from(payload: dict[str, Any]) -> pd.Series:
    index = pd.Index(payload["index"], name=payload["index_name"])
    return pd.Series(
        payload["values"],
        index=index.astype(payload["index_dtype"]),
        name=payload["name"],
        dtype=payload["dtype"],
    )


def frame_payload(frame: pd.DataFrame) -> dict[str, Any]:
    return {
        "index_name": frame.index.name,
        "index_dtype": str(frame.index.dtype),
        "columns": [str(c) for c in frame.columns],
        "columns_dtype": str(frame.columns.dtype),
        "dtypes": [str(t) for t in frame.dtypes],
        "index": [str(v) for v in frame.index],
        "values": frame.to_numpy().tolist(),
    }


def frame_from(payload: dict[str, Any]) -> pd.DataFrame:
    index = pd.Index(payload["index"], name=payload["index_name"])
    columns = pd.Index(payload["columns"]).astype(payload["columns_dtype"])
    frame = pd.DataFrame(
        payload["values"] or None, index=index.astype(payload["index_dtype"]), columns=columns
    )
    return frame.astype(dict(zip(columns, payload["dtypes"], strict=True)))


SERIES, FRAMES = ("nav", "turnover", "costs"), ("raw_weights", "executed_weights")


def backtest_payload(result: BacktestResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "settings": result.settings,
        **{k: series_payload(getattr(result, k)) for k in SERIES},
        **{k: frame_payload(getattr(result, k)) for k in FRAMES},
    }


def backtest_from(payload: dict[str, Any]) -> BacktestResult:
    parts: dict[str, Any] = {k: series_from(payload[k]) for k in SERIES}
    parts.update({k: frame_from(payload[k]) for k in FRAMES})
    return BacktestResult(name=payload["name"], settings=payload["settings"], **parts)


def window_from(w: dict[str, Any]) -> Window:
    """A ``Window`` from its ``to_dict``."""
    spans = ("train_start", "train_end", "test_start", "test_end")
    return Window(int(w["index"]), *(dt.date.fromisoformat(str(w[k])[:10]) for k in spans))


def result_payload(result: WindowResult) -> dict[str, Any]:
    """A window's result as the JSON tree of its file."""
    return {
        **{f.name: getattr(result, f.name) for f in fields(result)},
        "format": FORMAT,
        "window": result.window.to_dict(),
        "agent": backtest_payload(result.agent),
        "baselines": {name: backtest_payload(b) for name, b in result.baselines.items()},
    }


def result_from(payload: dict[str, Any]) -> WindowResult:
    """The ``WindowResult`` a window file holds."""
    plain = {f.name: payload[f.name] for f in fields(WindowResult) if f.name in payload}
    return WindowResult(
        **{
            **plain,
            "window": window_from(payload["window"]),
            "agent": backtest_from(payload["agent"]),
            "baselines": {name: backtest_from(b) for name, b in payload["baselines"].items()},
            "train_seconds": float(payload["train_seconds"]),
            "seconds": float(payload["seconds"]),
        }
    )


def write_window_result(out_dir: str | Path, result: WindowResult) -> Path:
    """Keep a finished window in ``out_dir/windows/`` (atomic: whole or absent)."""
    path = window_file(out_dir, result.window.label)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result_payload(result), default=str, allow_nan=True)
    return atomic_write_text(path, text)


def read_window_result(path: str | Path) -> WindowResult:
    """A window file, refused (``WalkForwardError``) when unreadable or of another layout."""
    try:
        payload = json.loads(Path(path).read_text())
        if payload.get("format") != FORMAT:
            raise ValueError(f"format {payload.get('format')!r}, expected {FORMAT}")
        return result_from(payload)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WalkForwardError(f"{path}: not a readable window result: {exc}") from exc
