"""The trade database as batch jobs open it: checked for the tables they write before any work
(a typo in the URL must not cost a whole run), with the password masked in every message."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, create_engine, inspect
from sqlalchemy.orm import Session

from allocator.recording.schema import TrainingRun as TrainingRunRow
from allocator.recording.schema import utcnow
from allocator.recording.settings import shown_url
from allocator.trainer.jobs.json_safe import json_safe
from allocator.trainer.training.run import TrainingRun


def checked_engine(
    url: str, tables: Iterable[str], error: type[Exception], **options: Any
) -> Engine:
    """An engine on ``url`` (``options`` go to ``create_engine``), refused with ``error``
    when the database cannot be reached or lacks one of ``tables`` (not migrated)."""
    engine = create_engine(url, **options)
    try:
        missing = sorted(set(tables) - set(inspect(engine).get_table_names()))
    except Exception as exc:  # any driver error: say where and why
        engine.dispose()
        raise error(f"cannot reach the database {shown_url(url)}: {exc}") from exc
    if missing:
        engine.dispose()
        raise error(
            f"{shown_url(url)} has no {', '.join(missing)} table: run `allocator db upgrade` "
            "on it first (with --database-url, or DATABASE_URL set to it)"
        )
    return engine


def record_training_run(url: str, run: TrainingRun, started: dt.datetime) -> int:
    """Insert the finished run; its row id."""
    engine = create_engine(url)
    try:
        with Session(engine) as session, session.begin():
            row = TrainingRunRow(
                name=run.run_dir.name,
                algorithm=str(run.summary.get("algorithm", "")),
                run_dir=str(run.run_dir),
                config=json_safe(run.config.model_dump(mode="json")),
                metrics=json_safe(run.summary),
                started=started,
                finished=utcnow(),
            )
            session.add(row)
            session.flush()
            return int(row.id)
    finally:
        engine.dispose()
