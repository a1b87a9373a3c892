"""``allocator walk-forward status RUN_DIR``: how far a run is, from its files alone.

Needs no database and writes nothing; a window whose writer was a process on this machine that
no longer exists shows as stopped, so a killed run reads as one."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from allocator.trainer.jobs.walk_forward.persist import window_file
from allocator.trainer.jobs.walk_forward.progress import (
    DONE,
    FAILED,
    describe,
    read_progress,
    writer_alive,
)
from allocator.trainer.jobs.walk_forward.returns import SUMMARY_FILE
from allocator.trainer.jobs.walk_forward.state import RunState, read_state

RUNS_DIR = "runs"
"""Where a run keeps its windows' training runs (``window.plan``)."""


STATES = ("done", "running", "stopped", "failed", "waiting")


@dataclass
class WindowStatus:
    """One window: its state (one of ``STATES``) and its progress file."""

    label: str
    state: str
    progress: dict[str, Any] | None


def window_status(out: Path, label: str) -> WindowStatus:
    progress = read_progress(out / RUNS_DIR / label)
    phase = (progress or {}).get("phase")
    if window_file(out, label).is_file():
        return WindowStatus(label, "done", progress if phase == DONE else None)
    if progress is None or phase == DONE:  # none yet, or a kept result lost: it will rerun
        return WindowStatus(label, "waiting", None)
    if phase == FAILED:
        return WindowStatus(label, "failed", progress)
    gone = writer_alive(progress) is False
    return WindowStatus(label, "stopped" if gone else "running", progress)


def run_status(run_dir: str | Path) -> tuple[RunState, list[WindowStatus], bool]:
    """The run's state, each window's status, and whether the run finished."""
    out = Path(run_dir)
    state = read_state(out)
    labels = [f"w{int(w['index']):02d}" for w in state.plan["windows"]]
    windows = [window_status(out, label) for label in labels]
    finished = (out / SUMMARY_FILE).is_file() and all(w.state == "done" for w in windows)
    return state, windows, finished


def ago(stamp: Any) -> str:
    try:
        then = dt.datetime.fromisoformat(str(stamp))
    except ValueError:
        return "?"
    seconds = max(0, int((dt.datetime.now(dt.UTC) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def window_line(w: WindowStatus) -> str:
    p = w.progress or {}
    if w.state == "done":
        if p.get("sharpe") is None:
            return f"{w.label}  done"
        excess = p.get("excess_sharpe")
        tail = f", excess {excess:+.2f} over equal weight" if excess is not None else ""
        return f"{w.label}  done      sharpe {p['sharpe']:+.2f}{tail}"
    if w.state == "waiting":
        return f"{w.label}  waiting"
    if w.state == "failed":
        return f"{w.label}  failed    {p.get('error', '?')} ({ago(p.get('updated'))})"
    where = f"{p.get('host', '?')} pid {p.get('pid', '?')}"
    line = f"{w.label}  {w.state:<8}  {describe(p)} (updated {ago(p.get('updated'))}, {where})"
    return line + (": its process is gone" if w.state == "stopped" else "")


def session_line(state: RunState, run_dir: str | Path, finished: bool) -> str | None:
    """How the last session ended, and what to do about it."""
    last = state.sessions[-1] if state.sessions else {}
    resume = f"`allocator walk-forward --resume {run_dir}` continues it"
    if last.get("outcome") == "failed":
        return f"the run failed ({ago(last.get('ended'))}): {last.get('error', '?')}; {resume}"
    if last.get("outcome") == "stopped":
        return f"the run was stopped ({ago(last.get('ended'))}); {resume}"
    if finished or last.get("outcome") == "finished":
        return None
    return f"if no process runs it any more, {resume}"


def status_report(run_dir: str | Path) -> dict[str, Any]:
    """What ``allocator walk-forward status --json`` prints: the text's facts, as data."""
    state, windows, finished = run_status(run_dir)
    return {
        "run": state.name,
        "run_dir": str(run_dir),
        "run_id": state.run_id,
        "database": state.database,
        "finished": finished,
        "windows": [asdict(w) for w in windows],
        "resumed": sum(bool(s.get("resumed")) for s in state.sessions),
        "advice": session_line(state, run_dir, finished),
    }


def format_status(run_dir: str | Path) -> str:
    """The text ``allocator walk-forward status`` prints."""
    state, windows, finished = run_status(run_dir)
    counts = {s: sum(w.state == s for w in windows) for s in STATES}
    head = f"{state.name}: {counts['done']} of {len(windows)} windows done"
    for s in ("running", "stopped", "failed"):
        if counts[s]:
            head += f", {counts[s]} {s}"
    if state.run_id is not None:
        head += f" (run row {state.run_id} in {state.database})"
    lines = [head, *("  " + window_line(w) for w in windows)]
    resumes = sum(bool(s.get("resumed")) for s in state.sessions)
    if resumes:
        lines.append(f"resumed {resumes} time(s)")
    if finished:
        lines.append(f"finished: {Path(run_dir) / SUMMARY_FILE}")
    advice = session_line(state, run_dir, finished)
    if advice:
        lines.append(advice)
    return "\n".join(lines)
