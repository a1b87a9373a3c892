"""The validation dashboard's SQL against the migrated schema on a real Postgres."""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from allocator.recording.migrations import upgrade
from allocator.recording.schema import ModelVersion, Promotion, WalkForwardRun, WalkForwardWindow
from tests.monitoring.files import (
    load_dashboard,
    sql_queries,
)
from tests.postgres import reset_schema


def grafana_sql(raw: str, run_id: int, start: dt.datetime, end: dt.datetime) -> str:
    """Grafana's macros and this dashboard's variables, as Grafana would expand them."""
    frm, to = start.isoformat(), end.isoformat()
    # $__timeFilter takes one column here (no nested parentheses).
    text = re.sub(r"\$__timeFilter\(([^)]+)\)", rf"\1 BETWEEN '{frm}' AND '{to}'", raw)
    text = text.replace("$run", str(run_id)).replace("$model", "'allocator'")
    assert "$" not in text, f"unresolved Grafana variable in:\n{text}"
    return text


def seed_validation_rows(url: str) -> int:
    """One walk-forward run of two windows and two promotion decisions, shaped as the
    walk-forward store and the retraining job write them (metric and gate keys included)."""
    now = dt.datetime.now(dt.UTC)
    baselines = ("equal-weight", "buy-and-hold", "min-variance", "hrp")
    engine = create_engine(url, poolclass=NullPool)
    with Session(engine) as session, session.begin():
        version = ModelVersion(name="allocator", version="3", algorithm="td3", manifest={})
        run = WalkForwardRun(
            name="wf-test",
            config={},
            finished=now,
            summary={
                "positive_sharpe": 0.5,
                "beats_equal_weight": 0.5,
                "median_excess_sharpe": 0.1,
                "mean_turnover": 0.04,
            },
        )
        session.add_all([version, run])
        session.flush()
        for index, sharpe in enumerate((0.9, -0.2)):
            start = dt.date(2019 + index, 1, 1)
            session.add(
                WalkForwardWindow(
                    run_id=run.id,
                    index=index,
                    train_start=start - dt.timedelta(days=730),
                    train_end=start - dt.timedelta(days=1),
                    test_start=start,
                    test_end=start + dt.timedelta(days=180),
                    model_version_id=version.id,
                    metrics={
                        "sharpe": sharpe,
                        "sortino": sharpe * 1.3,
                        "max_drawdown": 0.12,
                        "turnover": 0.05,
                        "excess_sharpe": sharpe - 0.4,
                        "regime": "bull",
                    },
                    baseline_metrics={
                        name: {"sharpe": 0.4 + 0.1 * k} for k, name in enumerate(baselines)
                    },
                )
            )
        for days_ago, promoted in ((10, True), (3, False)):
            gate = {"gate": "sharpe", "passed": promoted, "reason": "vs serving", "value": 0.1}
            session.add(
                Promotion(
                    model_name="allocator",
                    candidate_version=str(4 + days_ago),
                    production_version="3",
                    decided_at=now - dt.timedelta(days=days_ago),
                    promoted=promoted,
                    reasons=[gate, {**gate, "gate": "drawdown", "passed": True}],
                    candidate_metrics={"sharpe": 1.1},
                    production_metrics={"sharpe": 0.9},
                    train_start=dt.date(2018, 1, 1),
                    train_end=dt.date(2021, 12, 31),
                    holdout_start=dt.date(2022, 1, 3),
                    holdout_end=dt.date(2022, 6, 30),
                    details={},
                )
            )
        run_id = int(run.id)
    engine.dispose()
    return run_id


def test_validation_dashboard_sql_returns_rows_on_postgres(postgres_url: str) -> None:
    reset_schema(postgres_url)  # the session's database, emptied, then migrated
    upgrade(postgres_url)
    engine = create_engine(postgres_url, poolclass=NullPool)
    run_id = seed_validation_rows(postgres_url)
    now = dt.datetime.now(dt.UTC)
    queries = sql_queries(load_dashboard("validation"))
    assert len(queries) >= 6
    with engine.connect() as conn:
        for where, fmt, raw in queries:
            result = conn.exec_driver_sql(grafana_sql(raw, run_id, now - dt.timedelta(90), now))
            columns = list(result.keys())
            rows = result.fetchall()
            assert rows, f"{where}: no rows"
            if fmt == "time_series":
                assert {"time", "metric", "value"} <= set(columns), f"{where}: {columns}"
            if "against the baselines" in where:
                policies = {row.policy for row in rows}
                assert policies == {"agent", "equal-weight", "buy-and-hold", "min-variance", "hrp"}
                assert len(rows) == 2 * len(policies)
            if "reasons" in where:
                failed = {row.decision: row[columns.index("failed gates")] for row in rows}
                assert failed == {"promoted": None, "rejected": "sharpe: vs serving"}
    engine.dispose()
