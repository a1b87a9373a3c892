"""What a walk-forward run produces: one ``WindowResult`` per window, one ``WalkForwardResult``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig
from allocator.trainer.market.windows import Window
from allocator.trainer.sim.backtest import BacktestResult

AGENT = "agent"
"""The exported model's name among a window's policies."""


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
    resumed_from: list[int] = field(default_factory=list)
    """Steps its training continued from after a kill: another draw of its recipe."""

    def metrics(self) -> dict[str, float]:
        return self.agent.metrics()

    def baseline_metrics(self) -> dict[str, dict[str, float]]:
        return {name: r.metrics() for name, r in self.baselines.items()}

    def daily_returns(self) -> pd.DataFrame:
        """Daily net returns on the test span, one column per policy (the model first)."""
        columns = {AGENT: self.agent.returns}
        columns.update({name: r.returns for name, r in self.baselines.items()})
        return pd.DataFrame(columns)


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
