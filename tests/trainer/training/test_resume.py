"""Checkpoints and resume: an interrupted run continues where its last checkpoint left it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from stable_baselines3.common.callbacks import BaseCallback

from allocator.cli import main
from allocator.trainer.agents.icm import IntrinsicCuriosity
from allocator.trainer.agents.noise import annealed_sigma
from allocator.trainer.agents.td3 import SmoothTD3
from allocator.trainer.training.checkpointing import (
    TrainingStoppedError,
    latest_checkpoint,
    resume_config,
)
from allocator.trainer.training.config import TrainConfig, load_config
from allocator.trainer.training.run import TrainingSession, resume, train
from allocator.typed_config import ConfigError
from tests.trainer.tiny import TINY_TRAINING

ROOT = Path(__file__).resolve().parents[3]
SHORT = [
    *TINY_TRAINING,
    "data.train_start=2010-01-01",
    "data.train_end=2013-12-31",
    "data.validation_start=2014-01-01",
    "data.validation_end=2014-06-30",
    "data.assets=[AAPL,AMD,BAC,BBY,CVX]",
    "env.max_assets=5",
    "checkpoint_every=100",
]
TD3 = [
    *SHORT,
    "algorithm.smoothness.mode=adaptive",
    "algorithm.smoothness.lam=0.5",
    "selection.enabled=true",
    "selection.inner_days=60",
    "selection.eval_every=100",
    "selection.patience=0",
]


def interrupted(cfg: TrainConfig, run_dir: Path, at: int) -> TrainingSession:
    """A run stopped at step ``at`` as a crash would stop it (its checkpoints stay)."""
    session = TrainingSession.start(cfg, run_dir)
    session.learn(until=at)
    assert session.model.num_timesteps == at
    return session


def test_a_stopped_run_resumes_from_its_checkpoint_to_total_timesteps(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = load_config(None, TD3)
    leftovers = run_dir / "checkpoints"  # what a crash mid-write leaves: hidden, incomplete
    (leftovers / ".step-000000100-dead").mkdir(parents=True)
    (leftovers / ".latest-dead.json").write_text("{")
    first = interrupted(cfg, run_dir, 250).model.replay_buffer
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "latest.json",
        "step-000000200",
    ]
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.state["replay_buffer_size"] == 200
    # Only the filled rows are pickled: 200 of 200,000 (a full pickle would be ~100 MB).
    assert (checkpoint.path / "replay_buffer.pkl").stat().st_size < 1_000_000

    session = TrainingSession.resume(run_dir)
    model = session.model
    assert model.num_timesteps == 200  # not 0: the step count goes on
    buffer = model.replay_buffer
    assert buffer.size() == 200  # the transitions came back with it, room for the rest too
    assert buffer.buffer_size == cfg.algorithm.buffer_size
    np.testing.assert_array_equal(buffer.observations[:200], first.observations[:200])
    np.testing.assert_array_equal(buffer.rewards[:200], first.rewards[:200])
    assert isinstance(model, SmoothTD3)
    assert model.smooth_lambda == checkpoint.state["smooth_lambda"] != 0.5
    assert session.selection is not None
    assert [e["step"] for e in session.selection.state.evaluations] == [100, 200]

    session.learn(until=230)
    # The noise annealing goes on from the model's own step, not from zero.
    sigma = float(model.action_noise._sigma[0])  # type: ignore[union-attr]
    assert sigma == pytest.approx(annealed_sigma(cfg.noise, 230 / 300))
    session.learn()
    run = session.finish()

    summary = run.summary
    assert summary["timesteps"] == summary["total_timesteps"] == 300
    assert summary["resumed_from"] == [200]
    # 200 transitions from the first session, 99 from the second (the stop at 230 drops one).
    assert summary["replay_buffer_size"] == 299
    assert [e["step"] for e in session.selection.state.evaluations] == [100, 200, 300]
    assert not (run_dir / "checkpoints").exists()  # a finished run needs none
    logged = pd.read_csv(run_dir / "progress.csv")["time/total_timesteps"].dropna()
    assert logged.is_monotonic_increasing
    assert logged.iloc[-1] == 300
    with pytest.raises(ConfigError, match="finished"):
        resume(run_dir)


def test_the_curiosity_module_and_its_buffer_survive_a_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = load_config(ROOT / "configs" / "sac_icm_demo.yaml", [*SHORT, "icm.warmup_steps=100"])
    interrupted(cfg, run_dir, 250)
    checkpoint = latest_checkpoint(run_dir)
    saved = torch.load(checkpoint.path / "icm.pt", weights_only=True)["net"]

    session = TrainingSession.resume(run_dir)
    model = session.model
    icm = model.icm  # type: ignore[attr-defined]
    assert isinstance(icm, IntrinsicCuriosity)
    fresh = IntrinsicCuriosity(icm.obs_dim, icm.action_dim, cfg.icm).net.state_dict()
    for key, value in icm.net.state_dict().items():
        assert torch.equal(value, saved[key]), key
    assert any(not torch.equal(v, fresh[k]) for k, v in icm.net.state_dict().items())
    buffer = model.replay_buffer
    assert buffer.curiosity is icm  # type: ignore[union-attr]
    assert buffer.clock() == 200  # type: ignore[union-attr]
    assert buffer.batches > 0  # type: ignore[union-attr]
    session.learn()
    run = session.finish()
    assert run.summary["timesteps"] == 300
    assert (run_dir / "icm.pt").is_file()


def test_resume_refuses_a_config_that_differs_naming_the_keys(tmp_path: Path) -> None:
    saved = load_config(None, TD3)
    same_run_elsewhere = load_config(None, [*TD3, "progress_bar=true", "torch_threads=2"])
    assert resume_config(saved, same_run_elsewhere, tmp_path) == same_run_elsewhere
    assert resume_config(saved, None, tmp_path) == saved
    other = load_config(None, [*TD3, "algorithm.gamma=0.5", "selection.patience=3"])
    with pytest.raises(ConfigError) as err:
        resume_config(saved, other, tmp_path)
    assert "algorithm.gamma" in str(err.value)
    assert "selection.patience" in str(err.value)
    assert "progress_bar" not in str(err.value).split("changing at most")[0]


def test_a_run_without_a_checkpoint_cannot_be_resumed(tmp_path: Path) -> None:
    cfg = load_config(None, [*TD3, "checkpoint_every=0"])
    interrupted(cfg, tmp_path / "run", 150)
    with pytest.raises(ConfigError, match="no checkpoint"):
        resume(tmp_path / "run")


def test_the_cli_resumes_and_refuses_a_changed_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    interrupted(load_config(None, TD3), run_dir, 150)
    refused = CliRunner().invoke(
        main, ["train", "--resume", str(run_dir), "--set", "algorithm.gamma=0.5"]
    )
    assert refused.exit_code == 2
    assert "algorithm.gamma" in refused.output
    done = CliRunner().invoke(main, ["train", "--resume", str(run_dir)])
    assert done.exit_code == 0, done.output
    assert "resumed from step 100" in done.output
    assert json.loads((run_dir / "run.json").read_text())["timesteps"] == 300


KILLED_RUN = """
import sys
from pathlib import Path
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run import train
train(load_config(None, sys.argv[2:]), Path(sys.argv[1]))
"""


@pytest.mark.slow
def test_a_killed_training_process_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = [*TD3, "total_timesteps=3000", "selection.eval_every=500"]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, str(run_dir), *overrides],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    latest = run_dir / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 300
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    done = latest_checkpoint(run_dir).num_timesteps
    assert 0 < done < 3000
    run = resume(run_dir, load_config(None, overrides))
    assert run.summary["timesteps"] == 3000
    assert run.summary["resumed_from"] == [done]
    assert run.summary["replay_buffer_size"] == 3000


class AskToStopAt(BaseCallback):
    """Sets ``event`` during step ``step``, as a signal handler would."""

    def __init__(self, event: threading.Event, step: int) -> None:
        super().__init__()
        self.event, self.step = event, step

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.step:
            self.event.set()
        return True


def test_a_requested_stop_ends_at_a_checkpoint_of_that_step_which_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    stop = threading.Event()
    cfg = load_config(None, TD3)  # periodic checkpoints every 100 steps
    with pytest.raises(TrainingStoppedError) as stopped:
        train(cfg, run_dir, callbacks=[AskToStopAt(stop, 150)], stop=stop)
    assert stopped.value.step == 150
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.path == stopped.value.checkpoint
    assert checkpoint.num_timesteps == 150  # its own, not the periodic one at 100
    assert [e["step"] for e in checkpoint.state["selection"]["evaluations"]] == [100]
    assert not (run_dir / "run.json").exists()  # not finished, so resumable

    run = resume(run_dir)
    assert run.summary["timesteps"] == 300
    assert run.summary["resumed_from"] == [150]


def test_sigterm_stops_the_train_command_at_a_checkpoint_it_can_resume(tmp_path: Path) -> None:
    """A real SIGTERM to ``allocator train`` (a scheduler's stop, a pod eviction): exit 143,
    the step and the resume command on stderr, and a checkpoint of that step although the run
    writes no periodic ones."""
    run_dir = tmp_path / "run"
    overrides = [*SHORT, "checkpoint_every=0", "total_timesteps=1000000"]
    command = [sys.executable, "-m", "allocator.cli", "train", "--run-dir", str(run_dir)]
    for item in overrides:
        command += ["--set", item]
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    progress = run_dir / "progress.csv"
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if progress.exists() and len(progress.read_text().splitlines()) > 1:
            break  # an episode was logged: it is learning
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    checkpoint = latest_checkpoint(run_dir)
    assert 0 < checkpoint.num_timesteps < 1_000_000
    assert f"stopped at step {checkpoint.num_timesteps}" in stderr
    assert f"allocator train --resume {run_dir}" in stderr
    session = TrainingSession.resume(run_dir)
    assert session.model.num_timesteps == checkpoint.num_timesteps
