"""What a walk-forward run produces and keeps in its directory: ``WindowResult``s, each kept
whole in ``windows/w03.json`` (``--resume`` rebuilds the window from it alone; JSON floats
round-trip exactly, NaN as its token), ``returns.csv`` (the statistics read nothing else),
``summary.json`` and the run's identity, ``walk_forward.json``."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from allocator.artifacts.files import atomic_write_text
from allocator.trainer.jobs.json_safe import json_safe
from allocator.trainer.jobs.walk_forward.config import (
    EQUAL_WEIGHT,
    WalkForwardConfig,
    WalkForwardError,
)
from allocator.trainer.market.windows import Window
from allocator.trainer.sim.backtest import BacktestResult

AGENT = "agent"
"""The exported model's name among a window's policies."""
RETURNS_FILE = "returns.csv"
SUMMARY_FILE = "summary.json"
STATE_FILE = "walk_forward.json"
WINDOWS_DIR = "windows"
RUNS_DIR = "runs"
"""Where a run keeps its windows' training runs."""
DATE = "date"
WINDOW = "window"
FORMAT = 1
"""Layout of window and state files; a window file of another layout is not trusted (the
window reruns)."""

T = TypeVar("T")


class ResumeError(WalkForwardError):
    """A run directory that cannot be resumed as asked (nothing was changed)."""


@dataclass
class WindowResult:
    """What one window produced: the exported version, its backtest, the baselines'."""

    window: Window
    version: str
    version_dir: str
    run_dir: str
    algorithm: str
    manifest: dict[str, Any]
    agent: BacktestResult
    baselines: dict[str, BacktestResult]
    icm: dict[str, float] | None
    torch_validation: dict[str, Any]
    train_seconds: float
    seconds: float
    resumed_from: list[int] = field(default_factory=list)
    """Steps its training continued from after a kill: another draw of its recipe."""

    def metrics(self) -> dict[str, float]:
        return self.agent.metrics()

    def baseline_metrics(self) -> dict[str, dict[str, float]]:
        return {name: r.metrics() for name, r in self.baselines.items()}

    def daily_returns(self) -> pd.DataFrame:
        """Daily net returns on the test span, one column per policy (the model first)."""
        columns = {AGENT: self.agent.returns}
        columns.update({name: r.returns for name, r in self.baselines.items()})
        return pd.DataFrame(columns)


@dataclass
class WalkForwardResult:
    """A finished walk-forward run: windows in order, summary, where it was written."""

    label: str
    config: WalkForwardConfig
    out_dir: Path
    windows: list[WindowResult]
    summary: dict[str, Any]
    run_id: int | None = None
    database_url: str | None = None
    push_error: str | None = None
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)


def returns_frame(windows: Sequence[WindowResult]) -> pd.DataFrame:
    """Every window's daily net returns stacked in window order: the ``returns.csv`` rows."""
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
    if not Path(path).is_file():
        where = Path(path).parent
        raise WalkForwardError(f"{where} has no {RETURNS_FILE}: not a finished walk-forward run")
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


def read_format(
    path: Path, build: Callable[[dict[str, Any]], T], error: type[WalkForwardError], what: str
) -> T:
    """A JSON file of layout ``FORMAT`` made into ``build``'s object, else ``error``."""
    try:
        payload = json.loads(path.read_text())
        if payload.get("format") != FORMAT:
            raise ValueError(f"format {payload.get('format')!r}, expected {FORMAT}")
        return build(payload)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise error(f"{path}: not a readable {what}: {exc}") from exc


def write_window_result(out_dir: str | Path, result: WindowResult) -> Path:
    """Keep a finished window in ``out_dir/windows/`` (atomic: whole or absent)."""
    path = window_file(out_dir, result.window.label)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(result_payload(result), default=str, allow_nan=True))


def read_window_result(path: str | Path) -> WindowResult:
    """A window file, refused (``WalkForwardError``) when unreadable or of another layout."""
    return read_format(Path(path), result_from, WalkForwardError, "window result")


@dataclass
class RunState:
    """``walk_forward.json``: written before any window trains and on every resume."""

    label: str
    name: str
    config: dict[str, Any]
    run_id: int | None
    database: str | None
    plan: dict[str, Any]
    sessions: list[dict[str, Any]] = field(default_factory=list)
    format: int = FORMAT


def write_state(out_dir: str | Path, state: RunState) -> Path:
    """``walk_forward.json`` in the run directory, replaced atomically."""
    text = json.dumps(json_safe(asdict(state)), indent=2) + "\n"
    return atomic_write_text(Path(out_dir) / STATE_FILE, text)


def read_state(out_dir: str | Path) -> RunState:
    """A run directory's state; refused naming what is missing."""
    path = Path(out_dir) / STATE_FILE
    if not path.is_file():
        raise ResumeError(
            f"{out_dir} has no {STATE_FILE}: not a walk-forward run directory, or one made "
            "before runs could be resumed"
        )
    return read_format(
        path,
        lambda raw: RunState(**{f.name: raw[f.name] for f in fields(RunState) if f.name in raw}),
        ResumeError,
        "walk-forward state",
    )
