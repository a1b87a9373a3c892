"""What one retraining job decided, and recording it with the candidate's promotion, all or
nothing: the pointer moves inside the ``promotions`` row's transaction after the row is flushed,
and is put back with the version directory if the commit fails, so a server never follows a
pointer without a record."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from allocator.recording.schema import Promotion
from allocator.registry.publish import PendingPromotion
from allocator.trainer.jobs.json_safe import json_safe
from allocator.trainer.jobs.retrain.config import RetrainConfig, RetrainError, RetrainSpans
from allocator.trainer.jobs.retrain.gates import GateResult
from allocator.trainer.sim.performance import format_table


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


def promotion_row(config: RetrainConfig, decision: RetrainDecision) -> Promotion:
    """The ``promotions`` row of a decision; its ``details``: what the decision was made on
    beyond the two models' metrics."""
    s = decision.spans
    details = {
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
        "seconds": round(decision.seconds, 2),
        "candidate_dir": str(decision.candidate_dir),
    }
    return Promotion(
        model_name=decision.model_name,
        candidate_version=decision.candidate_version,
        production_version=decision.production_version,
        decided_at=dt.datetime.now(dt.UTC),
        promoted=decision.promoted,
        reasons=[g.to_dict() for g in decision.gates],
        candidate_metrics=json_safe(decision.candidate_metrics),
        production_metrics=json_safe(decision.production_metrics),
        train_start=s.train_start,
        train_end=s.train_end,
        holdout_start=s.holdout_start,
        holdout_end=s.holdout_end,
        details=json_safe(details),
    )


def record_and_promote(
    config: RetrainConfig,
    engine: sa.Engine,
    decision: RetrainDecision,
    started: float,
) -> None:
    """Record the decision; on promotion also publish the version and move the pointer, all
    or nothing (module docstring)."""
    name = config.model_name
    promotion = PendingPromotion(Path(config.registry), name)
    try:
        if decision.promoted:
            decision.candidate_dir = promotion.publish(
                decision.candidate_dir, decision.candidate_version
            )
        decision.seconds = time.perf_counter() - started
        with Session(engine) as session, session.begin():
            row = promotion_row(config, decision)
            session.add(row)
            session.flush()  # a refused row fails here, before the pointer moves
            decision.record_id = row.id
            if decision.promoted:  # the pointer names the record that decided it
                promotion.point(
                    decision.candidate_version,
                    previous=decision.production_version,
                    reasons=decision.reasons,
                    metrics=json_safe(
                        {
                            "candidate": decision.candidate_metrics,
                            "production": decision.production_metrics,
                        }
                    ),
                    holdout=[str(decision.spans.holdout_start), str(decision.spans.holdout_end)],
                    promotion_id=row.id,
                )
    except BaseException as exc:
        promotion.undo()
        if decision.promoted and isinstance(exc, Exception):
            raise RetrainError(
                f"promotion of {name}/{decision.candidate_version} could not be recorded and "
                f"was undone (production stays {decision.production_version or 'unset'}): {exc}"
            ) from exc
        raise
