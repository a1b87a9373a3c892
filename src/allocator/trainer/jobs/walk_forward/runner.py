"""The walk-forward driver: plan the windows, run them, record, summarize, report and push.

Each finished window is kept at once (its file, then its row), so a crash keeps what finished and
``--resume RUN_DIR`` reruns only the rest; only ``RESUME_FREE`` keys may differ on a resume."""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from allocator.metrics.jobs import JobMetrics, JobPush
from allocator.recording.settings import database_url as default_database_url
from allocator.recording.settings import shown_url
from allocator.trainer.jobs.executors import WorkerLostError, fan_out, open_executor
from allocator.trainer.jobs.json_safe import finite, read_json_object
from allocator.trainer.jobs.run_folder import make_label, run_directory
from allocator.trainer.jobs.walk_forward.config import (
    RESUME_FREE,
    WalkForwardConfig,
    WalkForwardError,
    config_differences,
)
from allocator.trainer.jobs.walk_forward.progress import (
    DONE,
    FAILED,
    read_progress,
    utc_now,
    watching,
    write_progress,
    writer_alive,
)
from allocator.trainer.jobs.walk_forward.report import write_report
from allocator.trainer.jobs.walk_forward.rundir import (
    STATE_FILE,
    ResumeError,
    RunState,
    WalkForwardResult,
    WindowResult,
    read_state,
    read_window_result,
    returns_frame,
    window_file,
    write_state,
    write_window_result,
)
from allocator.trainer.jobs.walk_forward.store import WalkForwardStore
from allocator.trainer.jobs.walk_forward.summary import (
    attach_statistics,
    run_statistics,
    summarize,
    window_row,
)
from allocator.trainer.jobs.walk_forward.window import (
    WindowJob,
    finished_training,
    nested,
    plan,
    plan_payload,
    run_window,
    whole,
)
from allocator.trainer.training.config import UNION_TAGS
from allocator.trainer.training.run_dir import RUN_SUMMARY_FILE
from allocator.trainer.training.tracking import (
    TrackedRun,
    ended_on_error,
    log_job_finished,
    open_job_run,
)
from allocator.typed_config import apply_overrides, validate


def database_url(config: WalkForwardConfig) -> str | None:
    """Where the run records (None when it does not)."""
    return (config.database_url or default_database_url()) if config.record else None


@dataclass
class WalkForwardSession:
    """One session of a run: what it runs, where it keeps and records it, what it kept."""

    config: WalkForwardConfig
    out: Path
    state: RunState
    jobs: list[WindowJob]
    rows: WalkForwardStore | None  # the run's rows (and their database), when it records
    kept: list[WindowResult] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    tracked: TrackedRun | None = None  # the MLflow run the windows' runs nest under

    def ended(self, outcome: str, error: str | None = None) -> None:
        """Note in ``walk_forward.json`` how this session ended (``status`` shows it)."""
        entry = self.state.sessions[-1]
        entry.update(ended=utc_now(), outcome=outcome)
        if error is not None:
            entry["error"] = error
        write_state(self.out, self.state)


def record_window(metrics: JobMetrics, result: WindowResult) -> None:
    """A window's Sharpe and its training run's saturation watch, for the job's push."""
    run = read_json_object(Path(result.run_dir) / RUN_SUMMARY_FILE) or {}
    watch = run.get("saturation_watch")
    metrics.record_window(result.window.label, result.metrics()["sharpe"], watch)


def collect_windows(
    session: WalkForwardSession,
    jobs: Sequence[WindowJob],
    metrics: JobMetrics,
    done: list[WindowResult],
    progress: bool,
) -> None:
    """Run ``jobs``, keeping each into ``done`` as it finishes (kept on failure): its file
    first, then its row, its metric and its progress file's ``done``."""
    config = session.config
    executor = open_executor(
        config, run_window, lambda job: f"window {job.window.label}", config.retry_exceptions
    )
    stream = fan_out(executor, jobs)
    bar = tqdm(
        total=len(session.jobs),
        initial=len(done),
        desc="walk-forward",
        unit="window",
        disable=not progress,
    )
    running = {j.window.label: j.run_dir for j in jobs}
    last = [""]

    def show(line: str) -> None:
        bar.set_postfix_str(f"{line} | {last[0]}" if last[0] else line)

    since = dt.datetime.now(dt.UTC)
    try:
        with watching(lambda: list(running.items()), show, since=since, enabled=progress):
            for result in stream:
                row = window_row(result, config.regimes)
                write_window_result(session.out, result)
                if session.rows is not None:
                    session.rows.add_window(result, row)
                record_window(metrics, result)
                done.append(result)
                figures = {k: finite(row[k]) for k in ("sharpe", "excess_sharpe")}
                write_progress(result.run_dir, result.window.label, DONE, **figures)
                running.pop(result.window.label, None)
                last[0] = f"{result.window.label} sharpe {row['sharpe']:+.2f}"
                bar.set_postfix_str(last[0])
                bar.update()
    except BaseException as exc:
        stream.close()  # a Ray generator shuts its local Ray down
        if isinstance(exc, WorkerLostError):
            raise WalkForwardError(str(exc)) from exc
        raise
    finally:
        bar.close()


def run_walk_forward(
    config: WalkForwardConfig,
    *,
    out_dir: str | Path | None = None,
    label: str | None = None,
    progress: bool = True,
) -> WalkForwardResult:
    """Run every window on the configured executor, record, summarize, report and push."""
    label = label or make_label()
    out = run_directory(config.output_dir, config.name, out_dir, label)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{config.name}-{label}"
    jobs = plan(config, out, label)
    tracked = open_job_run(config.trainer.tracking, out, name, config.model_dump(mode="json"))
    jobs = nested(jobs, tracked)
    with ended_on_error(tracked):  # a database refused: no MLflow run left running
        url = database_url(config)
        rows = WalkForwardStore(url) if url else None
        if rows is not None:
            rows.start_run(name, config.model_dump(mode="json"))
        state = RunState(
            label=label,
            name=name,
            config=config.model_dump(mode="json"),
            run_id=rows.run_id if rows else None,
            database=shown_url(url) if url else None,
            plan=plan_payload(jobs),
            sessions=[{"started": utc_now(), "resumed": False}],
        )
        write_state(out, state)
    return complete(WalkForwardSession(config, out, state, jobs, rows, tracked=tracked), progress)


def open_windows(jobs: Sequence[WindowJob]) -> list[tuple[WindowJob, dict[str, Any]]]:
    """The jobs whose progress file says they started and did not end, with that file."""
    opened = [(job, read_progress(job.run_dir)) for job in jobs]
    return [(j, p) for j, p in opened if p is not None and p.get("phase") not in (DONE, FAILED)]


def complete(session: WalkForwardSession, progress: bool) -> WalkForwardResult:
    """Run the windows the session has not kept, then summarize, report and push the run."""
    config = session.config
    # One Pushgateway group per walk-forward model.
    pusher = JobPush(config.pushgateway_url, config.job_name, {"model": config.model_name})
    results = sorted(session.kept, key=lambda r: r.window.index)
    for kept in results:
        record_window(pusher.metrics, kept)
    kept_labels = {r.window.label for r in results}
    todo = [j for j in session.jobs if j.window.label not in kept_labels]
    rows = session.rows
    try:
        collect_windows(session, todo, pusher.metrics, results, progress)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        if rows is not None:
            rows.finish_run({"error": error, "windows_done": len(results)})
        done = {r.window.label for r in results}
        with contextlib.suppress(OSError):  # the run's own error is the one to report
            # the windows this session started will not end: their progress files say so
            for job, _ in open_windows([j for j in todo if j.window.label not in done]):
                write_progress(job.run_dir, job.window.label, FAILED, error=error)
            # Ctrl-C, or SIGTERM where the caller turned it into one (the CLI does)
            session.ended("stopped" if isinstance(exc, KeyboardInterrupt) else "failed", error)
        pusher.failed(time.perf_counter() - session.started)
        if session.tracked is not None:
            session.tracked.end("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    results.sort(key=lambda r: r.window.index)
    summary = summarize(results, config.regimes, config.goals)
    statistics = run_statistics(
        returns_frame(results), config.statistics, config.configurations_tried
    )
    attach_statistics(summary, statistics)
    seconds = time.perf_counter() - session.started
    summary["seconds"] = round(seconds, 2)
    summary["executor"] = config.executor
    resumed = [entry for entry in session.state.sessions if entry.get("resumed")]
    if resumed:
        summary["resumed"] = resumed
    if rows is not None:
        rows.finish_run(summary)
    result = WalkForwardResult(
        label=session.state.label,
        config=config,
        out_dir=session.out,
        windows=results,
        summary=summary,
        run_id=rows.run_id if rows is not None else None,
        database_url=rows.url if rows is not None else None,
        seconds=seconds,
    )
    files = write_report(result, session.out)
    result.files = {k: str(v) for k, v in files.items()}
    if session.tracked is not None:
        log_job_finished(session.tracked, summary, list(files.values()))
    result.push_error = pusher.succeeded(seconds)
    session.ended("finished")
    return result


def resume_config(
    state: RunState, run_dir: Path, config: WalkForwardConfig | None, overrides: Sequence[str]
) -> WalkForwardConfig:
    """The config given, else the run's with ``overrides``; refused (naming the key) when it
    would compute something else than the run did."""
    source = str(run_dir / STATE_FILE)
    if config is None:
        tree = apply_overrides(copy.deepcopy(state.config), overrides, source)
        config = validate(WalkForwardConfig, tree, source, tags=UNION_TAGS)
    run = validate(WalkForwardConfig, copy.deepcopy(state.config), source, tags=UNION_TAGS)
    diffs = config_differences(run.model_dump(mode="json"), config.model_dump(mode="json"))
    if not diffs:
        return config
    shown = ", ".join(f"{k} (run: {a!r}, now: {b!r})" for k, a, b in diffs[:5])
    more = f" and {len(diffs) - 5} more" if len(diffs) > 5 else ""
    raise ResumeError(
        f"cannot resume {run_dir}: the config differs from the run's at {shown}{more}; only "
        f"{', '.join(sorted(RESUME_FREE - {'trainer_source'}))} may change on a resume (leave "
        "out --config to use the run's own)"
    )


def check_resumable(state: RunState, jobs: Sequence[WindowJob], run_dir: Path) -> None:
    """Refuse when the same config now cuts other windows (the data or working directory
    changed), or while a process of this machine still works on one of the run's windows."""
    now = plan_payload(jobs)
    for key in ("registry", "dataset", "windows"):
        if now[key] != state.plan.get(key):
            raise ResumeError(
                f"cannot resume {run_dir}: the {key} resolves differently than when the run "
                f"started (run: {state.plan.get(key)!r}, now: {now[key]!r}); resume from the "
                "directory the run was started in, with the same data"
            )
    for job, progress in open_windows(jobs):
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
) -> tuple[WalkForwardStore, dict[str, Any] | str | None]:
    """The run's row, running again, with exactly the kept windows' rows; and how the previous
    session ended: its error, ``finished``, or None (killed)."""
    if state.run_id is None:
        raise ResumeError(f"{state.name} recorded no run row; it cannot resume with record on")
    rows = WalkForwardStore(url)
    closed, recorded = rows.reopen_run(state.run_id, state.name, {r.window.index for r in kept})
    for result in kept:
        if result.window.index not in recorded:
            rows.add_window(result, window_row(result, config.regimes))
    if closed is None or "error" not in closed:
        return rows, None if closed is None else "finished"
    return rows, {k: closed[k] for k in ("error", "windows_done") if k in closed}


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
    check_resumable(state, jobs, out)
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
        "previous": previous,
    }
    state.sessions.append(entry)
    write_state(out, state)
    session = WalkForwardSession(config, out, state, jobs, rows, kept, tracked=tracked)
    return complete(session, progress)
