"""Resumable checkpoints: ``checkpoints/step-N/`` (model, the replay buffer's filled rows, ICM,
best model, ``state.json``) is staged hidden, renamed, then named by ``latest.json``, so a crash
leaves the previous one whole. A resume's random draws differ from an uninterrupted run's."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.save_util import save_to_pkl
from stable_baselines3.common.utils import get_device

from allocator.artifacts.files import atomic_write_text, fsync_path, write_json
from allocator.trainer.agents.algorithms import ALGORITHMS
from allocator.trainer.agents.curiosity import CuriosityReplayBuffer
from allocator.trainer.training.config import TrainConfig
from allocator.trainer.training.run_dir import (
    BEST_ICM_FILE,
    BEST_MODEL_FILE,
    CHECKPOINTS_DIR,
    ICM_FILE,
    MODEL_FILE,
    fresh_path,
)
from allocator.typed_config import ConfigError, flatten

REPLAY_FILE = "replay_buffer.pkl"
STATE_FILE = "state.json"
LATEST_FILE = "latest.json"
PROGRESS_FILE = "progress.csv"
EARLIER_PROGRESS_FILE = "progress.before-resume.csv"
STEP_COLUMN = "time/total_timesteps"
RESUME_FREE_KEYS = frozenset(
    {
        "progress_bar",
        "torch_threads",
        "device",
        "tensorboard",
        "html_report",
        "output_dir",
        "tracking",
    }
)
"""Keys a resumed run may change: where and how visibly it runs, never what it learns."""


class TrainingStoppedError(Exception):
    """Training was asked to stop (a signal) and did, at a checkpoint it wrote on the way out."""

    def __init__(self, run_dir: Path, step: int, checkpoint: Path) -> None:
        super().__init__(f"training stopped at step {step}; checkpoint {checkpoint}")
        self.run_dir, self.step, self.checkpoint = Path(run_dir), step, checkpoint


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint directory and its ``state.json``."""

    path: Path
    state: dict[str, Any]

    @property
    def num_timesteps(self) -> int:
        return int(self.state["num_timesteps"])


def trimmed_buffer(buffer: ReplayBuffer) -> ReplayBuffer:
    """A shallow copy of ``buffer`` fit to pickle: its filled rows only (SB3 pickles the whole
    preallocation), without the ICM and clock ``restore_model`` puts back."""
    clone = copy.copy(buffer)
    if isinstance(clone, CuriosityReplayBuffer):
        clone.curiosity, clone.clock = None, None
    if not buffer.full:
        for name, value in vars(buffer).items():
            if isinstance(value, np.ndarray) and value.shape[:1] == (buffer.buffer_size,):
                setattr(clone, name, value[: buffer.pos])
        clone.buffer_size = buffer.pos
    return clone


def regrown_buffer(buffer: ReplayBuffer, size: int) -> None:
    """Give a trimmed buffer back its ``size`` rows (in place), the filled ones first."""
    if buffer.buffer_size >= size:
        return
    for name, value in list(vars(buffer).items()):
        if isinstance(value, np.ndarray) and value.shape[:1] == (buffer.buffer_size,):
            grown = np.zeros((size, *value.shape[1:]), dtype=value.dtype)
            grown[: len(value)] = value
            setattr(buffer, name, grown)
    buffer.buffer_size = size


def write_checkpoint(run_dir: Path, model: OffPolicyAlgorithm, state: dict[str, Any]) -> Path:
    """Save a checkpoint of ``model`` at its current step; returns its directory."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(exist_ok=True)
    name = f"step-{model.num_timesteps:09d}"
    stage = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}-"))
    try:
        model.save(stage / MODEL_FILE)
        assert model.replay_buffer is not None
        save_to_pkl(stage / REPLAY_FILE, trimmed_buffer(model.replay_buffer))
        icm = getattr(model, "icm", None)
        if icm is not None:
            icm.save(stage / ICM_FILE)
        copy_best(Path(run_dir), stage)
        write_json(stage / STATE_FILE, {**state, "num_timesteps": int(model.num_timesteps)})
        for item in stage.iterdir():
            fsync_path(item)
        os.chmod(stage, 0o755)
        final = fresh_path(root / name)
        os.replace(stage, final)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST_FILE, json.dumps({"dir": final.name}) + "\n")
    for old in root.iterdir():  # older checkpoints, and what a crash left half-written
        if old.name in (final.name, LATEST_FILE):
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    return final


def latest_checkpoint(run_dir: Path) -> Checkpoint:
    """The checkpoint ``checkpoints/latest.json`` names, or a ``ConfigError`` saying why none."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    try:
        path = root / json.loads((root / LATEST_FILE).read_text())["dir"]
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{run_dir}: no checkpoint to resume from (train with checkpoint_every > 0; a run "
            f"that crashed before its first checkpoint must start over): {exc}"
        ) from exc
    return Checkpoint(path, state)


def load_icm(model: BaseAlgorithm, path: Path) -> Any:
    """The model's ICM (None without one) with the state saved at ``path`` loaded into it."""
    icm = getattr(model, "icm", None)
    if icm is not None:
        icm.load_state_dict(th.load(path, map_location=model.device, weights_only=True))
    return icm


def restore_model(config: TrainConfig, env: Any, checkpoint: Checkpoint) -> OffPolicyAlgorithm:
    """The checkpoint's model on ``env``, with its replay buffer and ICM, ready to learn on."""
    model: OffPolicyAlgorithm = ALGORITHMS[config.algorithm.name].load(
        checkpoint.path / MODEL_FILE, env=env, device=get_device(config.device)
    )
    icm = load_icm(model, checkpoint.path / ICM_FILE)
    model.load_replay_buffer(checkpoint.path / REPLAY_FILE)
    buffer = model.replay_buffer
    assert buffer is not None
    regrown_buffer(buffer, max(model.buffer_size // model.n_envs, 1))
    if icm is not None and isinstance(buffer, CuriosityReplayBuffer):
        batches = buffer.batches
        buffer.attach(icm, lambda: model.num_timesteps)
        buffer.batches = batches  # keep the ICM's update cadence where it was
    return model


def copy_best(src: Path, dst: Path) -> None:
    """``src``'s best model (and ICM) into ``dst``; ``dst``'s own go, in case ``src`` has none."""
    for best in (BEST_MODEL_FILE, BEST_ICM_FILE):
        (dst / best).unlink(missing_ok=True)
        if (src / best).is_file():
            shutil.copyfile(src / best, dst / best)


def resume_config(saved: TrainConfig, given: TrainConfig | None, run_dir: Path) -> TrainConfig:
    """The config a resumed run continues with: ``given`` if it matches the run's own but for
    ``RESUME_FREE_KEYS``, else refused naming every differing key."""
    if given is None:
        return saved
    old = flatten(saved.model_dump(mode="json"))
    new = flatten(given.model_dump(mode="json"))
    changed = sorted(
        k
        for k in old.keys() | new.keys()
        if old.get(k) != new.get(k) and k.split(".")[0] not in RESUME_FREE_KEYS
    )
    if changed:
        diffs = ", ".join(f"{k} ({old.get(k)!r} in the run, {new.get(k)!r} given)" for k in changed)
        raise ConfigError(
            f"{run_dir}: cannot resume with a different config; it differs from the run's "
            f"config.yaml in {diffs}. Resume without --config (the run's own config is used), "
            f"changing at most {', '.join(sorted(RESUME_FREE_KEYS))}"
        )
    return given


def keep_progress_before(run_dir: Path, step: int) -> None:
    """Before a resume: set aside the logged rows up to ``step`` (SB3 truncates progress.csv)."""
    frames = [
        pd.read_csv(p)
        for p in (Path(run_dir) / EARLIER_PROGRESS_FILE, Path(run_dir) / PROGRESS_FILE)
        if p.is_file() and p.stat().st_size > 0
    ]
    if not frames:
        return
    rows = pd.concat(frames, ignore_index=True)
    if STEP_COLUMN in rows:
        rows = rows[rows[STEP_COLUMN] <= step]
    rows.to_csv(Path(run_dir) / EARLIER_PROGRESS_FILE, index=False)


def merge_progress(run_dir: Path) -> None:
    """After a resumed run: one progress.csv with the rows of every session, in step order."""
    earlier = Path(run_dir) / EARLIER_PROGRESS_FILE
    if not earlier.is_file():
        return
    current = Path(run_dir) / PROGRESS_FILE
    frames = [pd.read_csv(earlier)]
    if current.is_file() and current.stat().st_size > 0:
        frames.append(pd.read_csv(current))
    pd.concat(frames, ignore_index=True).to_csv(current, index=False)
    earlier.unlink()


class CheckpointCallback(BaseCallback):
    """Writes a resumable checkpoint every ``every`` steps at a rollout's end: the transition
    is stored and its gradient steps not yet taken, so a resume redoes nothing twice."""

    def __init__(
        self, run_dir: Path, every: int, extra_state: Callable[[], dict[str, Any]], last_step: int
    ) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.every = every
        self.extra_state = extra_state
        self.last_step = last_step

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        model: BaseAlgorithm = self.model
        if model.num_timesteps - self.last_step >= self.every:
            assert isinstance(model, OffPolicyAlgorithm)
            write_checkpoint(self.run_dir, model, self.extra_state())
            self.last_step = model.num_timesteps
