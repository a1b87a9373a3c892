"""``retrain``: the job's steps in order. The database is checked before anything trains; a failed
push is reported without undoing the decision."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.pool import NullPool

from allocator.artifacts.manifest import read_manifest
from allocator.metrics.jobs import JobPush, PromotionDecision
from allocator.recording.schema import utcnow
from allocator.recording.settings import database_url as default_database_url
from allocator.registry.pointer import production_version
from allocator.registry.versions import CANDIDATES_DIR, dated_version
from allocator.trainer.export.run import export_run
from allocator.trainer.jobs.database import checked_engine, record_training_run
from allocator.trainer.jobs.evaluation import (
    evaluate_baselines,
    evaluation_assets,
    replay_exported,
)
from allocator.trainer.jobs.retrain.config import (
    RetrainConfig,
    RetrainError,
    RetrainSpans,
    retrain_spans,
)
from allocator.trainer.jobs.retrain.gates import apply_gates
from allocator.trainer.jobs.retrain.record import RetrainDecision, record_and_promote
from allocator.trainer.market.data import (
    DateLike,
    MarketData,
    check_price_database,
    load_dataset,
)
from allocator.trainer.sim.baselines import BaselineName
from allocator.trainer.training.config import TrainConfig
from allocator.trainer.training.inputs import restrict_universe
from allocator.trainer.training.run import train
from allocator.trainer.training.tracked_models import PRODUCTION_ALIAS, set_production_alias

log = logging.getLogger("allocator.retrain")


@dataclass(frozen=True)
class RetrainPlan:
    """What this run will do, fixed before training."""

    data: MarketData
    spans: RetrainSpans
    production: str | None
    chosen_by: str
    version: str

    def describe(self, name: str) -> str:
        s = self.spans
        return (
            f"retrain {name}: train {s.train_start} .. {s.train_end}, held out "
            f"{s.holdout_start} .. {s.holdout_end}; production: {self.production or 'none'} "
            f"({self.chosen_by}); candidate version {self.version}"
        )


def plan_retrain(config: RetrainConfig, as_of: DateLike | None) -> RetrainPlan:
    """The spans up to ``as_of`` (else the trainer's ``data.as_of``), the model a server answers
    with now, the candidate's version."""
    registry, name, d = Path(config.registry), config.model_name, config.trainer.data
    check_price_database(d.dataset, config.database_url)
    loaded = load_dataset(d.dataset, as_of=d.as_of if as_of is None else as_of)
    data = restrict_universe(config.trainer, loaded)
    spans = retrain_spans(
        data.dates,
        as_of,
        train_days=config.train_days,
        purge_days=config.purge_days,
        holdout_days=config.holdout_days,
        source=data.source,
    )
    production, chosen_by = production_version(registry, name)
    version = dated_version(registry, name, spans.holdout_end)
    return RetrainPlan(data, spans, production, chosen_by, version)


def trainer_for(config: RetrainConfig, spans: RetrainSpans) -> TrainConfig:
    """The trainer config with its data spans (and ``as_of``) set to the retraining window."""
    tree = config.trainer.model_dump(mode="json")
    tree["data"].update(
        as_of=str(spans.holdout_end),  # the run reads (and its config records) these prices
        train_start=str(spans.train_start),
        train_end=str(spans.train_end),
        validation_start=str(spans.holdout_start),
        validation_end=str(spans.holdout_end),
    )
    return TrainConfig.model_validate(tree)


def holdout_assets(
    data: MarketData, spans: RetrainSpans, model_dirs: list[Path]
) -> tuple[list[str], int]:
    """The assets both models are judged on (as many as the narrower model has slots), and
    the widest observation window."""
    manifests = [read_manifest(d) for d in model_dirs]
    window = max(m.feature_spec.window for m in manifests)
    slots = min(m.max_assets for m in manifests)
    return evaluation_assets(data, spans.holdout_start, spans.holdout_end, window, slots), window


def judge(
    config: RetrainConfig, plan: RetrainPlan, run_dir: Path, candidate_dir: Path
) -> RetrainDecision:
    """Backtest candidate, production and equal weight on the held-out span; apply the gates."""
    registry, name = Path(config.registry), config.model_name
    data, spans = plan.data, plan.spans
    production_dir = registry / name / plan.production if plan.production else None
    dirs = [candidate_dir] + ([production_dir] if production_dir else [])
    assets, window = holdout_assets(data, spans, dirs)
    cost = config.holdout_cost_bps
    span = (spans.holdout_start, spans.holdout_end)
    candidate = replay_exported(candidate_dir, data, *span, cost_bps=cost, assets=assets)
    candidate_metrics = candidate.result.metrics()
    production_metrics = None
    if production_dir is not None:
        try:
            judged = replay_exported(production_dir, data, *span, cost_bps=cost, assets=assets)
        except Exception as exc:
            raise RetrainError(
                f"production model {production_dir} could not be backtested on the held-out "
                f"span ({type(exc).__name__}: {exc}); fix or re-point production first"
            ) from exc
        production_metrics = judged.result.metrics()
    ew = BaselineName.EQUAL_WEIGHT.value
    equal_weight = evaluate_baselines(
        data, *span, cost_bps=cost, assets=assets, names=(ew,), window=window
    )[ew].metrics()
    results = apply_gates(config.gates, candidate_metrics, production_metrics, equal_weight)
    return RetrainDecision(
        model_name=name,
        candidate_version=plan.version,
        production_version=plan.production,
        promoted=all(g.passed for g in results),
        gates=results,
        spans=spans,
        candidate_metrics=candidate_metrics,
        production_metrics=production_metrics,
        equal_weight_metrics=equal_weight,
        assets=assets,
        cost_bps=cost,
        run_dir=run_dir,
        candidate_dir=candidate_dir,
        notes=[f"production chosen by: {plan.chosen_by}"],
    )


def push_decision(config: RetrainConfig, decision: RetrainDecision) -> None:
    """Push the job's figures; a failure is reported on the decision, never undoes it."""
    pusher = JobPush(config.pushgateway_url, config.job_name, {"model": config.model_name})
    pusher.metrics.record_promotion(
        PromotionDecision.PROMOTED if decision.promoted else PromotionDecision.REJECTED
    )
    error = pusher.succeeded(decision.seconds)
    if error is not None:
        log.warning("retrain: %s", error)
        decision.push_error = error


def retrain(
    config: RetrainConfig,
    as_of: DateLike | None = None,
    *,
    echo: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> RetrainDecision:
    """Run the job once; the decision, promoted or not. A ``stop`` set while it trains raises
    ``TrainingStoppedError`` (the pointer untouched); set later, it lets the decision finish."""
    say = echo or (lambda line: log.info("%s", line))
    started = time.perf_counter()
    registry, name = Path(config.registry), config.model_name
    url = config.database_url or default_database_url()
    # before training: a database without the promotions table must not cost a whole run
    engine = checked_engine(url, ["promotions"], RetrainError, poolclass=NullPool)
    try:
        plan = plan_retrain(config, as_of)
        say(plan.describe(name))
        began = utcnow()
        run = train(trainer_for(config, plan.spans), stop=stop)
        say(f"trained: {run.run_dir} ({run.summary['train_seconds']} s)")
        record_training_run(url, run, began)
        candidate_dir = export_run(
            run.run_dir, registry / CANDIDATES_DIR, name=name, version=plan.version
        )
        say(f"exported candidate: {candidate_dir}")
        decision = judge(config, plan, run.run_dir, candidate_dir)
        record_and_promote(config, engine, decision, started)
    finally:
        engine.dispose()
    if decision.promoted and config.trainer.tracking.enabled:
        say(mirror_promotion(config, decision.candidate_version))
    if config.pushgateway_url:
        push_decision(config, decision)
    return decision


def mirror_promotion(config: RetrainConfig, version: str) -> str:
    """Move MLflow's ``production`` alias to the promoted version; what happened, as a line.

    A failure leaves the alias behind, never undoes the promotion."""
    name = config.model_name
    try:
        mirrored = set_production_alias(config.trainer.tracking, name, version)
    except Exception as exc:  # any client or server error: the promotion itself stands
        log.error("retrain %s: MLflow alias not moved: %s", name, exc)
        return f"MLflow: the {PRODUCTION_ALIAS} alias could not be moved to {version}: {exc}"
    if mirrored is None:
        return f"MLflow: {name} version {version} was never registered; no alias moved"
    return f"MLflow: {PRODUCTION_ALIAS} alias of {name} on version {mirrored} ({version})"
