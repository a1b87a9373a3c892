"""Walk-forward validation: per window, train -> export -> backtest the export -> record.

Each window (``allocator.trainer.market.windows``) trains a fresh model on its training span only
(``training.train`` fits the observation normalization there too), exports it to the registry
as version ``wf-<label>-w03``, replays the exported ONNX graph through the serving code path on
the unseen test span (``evaluation.replay_exported``) and backtests the baselines on the same
span, assets and costs (fitted baselines see only the training span by default). The trainer's
own validation backtest is pointed at the test span as a torch-path diagnostic; nothing is
selected on it (no early stopping, no checkpoint choice), so it cannot leak.

Windows run one after another in this process (``executor: local``) or as Ray tasks
(``executor: ray``: a local Ray when no address is given, ``ray.init(address=...)`` otherwise;
on a cluster the registry and output folders must be on storage every node shares). A window is
a pure function of its job (seeded per window, torch limited to ``torch_threads`` in both
executors), so both executors give identical metrics. The driver records every finished window
at once (``walk_forward_runs`` / ``walk_forward_windows`` / ``model_versions`` rows, committed
per window, so a crash keeps what finished), then the summary, the report folder, and a push to
the Pushgateway when one is configured. A failed push never loses rows: it is reported in
``WalkForwardResult.push_error``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from allocator.trainer.jobs.evaluation import DEFAULT_BASELINES, BaselineFit
from allocator.trainer.market.data import MarketData, load_dataset
from allocator.trainer.market.windows import Window, WindowSpec, make_windows
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.sim.baselines import BaselineName
from allocator.trainer.training.config import ConfigError, TrainConfig, _key_path, load_job_tree

EQUAL_WEIGHT = BaselineName.EQUAL_WEIGHT.value
REGIMES = ("bull", "bear", "sideways")


class WalkForwardError(RuntimeError):
    """A walk-forward run that cannot start or finish; the message says what to do."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegimeThresholds(_Strict):
    """Market regime of a test window by equal weight's annualized net return over it."""

    bull_above: float = Field(0.10, description="bull when the return is >= this")
    bear_below: float = Field(0.0, description="bear when the return is < this")

    def classify(self, annual_return: float) -> str:
        if annual_return >= self.bull_above:
            return "bull"
        if annual_return < self.bear_below:
            return "bear"
        return "sideways"

    @field_validator("bull_above")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class Goals(_Strict):
    """The fractions of windows we hold the agent to (reported as met or not)."""

    positive_sharpe: float = Field(0.70, ge=0, le=1)
    beats_equal_weight: float = Field(0.60, ge=0, le=1)


class WalkForwardConfig(_Strict):
    """A walk-forward run: the trainer config, the windows, and how to evaluate and record."""

    name: str = Field("walk_forward", pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int | None = Field(None, description="window k trains with seed + k (None: trainer's)")
    trainer: TrainConfig = TrainConfig()
    trainer_source: str | None = Field(None, description="file the trainer config came from")
    windows: WindowSpec
    cost_bps: float = Field(10.0, ge=0, lt=5_000, description="costs of every test backtest")
    baselines: list[str] = Field(default_factory=lambda: list(DEFAULT_BASELINES))
    baseline_fit: BaselineFit = "train"
    baseline_rebalance_every: int = Field(21, ge=1, description="days between refits/rebalances")
    regimes: RegimeThresholds = RegimeThresholds()
    goals: Goals = Goals()
    registry: str = "models"
    model_name: str = Field("allocator-wf", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    output_dir: str = "runs/walk_forward"
    record: bool = True
    database_url: str | None = Field(None, description="None: $DATABASE_URL, else SQLite")
    pushgateway_url: str | None = None
    job_name: str = Field("allocator_walk_forward", min_length=1)
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = Field(None, description="None: start a local Ray")
    ray_workers: int | None = Field(None, ge=1, description="CPUs of a local Ray (None: all)")
    torch_threads: int = Field(1, ge=1, description="torch threads per window, both executors")

    @field_validator("baselines")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        valid = {b.value for b in BaselineName}
        bad = [n for n in names if n not in valid]
        if bad:
            raise ValueError(f"unknown baseline(s) {bad}; choose from {sorted(valid)}")
        if EQUAL_WEIGHT not in names:
            raise ValueError("equal-weight is required: excess Sharpe and regimes use it")
        return list(dict.fromkeys(names))


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: invalid walk-forward configuration"]
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = (
            "trainer." + _key_path(loc[1:])
            if loc and loc[0] == "trainer" and len(loc) > 1
            else _key_path(loc)
        )
        lines.append(f"  {key or '(top level)'}: {err['msg']}")
    return "\n".join(lines)


def load_walk_forward_config(
    path: str | Path, overrides: Sequence[str] | None = None
) -> WalkForwardConfig:
    """Read a walk-forward YAML; ``trainer`` is a trainer YAML path or an inline mapping.

    A trainer path is read relative to the working directory, else to this file's folder, and
    inlined before the other ``--set`` overrides apply, so ``--set trainer.total_timesteps=1000``
    works either way; ``--set trainer=configs/sac_icm.yaml`` swaps the trainer file.
    """
    p = Path(path)
    tree, trainer_file = load_job_tree(p, overrides, "config file")
    if trainer_file is not None:
        tree["trainer_source"] = trainer_file
    try:
        return WalkForwardConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_format_errors(str(p), exc)) from exc


# --- one window ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowJob:
    """Everything a worker needs for one window (absolute paths: workers may run elsewhere)."""

    window: Window
    trainer: TrainConfig
    run_dir: str
    registry: str
    model_name: str
    version: str
    cost_bps: float
    baselines: tuple[str, ...]
    baseline_fit: BaselineFit
    rebalance_every: int
    torch_threads: int


@dataclass
class WindowResult:
    """What one window produced: the exported version, its backtest, the baselines'."""

    window: Window
    version: str
    version_dir: str
    run_dir: str
    algorithm: str
    manifest: dict[str, Any]
    agent: BacktestResult
    baselines: dict[str, BacktestResult]
    icm: dict[str, float] | None
    torch_validation: dict[str, Any]
    train_seconds: float
    seconds: float

    def metrics(self) -> dict[str, float]:
        return self.agent.metrics()

    def baseline_metrics(self) -> dict[str, dict[str, float]]:
        return {name: r.metrics() for name, r in self.baselines.items()}


def universe(trainer: TrainConfig) -> MarketData:
    """The trainer's dataset restricted to its asset list (all assets when it has none)."""
    data = load_dataset(trainer.data.dataset)
    return data.select(trainer.data.assets) if trainer.data.assets else data


def run_window(job: WindowJob) -> WindowResult:
    """Train on the window's training span, export, then evaluate on its test span."""
    import torch

    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(job.torch_threads)  # the same in both executors: same float sums
    try:
        result = _train_export_evaluate(job)
    finally:
        torch.set_num_threads(threads)  # the local executor runs in the caller's process
    result.seconds = time.perf_counter() - started
    return result


def _train_export_evaluate(job: WindowJob) -> WindowResult:
    """``run_window`` without the thread setting and timing."""
    from allocator.serving.loader import load_model
    from allocator.trainer.export.run import export_run
    from allocator.trainer.jobs.evaluation import (
        evaluate_baselines,
        evaluation_assets,
        icm_statistics,
        replay_exported,
    )
    from allocator.trainer.training.run import train

    w, cfg = job.window, job.trainer
    run = train(cfg, Path(job.run_dir))
    version_dir = export_run(run.run_dir, job.registry, name=job.model_name, version=job.version)
    model = load_model(version_dir, prefer_cuda=False)
    data = universe(cfg)
    window = cfg.env.window
    assets = evaluation_assets(data, w.test_start, w.test_end, window, model.max_assets)
    ev = replay_exported(
        model, data, w.test_start, w.test_end, cost_bps=job.cost_bps, assets=assets, name="agent"
    )
    baselines = evaluate_baselines(
        data,
        w.test_start,
        w.test_end,
        cost_bps=job.cost_bps,
        assets=assets,
        names=job.baselines,
        fit=job.baseline_fit,
        train_start=w.train_start,
        train_end=w.train_end,
        window=window,
        rebalance_every=job.rebalance_every,
    )
    icm = None
    if model.icm_session is not None:
        # Reference: the same number of decisions at the end of the training span.
        lo = data.date_index(w.train_start, "left")
        hi = data.date_index(w.train_end, "right")
        ref_start = data.dates[max(lo + window, hi - len(ev.icm_rewards))]
        ref_assets = evaluation_assets(data, ref_start, w.train_end, window, model.max_assets)
        ref = replay_exported(
            model, data, ref_start, w.train_end, cost_bps=job.cost_bps, assets=ref_assets
        )
        icm = icm_statistics(ev.icm_rewards, ref.icm_rewards)
    return WindowResult(
        window=w,
        version=job.version,
        version_dir=str(version_dir),
        run_dir=str(run.run_dir),
        algorithm=cfg.algorithm.name,
        manifest=model.manifest.model_dump(mode="json"),
        agent=ev.result,
        baselines=baselines,
        icm=icm,
        torch_validation=run.summary["validation"].get(cfg.algorithm.name, {}),
        train_seconds=float(run.summary["train_seconds"]),
        seconds=0.0,
    )


def window_trainer_config(config: WalkForwardConfig, window: Window, run_root: Path) -> TrainConfig:
    """The trainer config of one window: its spans, its seed, quiet, one torch setting."""
    base = config.trainer.model_dump(mode="json")
    seed = (config.trainer.seed if config.seed is None else config.seed) + window.index
    dataset = base["data"]["dataset"]
    if dataset != "sp500" and not Path(dataset).is_absolute():
        dataset = str(Path(dataset).resolve())
    base.update(
        name=f"{config.trainer.name}-{window.label}",
        seed=seed,
        torch_threads=config.torch_threads,
        output_dir=str(run_root),
        progress_bar=False,
    )
    base["data"].update(
        dataset=dataset,
        train_start=str(window.train_start),
        train_end=str(window.train_end),
        validation_start=str(window.test_start),
        validation_end=str(window.test_end),
    )
    return TrainConfig.model_validate(base)


# --- executors -----------------------------------------------------------------------------


def run_local(jobs: Sequence[WindowJob]) -> Iterator[WindowResult]:
    """Windows one after another in this process."""
    for job in jobs:
        yield run_window(job)


def run_ray(
    jobs: Sequence[WindowJob], address: str | None = None, workers: int | None = None
) -> Iterator[WindowResult]:
    """Each window a Ray task (1 CPU), yielded as it finishes.

    Without ``address`` a local Ray is started with ``workers`` CPUs (and shut down after);
    with one, ``ray.init(address=address)`` joins that cluster. An already initialized Ray
    (a caller's) is used as it is.
    """
    import ray

    started = False
    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_window)
        pending = [remote.remote(job) for job in jobs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    finally:
        if started:
            ray.shutdown()


# --- summary -------------------------------------------------------------------------------


def _mean(values: Iterable[float]) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return float(statistics.fmean(v)) if v else None


def _median(values: Iterable[float]) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return float(statistics.median(v)) if v else None


def window_row(result: WindowResult, regimes: RegimeThresholds) -> dict[str, Any]:
    """The figures of one window the summary and the report use."""
    m = result.metrics()
    ew = result.baselines[EQUAL_WEIGHT].metrics()
    return {
        "index": result.window.index,
        **result.window.to_dict(),
        "version": result.version,
        "sharpe": m["sharpe"],
        "equal_weight_sharpe": ew["sharpe"],
        "excess_sharpe": m["sharpe"] - ew["sharpe"],
        "turnover": m["turnover"],
        "total_return": m["total_return"],
        "max_drawdown": m["max_drawdown"],
        "equal_weight_annual_return": ew["annual_return"],
        "regime": regimes.classify(ew["annual_return"]),
        "baseline_sharpe": {n: b["sharpe"] for n, b in result.baseline_metrics().items()},
    }


def _stats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    if n == 0:
        keys = ("positive_sharpe", "beats_equal_weight", "median_excess_sharpe")
        return {"windows": 0, **dict.fromkeys((*keys, "mean_turnover", "mean_sharpe"))}
    return {
        "windows": n,
        "positive_sharpe": sum(r["sharpe"] > 0 for r in rows) / n,
        "beats_equal_weight": sum(r["excess_sharpe"] > 0 for r in rows) / n,
        "median_excess_sharpe": _median(r["excess_sharpe"] for r in rows),
        "mean_turnover": _mean(r["turnover"] for r in rows),
        "mean_sharpe": _mean(r["sharpe"] for r in rows),
    }


def summarize(
    results: Sequence[WindowResult], regimes: RegimeThresholds, goals: Goals
) -> dict[str, Any]:
    """Fractions of windows with positive Sharpe and beating equal weight (net Sharpe), the
    median excess Sharpe and mean turnover, overall and per regime, plus the baselines'."""
    rows = [window_row(r, regimes) for r in sorted(results, key=lambda r: r.window.index)]
    overall = _stats(rows)
    names = list(rows[0]["baseline_sharpe"]) if rows else []
    baselines = {
        n: {
            "mean_sharpe": _mean(r["baseline_sharpe"][n] for r in rows),
            "positive_sharpe": (sum(r["baseline_sharpe"][n] > 0 for r in rows) / len(rows)),
        }
        for n in names
    }
    met = {
        key: {
            "target": target,
            "value": overall[key],
            "met": overall[key] is not None and overall[key] >= target,
        }
        for key, target in goals.model_dump().items()
    }
    return {
        **overall,
        "by_regime": {g: _stats([r for r in rows if r["regime"] == g]) for g in REGIMES},
        "regime_thresholds": regimes.model_dump(),
        "baselines": baselines,
        "goals": met,
        "per_window": rows,
    }


# --- recording -----------------------------------------------------------------------------


def _finite(obj: Any) -> Any:
    """JSON columns: NaN/inf as null (Postgres JSONB refuses NaN), numpy scalars as Python."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return _finite(obj.item())
    if isinstance(obj, (dt.date, Path)):
        return str(obj)
    return obj


class WalkForwardStore:
    """The run, window and model-version rows of walk-forward runs (Postgres or SQLite).

    The schema comes from the alembic migrations only; a database without it is refused
    before any window trains.
    """

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine, inspect
        from sqlalchemy.engine import make_url

        self.url = url
        self.engine = create_engine(url)
        shown = make_url(url).render_as_string(hide_password=True)
        try:
            tables = set(inspect(self.engine).get_table_names())
        except Exception as exc:  # any driver error: say where and why
            raise WalkForwardError(f"cannot reach the database {shown}: {exc}") from exc
        missing = {"walk_forward_runs", "walk_forward_windows", "model_versions"} - tables
        if missing:
            raise WalkForwardError(
                f"{shown} lacks table(s) {', '.join(sorted(missing))}: run "
                f"`allocator db upgrade --database-url {shown}` first"
            )

    def start_run(self, name: str, config: dict[str, Any]) -> int:
        from sqlalchemy.orm import Session

        from allocator.recording.schema import WalkForwardRun

        with Session(self.engine) as session, session.begin():
            row = WalkForwardRun(name=name, config=_finite(config))
            session.add(row)
            session.flush()
            return int(row.id)

    def add_window(self, run_id: int, result: WindowResult, row: dict[str, Any]) -> None:
        """The window row and, once per (name, version), the model-version row."""
        from sqlalchemy import null, select
        from sqlalchemy.orm import Session

        from allocator.recording.schema import ModelVersion, WalkForwardWindow

        name = result.manifest.get("export", {}).get("registry_name") or result.manifest["name"]
        with Session(self.engine) as session, session.begin():
            version = session.scalars(
                select(ModelVersion).where(
                    ModelVersion.name == name, ModelVersion.version == result.version
                )
            ).one_or_none()
            if version is None:
                version = ModelVersion(
                    name=name,
                    version=result.version,
                    algorithm=result.algorithm,
                    manifest=_finite(result.manifest),
                    checksums=_finite(result.manifest.get("files", {})),
                )
                session.add(version)
                session.flush()
            w = result.window
            metrics = {
                **result.metrics(),
                **{k: row[k] for k in ("excess_sharpe", "regime", "equal_weight_annual_return")},
                "version": result.version,
                "assets": result.agent.settings["assets"],
                "cost_bps": result.agent.settings["cost_bps"],
                "train_seconds": result.train_seconds,
                "seconds": result.seconds,
                "torch_validation": result.torch_validation,
            }
            session.add(
                WalkForwardWindow(
                    run_id=run_id,
                    index=w.index,
                    train_start=w.train_start,
                    train_end=w.train_end,
                    test_start=w.test_start,
                    test_end=w.test_end,
                    model_version_id=version.id,
                    metrics=_finite(metrics),
                    baseline_metrics=_finite(result.baseline_metrics()),
                    # SQL NULL, not a JSON 'null', when the model has no ICM.
                    icm_stats=null() if result.icm is None else _finite(result.icm),
                )
            )

    def finish_run(self, run_id: int, summary: dict[str, Any]) -> None:
        from sqlalchemy.orm import Session

        from allocator.recording.schema import WalkForwardRun, utcnow

        with Session(self.engine) as session, session.begin():
            row = session.get(WalkForwardRun, run_id)
            assert row is not None
            row.summary = _finite(summary)
            row.finished = utcnow()

    def close(self) -> None:
        self.engine.dispose()


# --- the run -------------------------------------------------------------------------------


@dataclass
class WalkForwardResult:
    """A finished walk-forward run: windows in order, summary, where it was written."""

    label: str
    config: WalkForwardConfig
    out_dir: Path
    windows: list[WindowResult]
    summary: dict[str, Any]
    run_id: int | None = None
    database_url: str | None = None
    push_error: str | None = None
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)


def make_label() -> str:
    """A UTC timestamp: unique per run, sortable, valid in a registry version."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")


def plan(config: WalkForwardConfig, out_dir: Path, label: str) -> list[WindowJob]:
    """The windows over the trainer's data and one job per window."""
    data = universe(config.trainer)
    windows = make_windows(data.dates, config.windows)
    registry = str(Path(config.registry).resolve())
    run_root = (out_dir / "runs").resolve()
    return [
        WindowJob(
            window=w,
            trainer=window_trainer_config(config, w, run_root),
            run_dir=str(run_root / w.label),
            registry=registry,
            model_name=config.model_name,
            version=f"wf-{label}-{w.label}",
            cost_bps=config.cost_bps,
            baselines=tuple(config.baselines),
            baseline_fit=config.baseline_fit,
            rebalance_every=config.baseline_rebalance_every,
            torch_threads=config.torch_threads,
        )
        for w in windows
    ]


def run_walk_forward(
    config: WalkForwardConfig,
    *,
    out_dir: str | Path | None = None,
    label: str | None = None,
    progress: bool = True,
) -> WalkForwardResult:
    """Run every window on the configured executor, record, summarize, report and push."""
    from prometheus_client import CollectorRegistry
    from tqdm.auto import tqdm

    from allocator.metrics.prometheus import JobMetrics, PushError, push
    from allocator.recording.settings import database_url as default_database_url
    from allocator.trainer.jobs.report import write_report

    started = time.perf_counter()
    label = label or make_label()
    out = Path(out_dir) if out_dir else Path(config.output_dir) / f"{config.name}-{label}"
    out.mkdir(parents=True, exist_ok=True)
    jobs = plan(config, out, label)

    url = (config.database_url or default_database_url()) if config.record else None
    store = WalkForwardStore(url) if url else None
    run_id = (
        store.start_run(f"{config.name}-{label}", config.model_dump(mode="json")) if store else None
    )
    registry = CollectorRegistry()
    job_metrics = JobMetrics(registry)
    group = {"model": config.model_name}  # one Pushgateway group per walk-forward model
    results: list[WindowResult] = []
    if config.executor == "ray":
        stream = run_ray(jobs, config.ray_address, config.ray_workers)
    else:
        stream = run_local(jobs)
    bar = tqdm(total=len(jobs), desc="walk-forward", unit="window", disable=not progress)
    try:
        for result in stream:
            row = window_row(result, config.regimes)
            if store is not None and run_id is not None:
                store.add_window(run_id, result, row)
            job_metrics.record_window(result.window.label, result.metrics()["sharpe"])
            results.append(result)
            bar.set_postfix_str(f"{result.window.label} sharpe {row['sharpe']:+.2f}")
            bar.update()
    except BaseException as exc:
        bar.close()
        stream.close()  # a Ray generator shuts its local Ray down
        if store is not None and run_id is not None:
            error = {"error": f"{type(exc).__name__}: {exc}", "windows_done": len(results)}
            store.finish_run(run_id, error)
            store.close()
        if config.pushgateway_url:  # keep the last good run's success time: add, not replace
            job_metrics.observe_duration(time.perf_counter() - started)
            with contextlib.suppress(PushError):  # the window's own error is the one to report
                push(
                    registry,
                    config.pushgateway_url,
                    config.job_name,
                    grouping_key=group,
                    replace=False,
                )
        raise
    bar.close()
    results.sort(key=lambda r: r.window.index)
    summary = summarize(results, config.regimes, config.goals)
    seconds = time.perf_counter() - started
    summary["seconds"] = round(seconds, 2)
    summary["executor"] = config.executor
    if store is not None and run_id is not None:
        store.finish_run(run_id, summary)
        store.close()
    result = WalkForwardResult(
        label=label,
        config=config,
        out_dir=out,
        windows=results,
        summary=summary,
        run_id=run_id,
        database_url=url,
        seconds=seconds,
    )
    result.files = {k: str(v) for k, v in write_report(result, out).items()}
    if config.pushgateway_url:
        job_metrics.observe_duration(seconds)
        job_metrics.mark_success()
        try:
            push(registry, config.pushgateway_url, config.job_name, grouping_key=group)
        except PushError as exc:
            result.push_error = str(exc)
    return result
