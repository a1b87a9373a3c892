"""Per-window progress files of a walk-forward run: what ``status`` and the progress bar show
while a window trains, including the inner-span score when selection is on."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from allocator.trainer.jobs.walk_forward.progress import (
    PROGRESS_FILE,
    describe,
    inner_score,
    progress_line,
    read_progress,
    write_progress,
)
from allocator.trainer.training.run_dir import SELECTION_FILE


def test_progress_shows_steps_reward_and_the_inner_score(tmp_path: Path) -> None:
    write_progress(tmp_path, "w03", "training", steps=1200, total=5000, reward=-0.0123)
    progress = read_progress(tmp_path)
    assert progress is not None
    assert describe(progress) == "1,200/5,000 steps (24%), reward -0.0123"
    (tmp_path / SELECTION_FILE).write_text(
        json.dumps(
            {
                "metric": "sharpe",
                "best_score": 1.5,
                "evaluations": [{"step": 500, "score": 1.5}, {"step": 1000, "score": 0.25}],
            }
        )
    )
    score = inner_score(tmp_path)
    assert score == {
        "inner_metric": "sharpe",
        "inner_score": 0.25,
        "inner_step": 1000,
        "best_inner_score": 1.5,
    }
    write_progress(tmp_path, "w03", "training", steps=1300, **score)
    again = read_progress(tmp_path)
    assert again is not None
    assert again["started"] == progress["started"]
    assert describe(again) == "1,300/5,000 steps (26%), reward -0.0123, inner sharpe +0.25"
    (tmp_path / PROGRESS_FILE).write_text("{half a fi")
    assert read_progress(tmp_path) is None


def test_the_watcher_shows_only_this_sessions_running_windows(tmp_path: Path) -> None:
    old, new = tmp_path / "w00", tmp_path / "w01"
    write_progress(old, "w00", "training", steps=10, total=100)
    stale = read_progress(old)
    assert stale is not None
    stale["updated"] = "2000-01-01T00:00:00+00:00"  # left by a killed session
    (old / PROGRESS_FILE).write_text(json.dumps(stale))
    write_progress(new, "w01", "training", steps=40, total=100)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    assert progress_line([("w00", str(old)), ("w01", str(new))], since) == "w01 40%"
