"""``run_suite``: the recipe on every draw of every market, fanned out, then one report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.artifacts.files import write_json
from allocator.trainer.jobs.executors import fan_out, open_executor
from allocator.trainer.jobs.json_safe import json_safe
from allocator.trainer.jobs.run_folder import run_directory
from allocator.trainer.jobs.suite.config import SuiteConfig
from allocator.trainer.jobs.suite.job import SuiteJob, job_label, job_trainer, run_job
from allocator.trainer.jobs.suite.report import plot, summarize, table
from allocator.trainer.market.draws import (
    SP500_DEV,
    draw_sets,
    first_draws,
    require_development,
)
from allocator.typed_config import ConfigError


@dataclass(frozen=True)
class SuiteResult:
    """A finished suite: its rows (one per run), the summary per market, the files written."""

    rows: list[dict[str, Any]]
    summary: dict[str, dict[str, Any]]
    table: str
    files: dict[str, Path]
    seconds: float


def market_draws(config: SuiteConfig, kind: str) -> list[int]:
    """The draws ``kind`` runs in the config's mode, refused if the mode may not use them."""
    heldout = config.mode == "heldout"
    count = config.draws_per_market.get(kind, config.draws)
    draws = config.sp500_years if kind == SP500_DEV else first_draws(kind, count, heldout)
    if not heldout:
        require_development(kind, draws, "the suite in development mode")
    else:
        outside = [d for d in draws if d not in draw_sets(kind).held_out]
        if outside:
            raise ConfigError(f"market {kind}: draws {outside} are not held-out draws")
    return draws


def plan(config: SuiteConfig, out_dir: Path) -> list[SuiteJob]:
    """Every (market, draw) run of ``config``, checked against the mode before any trains."""
    recipe = config.trainer.model_dump(mode="json")
    recipe["torch_threads"] = config.torch_threads
    rules = config.rules.model_dump()
    jobs = []
    for kind in config.markets:
        changes = config.market_changes.get(kind, {})
        for draw in market_draws(config, kind):
            trainer = job_trainer(recipe, kind, draw, changes, config.seed_per_draw)
            run_dir = out_dir / "runs" / f"{kind}-{draw}"
            jobs.append(SuiteJob(kind, draw, trainer, rules, str(run_dir), config.seeds))
    return jobs


def run_suite(
    config: SuiteConfig,
    out_dir: str | Path | None = None,
    progress: Callable[[dict[str, Any], int, int], None] | None = None,
) -> SuiteResult:
    """Run the suite and write its report into ``out_dir`` (default: output_dir/name-mode)."""
    out = run_directory(config.output_dir, config.name, out_dir, config.mode)
    jobs = plan(config, out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "suite_config.json", config.model_dump(mode="json"))
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with (out / "rows.jsonl").open("w") as log:
        for row in fan_out(open_executor(config, run_job, job_label), jobs):
            rows.append(row)
            log.write(json.dumps(json_safe(row)) + "\n")
            log.flush()
            if progress is not None:
                progress(row, len(rows), len(jobs))
    order = {(job.kind, job.draw): i for i, job in enumerate(jobs)}
    rows.sort(key=lambda r: order[(r["market"], r["draw"])])
    summary = summarize(rows, config.min_gap, config.bootstrap_reps)
    text = table(summary)
    seconds = time.perf_counter() - started
    files = {"json": out / "suite.json", "table": out / "table.md", "plot": out / "suite.png"}
    document = {
        "name": config.name,
        "mode": config.mode,
        "recipe": config.trainer_source or config.trainer.name,
        "seconds": seconds,
        "summary": summary,
        "rows": rows,
    }
    write_json(files["json"], document)
    files["table"].write_text(text + "\n")
    plot(summary, rows, files["plot"])
    return SuiteResult(rows, summary, text, files, seconds)
