"""How far each window is while it runs: ``window_progress.json`` in its run directory.

The worker writes it, so every executor has one; the progress bar and ``allocator walk-forward
status`` read it without a database, and a window whose writing process is gone reads as stopped."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import safe_mean

from allocator.artifacts.files import atomic_write_text
from allocator.trainer.jobs.json_safe import finite, read_json_object
from allocator.trainer.jobs.walk_forward.rundir import (
    RUNS_DIR,
    SUMMARY_FILE,
    RunState,
    read_state,
    window_file,
)
from allocator.trainer.training.run_dir import SELECTION_FILE

PROGRESS_FILE = "window_progress.json"
STARTING, TRAINING, EXPORTING = "starting", "training", "exporting"
EVALUATING, EVALUATED = "evaluating", "evaluated"
DONE, FAILED = "done", "failed"  # written by the driver, not the worker


def utc_now() -> str:
    """Now, as the run's files stamp it (``status`` reads how long ago)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def read_progress(run_dir: str | Path) -> dict[str, Any] | None:
    """A window's progress file, or None when it has none (yet) or it cannot be read."""
    return read_json_object(Path(run_dir) / PROGRESS_FILE)


def write_progress(run_dir: str | Path, label: str, phase: str, **fields: Any) -> None:
    """Replace the window's progress file, keeping what the last one said unless updated."""
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    payload = read_progress(folder) or {"started": utc_now()}
    payload.update(fields, window=label, phase=phase, updated=utc_now())
    payload.update(host=socket.gethostname(), pid=os.getpid())
    atomic_write_text(folder / PROGRESS_FILE, json.dumps(payload, indent=1) + "\n")


def writer_alive(progress: dict[str, Any]) -> bool | None:
    """Whether the process that last wrote a progress file still exists (None: unknowable
    from here, e.g. another machine)."""
    if progress.get("host") != socket.gethostname() or not progress.get("pid"):
        return None
    try:
        os.kill(int(progress["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return None
    return True


def inner_score(run_dir: Path) -> dict[str, Any]:
    """The latest inner-span evaluation of checkpoint selection, when the run has one."""
    try:
        selection = json.loads((run_dir / SELECTION_FILE).read_text())
        last = selection["evaluations"][-1]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return {}
    return {
        "inner_metric": selection.get("metric"),
        "inner_score": finite(last.get("score")),
        "inner_step": last.get("step"),
        "best_inner_score": finite(selection.get("best_score")),
    }


class ProgressCallback(BaseCallback):
    """Writes the window's progress file at the start, every ``every`` steps and at the end."""

    def __init__(self, run_dir: str | Path, label: str, total: int, every: int) -> None:
        super().__init__()
        self.run_dir, self.label = Path(run_dir), label
        self.total, self.every = total, every
        self.last_written = -1

    def write(self) -> None:
        steps = int(self.num_timesteps)
        self.last_written = steps
        episodes = [info["r"] for info in self.model.ep_info_buffer or []]
        write_progress(
            self.run_dir,
            self.label,
            TRAINING,
            steps=steps,
            total=self.total,
            episodes=int(getattr(self.model, "_episode_num", 0)),
            reward=finite(safe_mean(episodes)) if episodes else None,
            **inner_score(self.run_dir),
        )

    def _on_training_start(self) -> None:
        self.write()

    def _on_step(self) -> bool:
        if self.num_timesteps - self.last_written >= self.every:
            self.write()
        return True

    def _on_training_end(self) -> None:
        if self.num_timesteps != self.last_written:
            self.write()


def describe(progress: dict[str, Any] | None, brief: bool = False) -> str:
    """One line for a running window: its phase and, while training, its step count (only
    the share done when ``brief``, as the progress bar shows it)."""
    if not progress:
        return "starting"
    phase = str(progress.get("phase", "?"))
    if phase != TRAINING or not progress.get("total"):
        return phase
    steps, total = int(progress.get("steps", 0)), int(progress["total"])
    if brief:
        return f"{steps / total:.0%}"
    text = f"{steps:,}/{total:,} steps ({steps / total:.0%})"
    if progress.get("reward") is not None:
        text += f", reward {progress['reward']:+.4g}"
    if progress.get("inner_score") is not None:
        text += f", inner {progress.get('inner_metric')} {progress['inner_score']:+.3g}"
    return text


def progress_line(running: Sequence[tuple[str, str]], since: dt.datetime) -> str:
    """The running windows' progress as the bar shows it (``w03 40% w04 12%``), leaving out
    files older than ``since`` (left by a killed session)."""
    cutoff = since.replace(microsecond=0)
    parts = []
    for label, run_dir in running:
        progress = read_progress(run_dir) or {}
        fresh = False
        with contextlib.suppress(KeyError, ValueError, TypeError):
            fresh = dt.datetime.fromisoformat(str(progress["updated"])) >= cutoff
        if fresh:
            parts.append(f"{label} {describe(progress, brief=True)}")
    return " ".join(parts)


@contextlib.contextmanager
def watching(
    running: Callable[[], Sequence[tuple[str, str]]],
    show: Callable[[str], None],
    *,
    since: dt.datetime,
    interval: float = 2.0,
    enabled: bool = True,
) -> Iterator[None]:
    """While the block runs, ``show`` the ``running`` windows' progress every ``interval`` s."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            line = progress_line(running(), since)
            if line:
                show(line)

    thread = threading.Thread(target=loop, name="walk-forward-progress", daemon=True)
    if enabled:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(timeout=interval + 5)


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
    windows = [window_status(out, f"w{int(w['index']):02d}") for w in state.plan["windows"]]
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
    report = status_report(run_dir)
    windows = [WindowStatus(**w) for w in report["windows"]]
    counts = {s: sum(w.state == s for w in windows) for s in STATES}
    head = f"{report['run']}: {counts['done']} of {len(windows)} windows done"
    head += "".join(f", {counts[s]} {s}" for s in ("running", "stopped", "failed") if counts[s])
    if report["run_id"] is not None:
        head += f" (run row {report['run_id']} in {report['database']})"
    lines = [head, *("  " + window_line(w) for w in windows)]
    if report["resumed"]:
        lines.append(f"resumed {report['resumed']} time(s)")
    if report["finished"]:
        lines.append(f"finished: {Path(run_dir) / SUMMARY_FILE}")
    if report["advice"]:
        lines.append(report["advice"])
    return "\n".join(lines)
