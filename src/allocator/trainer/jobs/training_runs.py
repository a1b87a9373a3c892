"""A finished training run's row in the trade database's ``training_runs``.

``allocator train --database-url`` checks the table is there before training (a typo in the URL
must not cost a whole run) and writes one row when the run finishes: its name, algorithm,
directory, config and the summary of ``run.json``. An interrupted run writes nothing; the
``--resume`` that finishes it writes its row.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from allocator.recording.schema import TrainingRun as TrainingRunRow
from allocator.recording.schema import utcnow
from allocator.trainer.jobs.json_safe import json_safe
from allocator.typed_config import ConfigError


def shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def check_training_table(url: str) -> None:
    """Refuse a database that cannot be reached or has no ``training_runs`` (not migrated)."""
    engine = create_engine(url)
    try:
        tables = set(inspect(engine).get_table_names())
    except Exception as exc:  # any driver error: say where and why
        raise ConfigError(f"cannot reach the database {shown(url)}: {exc}") from exc
    finally:
        engine.dispose()
    if "training_runs" not in tables:
        raise ConfigError(
            f"{shown(url)} has no training_runs table: run "
            f"`allocator db upgrade --database-url {shown(url)}` first"
        )


def record_training_run(
    url: str,
    name: str,
    run_dir: str,
    config: dict[str, Any],
    summary: dict[str, Any],
    started: dt.datetime,
) -> int:
    """Insert the finished run; its row id."""
    engine = create_engine(url)
    try:
        with Session(engine) as session, session.begin():
            row = TrainingRunRow(
                name=name,
                algorithm=str(summary.get("algorithm", "")),
                run_dir=run_dir,
                config=json_safe(config),
                metrics=json_safe(summary),
                started=started,
                finished=utcnow(),
            )
            session.add(row)
            session.flush()
            return int(row.id)
    finally:
        engine.dispose()
