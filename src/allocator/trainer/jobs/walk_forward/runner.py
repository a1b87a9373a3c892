"""The walk-forward driver: plan the windows, run them, record, summarize, report and push.

Each finished window is kept at once, first its file (``persist``), then its database row (one
transaction per window), so a crash keeps what finished and ``--resume`` continues from there.
A failed run closes its row with the error and the windows done; a failed push never loses
rows (``WalkForwardResult.push_error``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from allocator.metrics.jobs import JobMetrics, JobPush
from allocator.recording.settings import database_url as default_database_url
from allocator.trainer.jobs.executors import WorkerLostError, fan_out, open_executor
from allocator.trainer.jobs.json_safe import finite
from allocator.trainer.jobs.run_folder import make_label, run_directory
from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig, WalkForwardError
from allocator.trainer.jobs.walk_forward.html_report import write_html_report
from allocator.trainer.jobs.walk_forward.persist import write_window_result
from allocator.trainer.jobs.walk_forward.progress import (
    DONE,
    FAILED,
    ProgressWatcher,
    read_progress,
    utc_now,
    write_progress,
)
from allocator.trainer.jobs.walk_forward.report import write_report
from allocator.trainer.jobs.walk_forward.results import WalkForwardResult, WindowResult
from allocator.trainer.jobs.walk_forward.returns import returns_frame
from allocator.trainer.jobs.walk_forward.significance import run_statistics
from allocator.trainer.jobs.walk_forward.state import RunState, new_state, write_state
from allocator.trainer.jobs.walk_forward.store import WalkForwardStore
from allocator.trainer.jobs.walk_forward.summary import attach_statistics, summarize, window_row
from allocator.trainer.jobs.walk_forward.window import WindowJob, nested, plan, run_window
from allocator.trainer.training.tracking import (
    TrackedRun,
    ended_on_error,
    log_job_finished,
    open_job_run,
)


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
    rows: WalkForwardStore | None  # the run's rows, when it records
    url: str | None
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


def window_stream(
    config: WalkForwardConfig, jobs: Sequence[WindowJob]
) -> Generator[WindowResult, None, None]:
    """The windows' results as they finish; a window whose worker died too often fails the run
    as a ``WalkForwardError``."""
    executor = open_executor(
        config, run_window, lambda job: f"window {job.window.label}", config.retry_exceptions
    )
    try:
        yield from fan_out(executor, jobs)
    except WorkerLostError as exc:
        raise WalkForwardError(str(exc)) from exc


def record_window(metrics: JobMetrics, result: WindowResult) -> None:
    """A window's Sharpe and its training run's saturation watch, for the job's push."""
    run_json = Path(result.run_dir) / "run.json"
    watch = json.loads(run_json.read_text()).get("saturation_watch") if run_json.exists() else None
    metrics.record_window(result.window.label, result.metrics()["sharpe"], watch)


def keep_window(
    session: WalkForwardSession, result: WindowResult, metrics: JobMetrics, done: list[WindowResult]
) -> dict[str, Any]:
    """A finished window: its file (first), its row, its metric; returns its summary row."""
    row = window_row(result, session.config.regimes)
    write_window_result(session.out, result)
    if session.rows is not None:
        session.rows.add_window(result, row)
    record_window(metrics, result)
    done.append(result)
    figures = {k: finite(row[k]) for k in ("sharpe", "excess_sharpe")}
    write_progress(result.run_dir, result.window.label, DONE, **figures)
    return row


def collect_windows(
    session: WalkForwardSession,
    jobs: Sequence[WindowJob],
    metrics: JobMetrics,
    done: list[WindowResult],
    progress: bool,
) -> None:
    """Run ``jobs``, keeping each into ``done`` as it finishes (kept on failure)."""
    stream = window_stream(session.config, jobs)
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

    watcher = ProgressWatcher(
        lambda: list(running.items()), show, since=dt.datetime.now(dt.UTC), enabled=progress
    )
    try:
        with watcher:
            for result in stream:
                row = keep_window(session, result, metrics, done)
                running.pop(result.window.label, None)
                last[0] = f"{result.window.label} sharpe {row['sharpe']:+.2f}"
                bar.set_postfix_str(last[0])
                bar.update()
    except BaseException:
        stream.close()  # a Ray generator shuts its local Ray down
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
        state = new_state(config, label, jobs, rows.run_id if rows else None, url)
        write_state(out, state)
    session = WalkForwardSession(config, out, state, jobs, rows, url, tracked=tracked)
    return complete(session, progress)


def mark_failed(jobs: Sequence[WindowJob], error: str) -> None:
    """Say in their progress files that the windows this session had started will not end."""
    for job in jobs:
        progress = read_progress(job.run_dir)
        if progress is not None and progress.get("phase") not in (DONE, FAILED):
            write_progress(job.run_dir, job.window.label, FAILED, error=error)


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
            mark_failed([j for j in todo if j.window.label not in done], error)
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
        database_url=session.url,
        seconds=seconds,
    )
    files = write_report(result, session.out)
    html = write_html_report(result, files["report"].parent)
    if html is not None:
        files["html"] = html
    result.files = {k: str(v) for k, v in files.items()}
    if session.tracked is not None:
        log_job_finished(session.tracked, summary, list(files.values()))
    result.push_error = pusher.succeeded(seconds)
    session.ended("finished")
    return result
