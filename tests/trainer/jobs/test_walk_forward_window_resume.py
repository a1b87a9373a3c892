"""A window run again redoes only what is missing: a training run cut short continues from its
last checkpoint (when the trainer writes them), and a finished run whose export was lost is
exported again, not retrained. The run-level ``--resume`` tests are in
``test_walk_forward_resume``."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from allocator.trainer.jobs.walk_forward.config import RegimeThresholds
from allocator.trainer.jobs.walk_forward.progress import read_progress
from allocator.trainer.jobs.walk_forward.rundir import result_from, result_payload
from allocator.trainer.jobs.walk_forward.summary import window_row
from allocator.trainer.jobs.walk_forward.window import WindowJob, plan, run_window, whole
from allocator.trainer.training.checkpointing import TrainingStoppedError, latest_checkpoint
from allocator.trainer.training.run import train
from allocator.trainer.training.run_dir import MODEL_FILE, RUN_SUMMARY_FILE
from tests.trainer.jobs.helpers import tiny
from tests.trainer.training.test_resume import AskToStopAt

TOTAL = 300  # trainer.total_timesteps of the tiny config
CUT = 150  # where the first attempt is stopped, between the checkpoints at 100 and 200


def first_window(tmp: Path, *extra: str) -> WindowJob:
    return plan(tiny(tmp, "record=false", *extra), tmp / "out", "R")[0]


def cut_short(job: WindowJob) -> int:
    """Train the window's run until ``CUT`` and stop there, as a killed attempt would leave it."""
    stop = threading.Event()
    with pytest.raises(TrainingStoppedError) as stopped:
        train(job.trainer, Path(job.run_dir), callbacks=[AskToStopAt(stop, CUT)], stop=stop)
    return stopped.value.step


def test_a_window_cut_short_continues_from_its_checkpoint(tmp_path: Path) -> None:
    job = first_window(tmp_path, "trainer.checkpoint_every=100")
    step = cut_short(job)
    run_dir = Path(job.run_dir)
    assert latest_checkpoint(run_dir).num_timesteps == step >= CUT
    assert not (run_dir / RUN_SUMMARY_FILE).exists()

    result = run_window(job)

    summary = json.loads((run_dir / RUN_SUMMARY_FILE).read_text())
    assert summary["resumed_from"] == [step]  # continued, not started over
    progress = read_progress(run_dir)
    assert progress is not None
    assert (progress["steps"], progress["resumed_from"]) == (TOTAL, step)
    assert whole(job.version_dir)
    assert result.version == job.version
    assert result.agent.raw_weights.shape[0] > 0
    # the run's summary and its window file name the continuation, not only run.json
    assert window_row(result, RegimeThresholds())["resumed_from"] == [step]
    assert result_from(result_payload(result)).resumed_from == [step]


def test_without_checkpoints_a_window_cut_short_trains_from_scratch(tmp_path: Path) -> None:
    """The default (``checkpoint_every: 0``): what a cut-short attempt left is replaced, and the
    window's figures are an uninterrupted run's."""
    job = first_window(tmp_path)
    cut_short(job)
    result = run_window(job)
    summary = json.loads((Path(job.run_dir) / RUN_SUMMARY_FILE).read_text())
    assert "resumed_from" not in summary
    assert window_row(result, RegimeThresholds())["resumed_from"] == []

    straight = run_window(first_window(tmp_path / "straight"))
    assert result.metrics() == straight.metrics()


def test_a_trained_window_whose_export_was_lost_is_exported_not_retrained(
    tmp_path: Path,
) -> None:
    job = first_window(tmp_path)
    first = run_window(job)
    model = Path(job.run_dir) / MODEL_FILE
    trained = (model.stat().st_ino, model.stat().st_mtime_ns)
    shutil.rmtree(job.version_dir)  # the export, lost

    again = run_window(job)

    assert (model.stat().st_ino, model.stat().st_mtime_ns) == trained
    assert whole(job.version_dir)
    assert again.metrics() == first.metrics()
