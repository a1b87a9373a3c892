"""``--resume RUN_DIR``: finish a killed or failed walk-forward run without retraining the
windows that finished.

A window is finished when its result file, its registry version and its training run are all
whole; it is taken from its file as it was, the others run again (``window``). The run keeps
its label, directory and run row (reopened; rows of rerun windows replaced). Only the keys of
``RESUME_FREE`` (how and where windows run, never what they compute) may differ from the run's
config; without a config of its own, a resume uses the run's with the ``--set`` overrides."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig, WalkForwardError
from allocator.trainer.jobs.walk_forward.persist import read_window_result, window_file
from allocator.trainer.jobs.walk_forward.progress import (
    DONE,
    FAILED,
    read_progress,
    utc_now,
    writer_alive,
)
from allocator.trainer.jobs.walk_forward.results import WalkForwardResult, WindowResult
from allocator.trainer.jobs.walk_forward.runner import WalkForwardSession, complete, database_url
from allocator.trainer.jobs.walk_forward.state import (
    STATE_FILE,
    ResumeError,
    RunState,
    plan_payload,
    read_state,
    write_state,
)
from allocator.trainer.jobs.walk_forward.store import WalkForwardStore
from allocator.trainer.jobs.walk_forward.summary import window_row
from allocator.trainer.jobs.walk_forward.window import (
    WindowJob,
    finished_training,
    nested,
    plan,
    whole,
)
from allocator.trainer.training.config import UNION_TAGS
from allocator.trainer.training.tracking import open_job_run
from allocator.typed_config import apply_overrides, flatten, validate

RESUME_FREE = frozenset(
    {
        "executor",
        "ray_address",
        "workers",
        "retries",
        "retry_exceptions",
        "progress_every",
        "trainer_source",
        "trainer.tracking",
    }
)
"""Config keys a resume may change: where and how the windows run, never what they compute."""


def config_differences(run: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The dotted keys whose values differ, outside ``RESUME_FREE``: (key, run's, now)."""
    a, b = flatten(run), flatten(now)
    missing = object()
    keys = sorted(set(a) | set(b))
    return [
        (k, a.get(k, missing), b.get(k, missing))
        for k in keys
        if not any(k == free or k.startswith(f"{free}.") for free in RESUME_FREE)
        and a.get(k, missing) != b.get(k, missing)
    ]


def check_same_config(state: RunState, config: WalkForwardConfig, run_dir: Path) -> None:
    """Refuse a config that would compute something else than the run did, naming the key."""
    source = str(run_dir / STATE_FILE)
    run = validate(WalkForwardConfig, copy.deepcopy(state.config), source, tags=UNION_TAGS)
    diffs = config_differences(run.model_dump(mode="json"), config.model_dump(mode="json"))
    if not diffs:
        return
    shown = ", ".join(f"{k} (run: {a!r}, now: {b!r})" for k, a, b in diffs[:5])
    more = f" and {len(diffs) - 5} more" if len(diffs) > 5 else ""
    raise ResumeError(
        f"cannot resume {run_dir}: the config differs from the run's at {shown}{more}; only "
        f"{', '.join(sorted(RESUME_FREE - {'trainer_source'}))} may change on a resume (leave "
        "out --config to use the run's own)"
    )


def resume_config(
    state: RunState, run_dir: Path, config: WalkForwardConfig | None, overrides: Sequence[str]
) -> WalkForwardConfig:
    """The config given, else the run's with ``overrides``; checked against the run's."""
    if config is None:
        source = str(run_dir / STATE_FILE)
        tree = apply_overrides(copy.deepcopy(state.config), overrides, source)
        config = validate(WalkForwardConfig, tree, source, tags=UNION_TAGS)
    check_same_config(state, config, run_dir)
    return config


def check_plan(state: RunState, jobs: Sequence[WindowJob], run_dir: Path) -> None:
    """Refuse when the same config now cuts other windows (the data or working directory
    changed)."""
    now = plan_payload(jobs)
    for key in ("registry", "dataset", "windows"):
        if now[key] != state.plan.get(key):
            raise ResumeError(
                f"cannot resume {run_dir}: the {key} resolves differently than when the run "
                f"started (run: {state.plan.get(key)!r}, now: {now[key]!r}); resume from the "
                "directory the run was started in, with the same data"
            )


def check_not_running(jobs: Sequence[WindowJob], run_dir: Path) -> None:
    """Refuse while a process of this machine still works on one of the run's windows."""
    for job in jobs:
        progress = read_progress(job.run_dir)
        if progress is None or progress.get("phase") in (DONE, FAILED):
            continue
        if writer_alive(progress):
            raise ResumeError(
                f"cannot resume {run_dir}: window {job.window.label} is still being worked on "
                f"by process {progress['pid']} on this machine; stop that run first"
            )


def kept_window(out: Path, job: WindowJob) -> WindowResult | None:
    """A window's kept result when every artifact of it is whole, else None (it reruns)."""
    path = window_file(out, job.window.label)
    if not path.is_file():
        return None
    try:
        result = read_window_result(path)
    except WalkForwardError:
        return None
    same = result.window == job.window and result.version == job.version
    if not same or not whole(job.version_dir) or finished_training(job.run_dir) is None:
        return None
    return result


def reopen_rows(
    url: str, state: RunState, kept: Sequence[WindowResult], config: WalkForwardConfig
) -> tuple[WalkForwardStore, dict[str, Any] | None]:
    """The run's row, running again, with exactly the kept windows' rows; and the summary the
    previous session closed it with (None: killed)."""
    if state.run_id is None:
        raise ResumeError(f"{state.name} recorded no run row; it cannot resume with record on")
    rows = WalkForwardStore(url)
    previous = rows.reopen_run(state.run_id, state.name)
    recorded = rows.window_indices()
    rows.drop_windows(recorded - {r.window.index for r in kept})
    for result in kept:
        if result.window.index not in recorded:
            rows.add_window(result, window_row(result, config.regimes))
    return rows, previous


def previous_outcome(closed: dict[str, Any] | None) -> dict[str, Any] | str | None:
    """How the previous session ended: its error, ``finished``, or None (killed, or no row)."""
    if closed is None:
        return None
    if "error" in closed:
        return {k: closed[k] for k in ("error", "windows_done") if k in closed}
    return "finished"


def resume_walk_forward(
    run_dir: str | Path,
    config: WalkForwardConfig | None = None,
    overrides: Sequence[str] = (),
    *,
    progress: bool = True,
) -> WalkForwardResult:
    """Finish the run in ``run_dir``: keep its finished windows, run the others, report."""
    out = Path(run_dir)
    state = read_state(out)
    config = resume_config(state, out, config, overrides)
    jobs = plan(config, out, state.label)
    check_plan(state, jobs, out)
    check_not_running(jobs, out)
    tracked = open_job_run(config.trainer.tracking, out, state.name, config.model_dump(mode="json"))
    jobs = nested(jobs, tracked)
    kept = [r for r in (kept_window(out, job) for job in jobs) if r is not None]
    url = database_url(config)
    rows, previous = reopen_rows(url, state, kept, config) if url else (None, None)
    kept_labels = [r.window.label for r in kept]
    entry = {
        "started": utc_now(),
        "resumed": True,
        "kept": kept_labels,
        "rerun": [j.window.label for j in jobs if j.window.label not in kept_labels],
        "previous": previous_outcome(previous),
    }
    state.sessions.append(entry)
    write_state(out, state)
    session = WalkForwardSession(config, out, state, jobs, rows, url, kept, tracked=tracked)
    return complete(session, progress)
