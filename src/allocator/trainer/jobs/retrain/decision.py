"""What one retraining job decided, and everything it was decided on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from allocator.trainer.jobs.retrain.gates import GateResult
from allocator.trainer.jobs.retrain.spans import RetrainSpans
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
