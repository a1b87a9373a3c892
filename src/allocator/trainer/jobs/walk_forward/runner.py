"""The walk-forward driver: plan the windows, run them, record, summarize, report and push.

The driver records every finished window at once (one transaction per window, so a crash keeps
what finished), then the summary, the report folder, and a push to the Pushgateway when one is
configured. A run that fails closes its run row with the error and the number of windows done.
A failed push never loses rows: it is reported in ``WalkForwardResult.push_error``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from allocator.metrics.jobs import JobMetrics, JobPush
from allocator.recording.settings import database_url as default_database_url
from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig
from allocator.trainer.jobs.walk_forward.executors import run_local, run_ray
from allocator.trainer.jobs.walk_forward.report import write_report
from allocator.trainer.jobs.walk_forward.results import WalkForwardResult, WindowResult
from allocator.trainer.jobs.walk_forward.store import WalkForwardStore
from allocator.trainer.jobs.walk_forward.summary import summarize, window_row
from allocator.trainer.jobs.walk_forward.window import WindowJob, plan


def make_label() -> str:
    """A UTC timestamp: unique per run, sortable, valid in a registry version."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")


@dataclass
class RunRows:
    """The open run row of this walk-forward run and the store that writes its windows."""

    store: WalkForwardStore
    run_id: int

    @classmethod
    def start(cls, url: str, name: str, config: WalkForwardConfig) -> RunRows:
        """Check the database has the schema, then open the run row (before any training)."""
        store = WalkForwardStore(url)
        return cls(store, store.start_run(name, config.model_dump(mode="json")))

    def add_window(self, result: WindowResult, row: dict[str, Any]) -> None:
        self.store.add_window(self.run_id, result, row)

    def finish(self, summary: dict[str, Any]) -> None:
        """Close the run row with the summary (or the error) and release the database."""
        self.store.finish_run(self.run_id, summary)
        self.store.close()


def window_stream(config: WalkForwardConfig, jobs: Sequence[WindowJob]) -> Iterator[WindowResult]:
    """The configured executor's results, in the order the windows finish."""
    if config.executor == "ray":
        return run_ray(jobs, config.ray_address, config.ray_workers)
    return run_local(jobs)


def collect_windows(
    config: WalkForwardConfig,
    jobs: Sequence[WindowJob],
    rows: RunRows | None,
    metrics: JobMetrics,
    done: list[WindowResult],
    progress: bool,
) -> None:
    """Run every window, recording each as it finishes, into ``done`` (kept on failure)."""
    stream = window_stream(config, jobs)
    bar = tqdm(total=len(jobs), desc="walk-forward", unit="window", disable=not progress)
    try:
        for result in stream:
            row = window_row(result, config.regimes)
            if rows is not None:
                rows.add_window(result, row)
            metrics.record_window(result.window.label, result.metrics()["sharpe"])
            done.append(result)
            bar.set_postfix_str(f"{result.window.label} sharpe {row['sharpe']:+.2f}")
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
    started = time.perf_counter()
    label = label or make_label()
    out = Path(out_dir) if out_dir else Path(config.output_dir) / f"{config.name}-{label}"
    out.mkdir(parents=True, exist_ok=True)
    jobs = plan(config, out, label)
    url = (config.database_url or default_database_url()) if config.record else None
    rows = RunRows.start(url, f"{config.name}-{label}", config) if url else None
    # One Pushgateway group per walk-forward model.
    pusher = JobPush(config.pushgateway_url, config.job_name, {"model": config.model_name})
    results: list[WindowResult] = []
    try:
        collect_windows(config, jobs, rows, pusher.metrics, results, progress)
    except BaseException as exc:
        if rows is not None:
            rows.finish({"error": f"{type(exc).__name__}: {exc}", "windows_done": len(results)})
        pusher.failed(time.perf_counter() - started)
        raise
    results.sort(key=lambda r: r.window.index)
    summary = summarize(results, config.regimes, config.goals)
    seconds = time.perf_counter() - started
    summary["seconds"] = round(seconds, 2)
    summary["executor"] = config.executor
    if rows is not None:
        rows.finish(summary)
    result = WalkForwardResult(
        label=label,
        config=config,
        out_dir=out,
        windows=results,
        summary=summary,
        run_id=rows.run_id if rows is not None else None,
        database_url=url,
        seconds=seconds,
    )
    result.files = {k: str(v) for k, v in write_report(result, out).items()}
    result.push_error = pusher.succeeded(seconds)
    return result
