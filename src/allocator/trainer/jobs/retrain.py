"""Scheduled retraining: train on the latest window, judge the candidate, promote it or not.

What a CronJob runs (``allocator retrain --config configs/retrain.yaml``):

1. Spans, counted in trading days back from ``as_of`` (default: the data's last date): the
   held-out span is the most recent ``holdout_days``; a purge gap of ``purge_days`` separates
   it from the ``train_days`` the candidate is trained on. Nothing in the held-out span is ever
   trained on (normalization included: training fits it on its own span).
2. Train with the trainer config, export the run to ONNX as a *candidate*, into
   ``REGISTRY/.candidates/NAME/VERSION``: hidden from servers, so a rejected model is never
   served, not even as "the newest version" of a registry without a production pointer.
3. Backtest the candidate and the production model (the production pointer's version, else the
   newest version) through the serving code path on the held-out span, same assets, same
   costs; equal weight beside them for reference.
4. Gates (``GateSettings``), each with a reason. All pass: the candidate directory is renamed
   into ``REGISTRY/NAME/VERSION`` and the production pointer moved to it, atomically, so a
   running server switches on its next scan. Any fails: the pointer is left alone.
5. The decision, its reasons and both models' metrics go to the ``promotions`` table (in the
   same transaction as the pointer move: if the record cannot be committed, the pointer and the
   version directory are put back), and to a Pushgateway when one is configured.

Versions name the held-out span's last date, ``YYYYMMDD`` (``YYYYMMDD.N`` for a second run on
the same data): numeric, so ``allocator.serving.loader.version_key`` orders them by date and
after the small integers ``allocator export`` gives by default.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from allocator.artifacts.manifest import MANIFEST_FILE, read_manifest
from allocator.trainer.market.data import DataError, DateLike, MarketData, load_dataset
from allocator.trainer.training.config import (
    ConfigError,
    TrainConfig,
    _key_path,
    load_config,
    load_job_tree,
)

__all__ = [
    "CANDIDATES_DIR",
    "GateResult",
    "GateSettings",
    "RetrainConfig",
    "RetrainDecision",
    "RetrainError",
    "RetrainSpans",
    "apply_gates",
    "candidate_version",
    "load_retrain_config",
    "retrain",
    "retrain_spans",
]

log = logging.getLogger("allocator.retrain")

CANDIDATES_DIR = ".candidates"
"""Where candidates are exported, inside the registry: hidden (a leading dot) from servers."""
_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"


class RetrainError(RuntimeError):
    """The retraining job could not run to a decision; the message says what to fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- configuration -----------------------------------------------------------------------


class GateSettings(_Strict):
    """What a candidate must show on the held-out span to replace production (None: gate off).

    Metrics are net of the configured costs (``allocator.trainer.sim.performance``): Sharpe of daily
    net returns, mean daily turnover as a fraction of NAV, compounded max drawdown.
    """

    max_sharpe_shortfall: float | None = Field(
        0.1, ge=0, description="candidate net Sharpe may trail production's by at most this"
    )
    max_turnover: float | None = Field(
        0.1, gt=0, description="budget on the candidate's mean daily turnover"
    )
    max_drawdown: float | None = Field(
        0.35, gt=0, le=1, description="limit on the candidate's max drawdown (fraction)"
    )
    min_sharpe: float | None = Field(
        None, description="absolute floor on the candidate's net Sharpe"
    )
    max_shortfall_vs_equal_weight: float | None = Field(
        None, ge=0, description="candidate net Sharpe may trail equal weight's by at most this"
    )

    @model_validator(mode="after")
    def _at_least_one(self) -> GateSettings:
        if all(v is None for v in self.model_dump().values()):
            raise ValueError("every gate is off: a candidate would always be promoted")
        return self


class RetrainConfig(_Strict):
    """One retraining job: what to train, on which spans, where it goes, how it is judged."""

    trainer: TrainConfig = Field(description="trainer config: a YAML path or inline settings")
    registry: Path = Field(description="model registry the server follows")
    model_name: str = Field("allocator", pattern=_NAME_PATTERN, description="registry name")
    train_days: int = Field(1260, ge=2, description="trading days trained on")
    purge_days: int = Field(5, ge=0, description="trading days between training and held-out")
    holdout_days: int = Field(252, ge=3, description="most recent trading days, never trained on")
    cost_bps: float | None = Field(
        None, ge=0, description="held-out backtest costs (None: the trainer's env.cost_bps)"
    )
    gates: GateSettings = GateSettings()
    database_url: str | None = Field(
        None, description="trade database (None: DATABASE_URL, else sqlite:///allocator.db)"
    )
    pushgateway_url: str | None = Field(None, description="push job metrics here when set")
    job_name: str = Field("allocator_retrain", min_length=1, description="Pushgateway job")

    @field_validator("trainer", mode="before")
    @classmethod
    def _trainer_from_path(cls, value: Any) -> Any:
        """A string (or path) names a trainer YAML file, read with the trainer's loader."""
        if isinstance(value, str | Path):
            return load_config(value)
        return value

    @property
    def holdout_cost_bps(self) -> float:
        return self.trainer.env.cost_bps if self.cost_bps is None else self.cost_bps


def load_retrain_config(
    path: str | Path | None, overrides: list[str] | None = None
) -> RetrainConfig:
    """Read a retraining YAML (``trainer`` a path or a mapping) and apply ``--set`` overrides.

    Relative registry and dataset paths are taken from the working directory, as the
    trainer's are; a trainer config path from there, else next to this file (see
    ``config.load_job_tree``). ``--set trainer=other.yaml`` swaps the trainer config before any
    ``--set trainer.key=value`` is applied to it.
    """
    source = str(path) if path else "(defaults)"
    tree, trainer_file = load_job_tree(path, overrides, "retrain config")
    if trainer_file:
        source = f"{source} (trainer: {trainer_file})"
    try:
        return RetrainConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from exc


def _format_errors(source: str, exc: ValidationError) -> str:
    """One line per bad key, dotted as the user wrote it (``trainer.algorithm.gamma``)."""
    lines = [f"{source}: invalid configuration"]
    for err in exc.errors():
        loc = tuple(err["loc"])
        if loc[:1] == ("trainer",):
            key = ".".join(["trainer", *filter(None, [_key_path(loc[1:])])])
        else:
            key = _key_path(loc)
        lines.append(f"  {key or '(top level)'}: {err['msg']}")
    return "\n".join(lines)


# --- spans ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrainSpans:
    """Inclusive trading-date spans: train, then a purge gap, then the held-out span."""

    train_start: dt.date
    train_end: dt.date
    holdout_start: dt.date
    holdout_end: dt.date

    def to_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.__dict__.items()}


def retrain_spans(
    dates: pd.DatetimeIndex,
    as_of: DateLike | None,
    *,
    train_days: int,
    purge_days: int,
    holdout_days: int,
    source: str = "data",
) -> RetrainSpans:
    """The spans ending on the last trading date on or before ``as_of`` (None: the last date)."""
    if as_of is None:
        end = len(dates) - 1
    else:
        try:
            stamp = pd.Timestamp(as_of)
        except ValueError as exc:
            raise DataError(f"as-of date {as_of!r} is not a date: {exc}") from exc
        end = int(dates.searchsorted(stamp, "right")) - 1
    if end < 0:
        raise DataError(
            f"{source}: no trading date on or before {as_of} (data starts {dates[0].date()})"
        )
    holdout_start = end - holdout_days + 1
    train_end = holdout_start - purge_days - 1
    train_start = train_end - train_days + 1
    if train_start < 0:
        need = train_days + purge_days + holdout_days
        raise DataError(
            f"{source}: {end + 1} trading dates up to {dates[end].date()}, but retraining needs "
            f"train_days + purge_days + holdout_days = {need}"
        )
    return RetrainSpans(
        dates[train_start].date(),
        dates[train_end].date(),
        dates[holdout_start].date(),
        dates[end].date(),
    )


# --- gates ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict: what was measured, against what, and why it passed or failed."""

    gate: str
    passed: bool
    reason: str
    value: float | None = None
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return _finite(self.__dict__)


def _bad(x: float | None) -> bool:
    return x is None or not math.isfinite(x)


def _at_least(gate: str, what: str, value: float, floor: float, detail: str) -> GateResult:
    if _bad(value):
        return GateResult(gate, False, f"{what} is not a number ({value}): {detail}", value, floor)
    ok = value >= floor
    verdict = "meets" if ok else "is below"
    reason = f"{what} {value:.4f} {verdict} the floor {floor:.4f} ({detail})"
    return GateResult(gate, ok, reason, value, floor)


def _at_most(gate: str, what: str, value: float, ceiling: float, detail: str) -> GateResult:
    if _bad(value):
        return GateResult(
            gate, False, f"{what} is not a number ({value}): {detail}", value, ceiling
        )
    ok = value <= ceiling
    verdict = "is within" if ok else "exceeds"
    reason = f"{what} {value:.4f} {verdict} the limit {ceiling:.4f} ({detail})"
    return GateResult(gate, ok, reason, value, ceiling)


def apply_gates(
    gates: GateSettings,
    candidate: Mapping[str, float],
    production: Mapping[str, float] | None,
    equal_weight: Mapping[str, float] | None = None,
) -> list[GateResult]:
    """Every configured gate on held-out metrics (``BacktestResult.metrics()``), in order.

    With no production model (the first retrain), the comparison passes, saying so: the
    candidate is then judged by the absolute gates alone.
    """
    results: list[GateResult] = []
    sharpe = float(candidate["sharpe"])
    if gates.max_sharpe_shortfall is not None:
        x = gates.max_sharpe_shortfall
        if production is None:
            results.append(
                GateResult(
                    "sharpe_vs_production",
                    True,
                    "no production model to compare with: the absolute gates decide",
                    sharpe,
                )
            )
        elif _bad(float(production["sharpe"])):
            results.append(
                GateResult(
                    "sharpe_vs_production",
                    True,
                    f"production's net Sharpe is not a number ({production['sharpe']}): "
                    "nothing to compare with, the absolute gates decide",
                    sharpe,
                )
            )
        else:
            p = float(production["sharpe"])
            results.append(
                _at_least(
                    "sharpe_vs_production",
                    "net Sharpe",
                    sharpe,
                    p - x,
                    f"production {p:.4f} less the allowed shortfall {x:g}",
                )
            )
    if gates.max_turnover is not None:
        results.append(
            _at_most(
                "turnover",
                "mean daily turnover",
                float(candidate["turnover"]),
                gates.max_turnover,
                "the turnover budget",
            )
        )
    if gates.max_drawdown is not None:
        results.append(
            _at_most(
                "max_drawdown",
                "max drawdown",
                float(candidate["max_drawdown"]),
                gates.max_drawdown,
                "the drawdown limit",
            )
        )
    if gates.min_sharpe is not None:
        results.append(
            _at_least(
                "min_sharpe", "net Sharpe", sharpe, gates.min_sharpe, "the absolute Sharpe floor"
            )
        )
    if gates.max_shortfall_vs_equal_weight is not None:
        if equal_weight is None or _bad(float(equal_weight["sharpe"])):
            results.append(
                GateResult(
                    "sharpe_vs_equal_weight",
                    False,
                    "equal weight's net Sharpe is unavailable: cannot check the candidate "
                    "against it",
                    sharpe,
                )
            )
        else:
            e, x = float(equal_weight["sharpe"]), gates.max_shortfall_vs_equal_weight
            results.append(
                _at_least(
                    "sharpe_vs_equal_weight",
                    "net Sharpe",
                    sharpe,
                    e - x,
                    f"equal weight {e:.4f} less the allowed shortfall {x:g}",
                )
            )
    return results


# --- the decision --------------------------------------------------------------------------


@dataclass
class RetrainDecision:
    """What one retraining job decided, and everything it was decided on."""

    model_name: str
    candidate_version: str
    production_version: str | None
    promoted: bool
    gates: list[GateResult]
    spans: RetrainSpans
    candidate_metrics: dict[str, float]
    production_metrics: dict[str, float] | None
    equal_weight_metrics: dict[str, float] | None
    assets: list[str]
    cost_bps: float
    run_dir: Path
    candidate_dir: Path
    pointer: dict[str, Any] | None = None
    record_id: int | None = None
    seconds: float = 0.0
    push_error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        """One line per gate, ``PASS``/``FAIL`` first."""
        return [f"{'PASS' if g.passed else 'FAIL'} {g.gate}: {g.reason}" for g in self.gates]

    def summary(self) -> str:
        """What the CLI prints: the verdict, the reasons, the metrics side by side."""
        from allocator.trainer.sim.performance import format_table

        verdict = "PROMOTED" if self.promoted else "REJECTED"
        before = self.production_version or "none"
        s = self.spans
        lines = [
            f"{verdict}: {self.model_name}/{self.candidate_version} (production before: {before})",
            f"trained {s.train_start} .. {s.train_end}; held out {s.holdout_start} .. "
            f"{s.holdout_end}; {self.cost_bps:g} bps; {len(self.assets)} assets",
            *self.notes,
            *self.reasons,
            "",
        ]
        rows = {f"candidate {self.candidate_version}": self.candidate_metrics}
        if self.production_metrics is not None:
            rows[f"production {self.production_version}"] = self.production_metrics
        if self.equal_weight_metrics is not None:
            rows["equal-weight"] = self.equal_weight_metrics
        lines.append(format_table(rows))
        lines.append(f"candidate: {self.candidate_dir}")
        if self.record_id is not None:
            lines.append(f"recorded: promotions.id = {self.record_id}")
        return "\n".join(lines)


def _finite(obj: Any) -> Any:
    """JSON-safe copy: NaN and infinities as None (Postgres JSON refuses them), dates as text."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, dt.date | Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _finite(obj.item())
    return obj


# --- registry ------------------------------------------------------------------------------


def _versions(model_dir: Path) -> list[str]:
    """Exported versions of a model (hidden staging and candidate directories excluded)."""
    if not model_dir.is_dir():
        return []
    return [
        p.name
        for p in model_dir.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST_FILE).is_file()
    ]


def _production(registry: Path, name: str) -> tuple[str | None, str]:
    """The version a server answers with now, and how it was chosen (as the server does)."""
    from allocator.serving.loader import version_key
    from allocator.serving.registry import read_production_pointer

    versions = _versions(registry / name)
    pointer = read_production_pointer(registry, name)
    if pointer is not None and pointer["version"] in versions:
        return pointer["version"], "production pointer"
    if not versions:
        return None, "no version in the registry"
    newest = max(versions, key=version_key)
    if pointer is not None:
        return newest, f"newest version (the pointer names {pointer['version']}, not exported)"
    return newest, "newest version (no production pointer)"


def candidate_version(registry: Path, name: str, day: dt.date) -> str:
    """``YYYYMMDD`` of ``day``, or ``YYYYMMDD.N`` if that is taken (served or candidate)."""
    taken = set(_versions(registry / name)) | set(_versions(registry / CANDIDATES_DIR / name))
    taken |= {p.name for p in (registry / name).glob("*")} if (registry / name).is_dir() else set()
    base = f"{day:%Y%m%d}"
    version, n = base, 0
    while version in taken:
        n += 1
        version = f"{base}.{n}"
    return version


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move(src: Path, dst: Path) -> None:
    """Rename a complete version directory (atomic on one file system) and make it durable."""
    if dst.exists():
        raise RetrainError(f"{dst}: already exists; versions are never overwritten")
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.rename(src, dst)
    _fsync_dir(dst.parent)
    _fsync_dir(src.parent)


# --- database ------------------------------------------------------------------------------


def _engine(url: str) -> Any:
    """An engine on the trade database, checked to have the ``promotions`` table."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    shown = sa.engine.make_url(url).render_as_string(hide_password=True)
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        has = sa.inspect(engine).has_table("promotions")
    except sa.exc.SQLAlchemyError as exc:
        engine.dispose()
        raise RetrainError(f"cannot reach the trade database {shown}: {exc}") from exc
    if not has:
        engine.dispose()
        raise RetrainError(
            f"{shown} has no promotions table: run `allocator db upgrade` with DATABASE_URL set "
            "to it (or --database-url) before retraining"
        )
    return engine


class _Rollback:
    """Undo a promotion's file-system steps when its record cannot be committed."""

    def __init__(self, registry: Path, name: str) -> None:
        from allocator.serving.registry import PRODUCTION_FILE

        self.pointer_file = registry / name / PRODUCTION_FILE
        self.saved = self.pointer_file.read_bytes() if self.pointer_file.is_file() else None
        self.moves: list[tuple[Path, Path]] = []

    def undo(self) -> None:
        try:
            if self.saved is None:
                self.pointer_file.unlink(missing_ok=True)
            else:
                tmp = self.pointer_file.with_name(".production-restore.json")
                tmp.write_bytes(self.saved)
                os.replace(tmp, self.pointer_file)
            for src, dst in reversed(self.moves):
                if dst.exists() and not src.exists():
                    os.rename(dst, src)
        except OSError:
            log.exception("retrain: could not undo the promotion's file-system changes")


# --- the job -------------------------------------------------------------------------------


def _universe(config: RetrainConfig) -> MarketData:
    d = config.trainer.data
    data = load_dataset(d.dataset)
    if d.assets:
        if len(d.assets) > config.trainer.env.max_assets:
            raise ConfigError(
                f"trainer.data.assets lists {len(d.assets)} assets but trainer.env.max_assets "
                f"is {config.trainer.env.max_assets}"
            )
        data = data.select(d.assets)
    return data


def _trainer_for(config: RetrainConfig, spans: RetrainSpans) -> TrainConfig:
    """The trainer config with its data spans set to the retraining window."""
    tree = config.trainer.model_dump(mode="json")
    tree["data"].update(
        train_start=str(spans.train_start),
        train_end=str(spans.train_end),
        validation_start=str(spans.holdout_start),
        validation_end=str(spans.holdout_end),
    )
    return TrainConfig.model_validate(tree)


def _holdout_assets(
    data: MarketData, spans: RetrainSpans, model_dirs: list[Path]
) -> tuple[list[str], int]:
    """The assets both models are judged on: priced throughout the held-out span and each
    model's observation window before it, as many as the narrower model has slots."""
    from allocator.trainer.jobs.evaluation import evaluation_assets

    manifests = [read_manifest(d) for d in model_dirs]
    window = max(m.feature_spec.window for m in manifests)
    slots = min(m.max_assets for m in manifests)
    names = evaluation_assets(data, spans.holdout_start, spans.holdout_end, window, slots)
    return names, window


def _push(config: RetrainConfig, decision: RetrainDecision) -> None:
    """Push the job's figures; a failure is reported on the decision, never undoes it."""
    from prometheus_client import CollectorRegistry

    from allocator.metrics.prometheus import JobMetrics, PromotionDecision, PushError, push

    assert config.pushgateway_url is not None
    registry = CollectorRegistry()
    jobs = JobMetrics(registry)
    jobs.record_promotion(
        PromotionDecision.PROMOTED if decision.promoted else PromotionDecision.REJECTED
    )
    jobs.observe_duration(decision.seconds)
    jobs.mark_success()
    try:
        push(
            registry,
            config.pushgateway_url,
            config.job_name,
            grouping_key={"model": config.model_name},
        )
    except PushError as exc:
        log.warning("retrain: %s", exc)
        decision.push_error = str(exc)


def retrain(
    config: RetrainConfig,
    as_of: DateLike | None = None,
    *,
    echo: Callable[[str], None] | None = None,
) -> RetrainDecision:
    """Run the job once (see the module docstring); returns the decision, promoted or not.

    Raises ``RetrainError``, ``DataError``, ``ConfigError`` or ``ExportError`` when no
    decision could be reached; the pointer is then untouched.
    """
    from allocator.recording.settings import database_url as default_database_url
    from allocator.trainer.export.run import export_run
    from allocator.trainer.jobs.evaluation import evaluate_baselines, evaluate_exported
    from allocator.trainer.training.run import train

    say = echo or (lambda line: log.info("%s", line))
    started = time.perf_counter()
    registry, name = Path(config.registry), config.model_name
    engine = _engine(config.database_url or default_database_url())  # fail before training
    try:
        data = _universe(config)
        spans = retrain_spans(
            data.dates,
            as_of,
            train_days=config.train_days,
            purge_days=config.purge_days,
            holdout_days=config.holdout_days,
            source=data.source,
        )
        production, chosen_by = _production(registry, name)
        version = candidate_version(registry, name, spans.holdout_end)
        say(
            f"retrain {name}: train {spans.train_start} .. {spans.train_end}, held out "
            f"{spans.holdout_start} .. {spans.holdout_end}; production: {production or 'none'} "
            f"({chosen_by}); candidate version {version}"
        )

        run = train(_trainer_for(config, spans))
        say(f"trained: {run.run_dir} ({run.summary['train_seconds']} s)")
        candidate_dir = export_run(
            run.run_dir, registry / CANDIDATES_DIR, name=name, version=version
        )
        say(f"exported candidate: {candidate_dir}")

        production_dir = registry / name / production if production else None
        dirs = [candidate_dir] + ([production_dir] if production_dir else [])
        assets, window = _holdout_assets(data, spans, dirs)
        cost = config.holdout_cost_bps
        span = (spans.holdout_start, spans.holdout_end)
        candidate = evaluate_exported(candidate_dir, data, *span, cost_bps=cost, assets=assets)
        candidate_metrics = candidate.metrics()
        production_metrics = None
        if production_dir is not None:
            try:
                judged = evaluate_exported(
                    production_dir, data, *span, cost_bps=cost, assets=assets
                )
            except Exception as exc:
                raise RetrainError(
                    f"production model {production_dir} could not be backtested on the held-out "
                    f"span ({type(exc).__name__}: {exc}); fix or re-point production first"
                ) from exc
            production_metrics = judged.metrics()
        baselines = evaluate_baselines(
            data, *span, cost_bps=cost, assets=assets, names=("equal-weight",), window=window
        )
        equal_weight = baselines["equal-weight"].metrics()

        results = apply_gates(config.gates, candidate_metrics, production_metrics, equal_weight)
        promoted = all(g.passed for g in results)
        decision = RetrainDecision(
            model_name=name,
            candidate_version=version,
            production_version=production,
            promoted=promoted,
            gates=results,
            spans=spans,
            candidate_metrics=candidate_metrics,
            production_metrics=production_metrics,
            equal_weight_metrics=equal_weight,
            assets=assets,
            cost_bps=cost,
            run_dir=run.run_dir,
            candidate_dir=candidate_dir,
            notes=[f"production chosen by: {chosen_by}"],
        )
        _record_and_promote(config, engine, decision, started)
    finally:
        engine.dispose()
    if config.pushgateway_url:
        _push(config, decision)
    return decision


def _record_and_promote(
    config: RetrainConfig,
    engine: Any,
    decision: RetrainDecision,
    started: float,
) -> None:
    """Record the decision; on promotion also publish the version and move the pointer, all
    or nothing: the pointer moves inside the record's transaction and is put back if the
    commit fails."""
    from sqlalchemy.orm import Session

    from allocator.recording.schema import Promotion
    from allocator.serving.registry import write_production_pointer

    registry, name = Path(config.registry), config.model_name
    s = decision.spans
    details = _finite(
        {
            "as_of": s.holdout_end,
            "assets": decision.assets,
            "cost_bps": decision.cost_bps,
            "equal_weight_metrics": decision.equal_weight_metrics,
            "gates": config.gates.model_dump(),
            "run_dir": decision.run_dir,
            "trainer": {
                "name": config.trainer.name,
                "algorithm": config.trainer.algorithm.name,
                "seed": config.trainer.seed,
                "total_timesteps": config.trainer.total_timesteps,
            },
            "notes": decision.notes,
        }
    )
    rollback = _Rollback(registry, name)
    try:
        if decision.promoted:
            target = registry / name / decision.candidate_version
            _move(decision.candidate_dir, target)
            rollback.moves.append((decision.candidate_dir, target))
            decision.candidate_dir = target
        decision.seconds = time.perf_counter() - started
        details["seconds"] = round(decision.seconds, 2)
        details["candidate_dir"] = str(decision.candidate_dir)
        with Session(engine) as session, session.begin():
            row = Promotion(
                model_name=name,
                candidate_version=decision.candidate_version,
                production_version=decision.production_version,
                decided_at=dt.datetime.now(dt.UTC),
                promoted=decision.promoted,
                reasons=[g.to_dict() for g in decision.gates],
                candidate_metrics=_finite(decision.candidate_metrics),
                production_metrics=_finite(decision.production_metrics),
                train_start=s.train_start,
                train_end=s.train_end,
                holdout_start=s.holdout_start,
                holdout_end=s.holdout_end,
                details=details,
            )
            session.add(row)
            session.flush()  # a refused row fails here, before the pointer moves
            decision.record_id = row.id
            if decision.promoted:
                decision.pointer = write_production_pointer(
                    registry,
                    name,
                    decision.candidate_version,
                    previous=decision.production_version,
                    reasons=decision.reasons,
                    metrics=_finite(
                        {
                            "candidate": decision.candidate_metrics,
                            "production": decision.production_metrics,
                        }
                    ),
                    holdout=[str(s.holdout_start), str(s.holdout_end)],
                    promotion_id=row.id,
                )
    except BaseException as exc:
        rollback.undo()
        if decision.promoted and isinstance(exc, Exception):
            raise RetrainError(
                f"promotion of {name}/{decision.candidate_version} could not be recorded and "
                f"was undone (production stays {decision.production_version or 'unset'}): {exc}"
            ) from exc
        raise
