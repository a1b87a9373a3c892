"""How far each window is while it runs: ``window_progress.json`` in its run directory.

The worker writes it (so it works under every executor): steps, recent reward and inner-span
score while training, then the export and evaluation phases; the driver marks it ``done`` once
it has kept the window. It is replaced atomically, and read by the driver's progress bar and by
``allocator walk-forward status`` from any shell that sees the run directory."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import safe_mean

from allocator.artifacts.files import atomic_write_text
from allocator.trainer.jobs.json_safe import finite
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
    try:
        payload = json.loads((Path(run_dir) / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


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


def describe(progress: dict[str, Any] | None) -> str:
    """One line for a running window: its phase and, while training, its step count."""
    if not progress:
        return "starting"
    phase = str(progress.get("phase", "?"))
    if phase != TRAINING or not progress.get("total"):
        return phase
    steps, total = int(progress.get("steps", 0)), int(progress["total"])
    text = f"{steps:,}/{total:,} steps ({steps / total:.0%})"
    if progress.get("reward") is not None:
        text += f", reward {progress['reward']:+.4g}"
    if progress.get("inner_score") is not None:
        text += f", inner {progress.get('inner_metric')} {progress['inner_score']:+.3g}"
    return text


def short(progress: dict[str, Any] | None) -> str:
    """The running window's step count as the progress bar shows it."""
    if progress and progress.get("phase") == TRAINING and progress.get("total"):
        return f"{int(progress.get('steps', 0)) / int(progress['total']):.0%}"
    return (progress or {}).get("phase", "starting")


def updated_since(progress: dict[str, Any], since: dt.datetime) -> bool:
    """Whether a progress file was written at or after ``since`` (not left by a killed run)."""
    try:
        return dt.datetime.fromisoformat(str(progress["updated"])) >= since.replace(microsecond=0)
    except (KeyError, ValueError, TypeError):
        return False


class ProgressWatcher:
    """A daemon thread that polls the ``running`` windows' progress files every ``interval`` s
    and hands ``show`` one line (``w03 40% w04 12%``). Files older than ``since`` (left by a
    killed session) are not shown."""

    def __init__(
        self,
        running: Callable[[], Sequence[tuple[str, str]]],
        show: Callable[[str], None],
        *,
        since: dt.datetime,
        interval: float = 2.0,
        enabled: bool = True,
    ) -> None:
        self.running, self.show, self.interval = running, show, interval
        self.since, self.enabled = since, enabled
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="walk-forward-progress", daemon=True)

    def line(self) -> str:
        parts = []
        for label, run_dir in self.running():
            progress = read_progress(run_dir)
            if progress is not None and updated_since(progress, self.since):
                parts.append(f"{label} {short(progress)}")
        return " ".join(parts)

    def loop(self) -> None:
        while not self.stop_event.wait(self.interval):
            line = self.line()
            if line:
                self.show(line)

    def __enter__(self) -> ProgressWatcher:
        if self.enabled:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=self.interval + 5)
