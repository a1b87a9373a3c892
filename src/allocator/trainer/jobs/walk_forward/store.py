"""The walk-forward rows of the trade database: runs, windows and the model versions they made."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, null, select
from sqlalchemy.orm import Session

from allocator.recording.schema import ModelVersion, WalkForwardRun, WalkForwardWindow, utcnow
from allocator.recording.settings import shown_url
from allocator.trainer.jobs.database import checked_engine
from allocator.trainer.jobs.json_safe import json_safe
from allocator.trainer.jobs.walk_forward.config import WalkForwardError
from allocator.trainer.jobs.walk_forward.rundir import WindowResult

TABLES = ("walk_forward_runs", "walk_forward_windows", "model_versions")
ROW_KEYS = ("excess_sharpe", "regime", "equal_weight_annual_return")
"""What a window's ``metrics`` column takes from its summary row, beside the model's test
metrics and how the window was run."""


class WalkForwardStore:
    """The rows of one walk-forward run: its run row (``run_id``), its windows and their model
    versions. A database without the tables is refused before any window trains."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = checked_engine(url, TABLES, WalkForwardError)
        self.run_id: int | None = None

    def start_run(self, name: str, config: dict[str, Any]) -> None:
        with Session(self.engine) as session, session.begin():
            row = WalkForwardRun(name=name, config=json_safe(config))
            session.add(row)
            session.flush()
            self.run_id = int(row.id)

    def reopen_run(
        self, run_id: int, name: str, keep: set[int]
    ) -> tuple[dict[str, Any] | None, set[int]]:
        """Mark a killed or failed run as running again, forgetting the rows of windows not in
        ``keep``; the summary it was closed with (if any) and the windows still recorded."""
        with Session(self.engine) as session, session.begin():
            row = session.get(WalkForwardRun, run_id)
            if row is None or row.name != name:
                raise WalkForwardError(
                    f"{shown_url(self.url)} has no walk-forward run {run_id} named {name!r}: "
                    "resume with the database the run recorded to (database_url or "
                    "$DATABASE_URL)"
                )
            previous = row.summary
            row.finished = None
            row.summary = null()
            self.run_id = run_id
            mine = WalkForwardWindow.run_id == run_id
            session.execute(
                delete(WalkForwardWindow).where(mine, ~WalkForwardWindow.index.in_(keep))
            )
            return previous, set(session.scalars(select(WalkForwardWindow.index).where(mine)))

    def add_window(self, result: WindowResult, row: dict[str, Any]) -> None:
        """The window row and, once per (name, version), the model-version row."""
        with Session(self.engine) as session, session.begin():
            version = self._model_version(session, result)
            w = result.window
            session.add(
                WalkForwardWindow(
                    run_id=self.run_id,
                    index=w.index,
                    train_start=w.train_start,
                    train_end=w.train_end,
                    test_start=w.test_start,
                    test_end=w.test_end,
                    model_version_id=version.id,
                    metrics=json_safe(
                        {
                            **result.metrics(),
                            **{k: row[k] for k in ROW_KEYS},
                            "version": result.version,
                            "assets": result.agent.settings["assets"],
                            "cost_bps": result.agent.settings["cost_bps"],
                            "train_seconds": result.train_seconds,
                            "seconds": result.seconds,
                            "torch_validation": result.torch_validation,
                        }
                    ),
                    baseline_metrics=json_safe(result.baseline_metrics()),
                    # SQL NULL, not a JSON 'null', when the model has no ICM.
                    icm_stats=null() if result.icm is None else json_safe(result.icm),
                )
            )

    @staticmethod
    def _model_version(session: Session, result: WindowResult) -> ModelVersion:
        """The row of the window's exported version, added (and flushed for its id) if new."""
        name = result.manifest.get("export", {}).get("registry_name") or result.manifest["name"]
        query = select(ModelVersion).filter_by(name=name, version=result.version)
        version = session.scalars(query).one_or_none()
        if version is None:
            version = ModelVersion(
                name=name,
                version=result.version,
                algorithm=result.algorithm,
                manifest=json_safe(result.manifest),
                checksums=json_safe(result.manifest.get("files", {})),
            )
            session.add(version)
            session.flush()
        return version

    def finish_run(self, summary: dict[str, Any]) -> None:
        """Close the run row with the summary (or the error) and release the database."""
        with Session(self.engine) as session, session.begin():
            row = session.get(WalkForwardRun, self.run_id)
            assert row is not None
            row.summary = json_safe(summary)
            row.finished = utcnow()
        self.engine.dispose()
