"""Scheduled retraining: whole tiny retrains and the command line (gates, spans and config:
test_retrain_gates.py, test_retrain_config.py).

The whole retrains train, export and backtest real (tiny) models on the embedded S&P 500 data,
record the decision in SQLite and in Postgres (migrated by alembic, as in production), and check
the one thing a running server sees: the production pointer, moved only on promotion, whole.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from allocator.cli import main
from allocator.recording.schema import Promotion, TrainingRun
from allocator.registry.pointer import PRODUCTION_FILE, read_production_pointer
from allocator.registry.versions import CANDIDATES_DIR
from allocator.trainer.jobs.retrain.config import RetrainConfig, RetrainError, load_retrain_config
from allocator.trainer.jobs.retrain.runner import retrain
from allocator.trainer.training.checkpointing import TrainingStoppedError
from tests.trainer.jobs.helpers import CONFIGS, free_address, migrated_sqlite, remigrate

TINY_CONFIG = CONFIGS / "retrain_tiny.yaml"
STRICT_TURNOVER = "gates.max_turnover=0.0001"  # no tiny model trades that little: rejected


# --- whole tiny retrains -------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A trade database migrated to head, on each backend."""
    if request.param == "sqlite":
        return migrated_sqlite(tmp_path)
    return remigrate(request.getfixturevalue("postgres_database"))


def tiny(tmp_path: Path, url: str, *overrides: str) -> RetrainConfig:
    """configs/retrain_tiny.yaml pointed at this test's registry, runs and database."""
    return load_retrain_config(
        TINY_CONFIG,
        [
            f"registry={tmp_path / 'models'}",
            f"database_url={url}",
            f"trainer.output_dir={tmp_path / 'runs'}",
            *overrides,
        ],
    )


def promotions(url: str) -> list[dict[str, Any]]:
    """Every recorded decision, oldest first, read through the schema's model."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with Session(engine) as session:
            rows = session.scalars(sa.select(Promotion).order_by(Promotion.id)).all()
            return [{c.key: getattr(r, c.key) for c in sa.inspect(Promotion).columns} for r in rows]
    finally:
        engine.dispose()


def served_versions(registry: Path, name: str = "tiny") -> set[str]:
    """What a server scanning the registry would load (hidden directories excluded)."""
    return {
        p.name
        for p in (registry / name).iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / "manifest.json").is_file()
    }


class PointerReader(threading.Thread):
    """Reads the production pointer in a loop, as a server's scans do, logging what it saw."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.seen: list[str] = []
        self.torn: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                self.seen.append("")
                continue
            try:
                self.seen.append(json.loads(text)["version"])
            except (ValueError, KeyError):
                self.torn.append(text)


def test_promote_reject_promote_records_each_decision_and_moves_the_pointer_only_on_promotion(
    tmp_path: Path, database: str
) -> None:
    registry = tmp_path / "models"
    pointer_file = registry / "tiny" / PRODUCTION_FILE

    # 1. No model yet: the first candidate is judged on the absolute gates alone, and promoted.
    first = retrain(tiny(tmp_path, database))
    assert first.promoted
    assert (first.candidate_version, first.production_version) == ("20221228", None)
    assert first.candidate_dir == registry / "tiny" / "20221228"
    assert read_production_pointer(registry, "tiny")["version"] == "20221228"
    assert not list((registry / CANDIDATES_DIR / "tiny").iterdir())  # moved out, not copied
    assert first.spans.train_end < first.spans.holdout_start
    assert first.spans.holdout_end == dt.date(2022, 12, 28)  # the data's last date

    # 2. A candidate over the turnover budget: rejected, the pointer is not even rewritten,
    # and the candidate stays hidden from servers.
    before = pointer_file.stat()
    second = retrain(tiny(tmp_path, database, STRICT_TURNOVER))
    assert not second.promoted
    assert (second.candidate_version, second.production_version) == ("20221228.1", "20221228")
    assert second.production_metrics is not None
    assert [r for r in second.reasons if r.startswith("FAIL")] == [
        next(r for r in second.reasons if "turnover" in r)
    ]
    after = pointer_file.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert served_versions(registry) == {"20221228"}
    assert (registry / CANDIDATES_DIR / "tiny" / "20221228.1" / "model.onnx").is_file()

    # 3. A candidate within every gate replaces production; a reader polling the pointer (as the
    # server does) only ever sees the old or the new version, never a torn file.
    reader = PointerReader(pointer_file)
    reader.start()
    try:
        third = retrain(tiny(tmp_path, database, "trainer.seed=1"))
        deadline = time.monotonic() + 10  # let the reader see the final file (a loaded CI box)
        while time.monotonic() < deadline and reader.seen[-1:] != ["20221228.2"]:
            time.sleep(0.01)
    finally:
        reader.halt.set()
        reader.join(10)
    assert third.promoted, third.reasons
    assert (third.candidate_version, third.production_version) == ("20221228.2", "20221228")
    pointer = read_production_pointer(registry, "tiny")
    assert pointer is not None
    assert pointer["version"] == "20221228.2"
    assert pointer["previous"] == "20221228"
    assert pointer["reasons"] == third.reasons
    assert pointer["metrics"]["candidate"]["sharpe"] == pytest.approx(
        third.candidate_metrics["sharpe"]
    )
    assert not reader.torn
    assert set(reader.seen) <= {"20221228", "20221228.2"}
    assert reader.seen[-1] == "20221228.2"
    assert served_versions(registry) == {"20221228", "20221228.2"}
    assert not list((registry / "tiny").glob(".production-*"))  # no temp file left behind

    engine = sa.create_engine(database, poolclass=NullPool)
    with Session(engine) as session:
        trained = session.scalars(sa.select(TrainingRun).order_by(TrainingRun.id)).all()
    engine.dispose()
    # Every candidate's training run is recorded, rejected or not.
    assert len(trained) == 3
    for row in trained:
        assert row.algorithm
        assert row.finished is not None
        assert Path(row.run_dir).name == row.name
        assert row.metrics["validation"]

    rows = promotions(database)
    assert [(r["candidate_version"], r["production_version"], r["promoted"]) for r in rows] == [
        ("20221228", None, True),
        ("20221228.1", "20221228", False),
        ("20221228.2", "20221228", True),
    ]
    assert [r["id"] for r in rows] == [first.record_id, second.record_id, third.record_id]
    rejected = rows[1]
    assert {g["gate"]: g["passed"] for g in rejected["reasons"]} == {
        "sharpe_vs_production": True,
        "turnover": False,
        "max_drawdown": True,
    }
    assert rejected["reasons"][1]["threshold"] == 0.0001
    assert "exceeds the limit" in rejected["reasons"][1]["reason"]
    assert rejected["candidate_metrics"]["turnover"] == pytest.approx(
        second.candidate_metrics["turnover"]
    )
    assert rejected["production_metrics"]["sharpe"] == pytest.approx(
        second.production_metrics["sharpe"]
    )
    assert rows[0]["production_metrics"] is None
    assert (rejected["holdout_start"], rejected["holdout_end"]) == (
        second.spans.holdout_start,
        second.spans.holdout_end,
    )
    assert rejected["train_end"] < rejected["holdout_start"]
    assert rejected["details"]["assets"] == ["AAPL", "JNJ", "KO", "MSFT"]
    assert rejected["details"]["equal_weight_metrics"]["sharpe"] is not None
    assert rejected["decided_at"] is not None


def test_without_a_pointer_the_newest_version_is_production_and_a_rejection_writes_none(
    tmp_path: Path,
) -> None:
    url = migrated_sqlite(tmp_path)
    registry = tmp_path / "models"
    retrain(tiny(tmp_path, url))
    (registry / "tiny" / PRODUCTION_FILE).unlink()  # e.g. a registry filled by `allocator export`

    # A dead Pushgateway is reported on the decision; it does not undo or fail the job.
    dead = f"http://{free_address()}"
    decision = retrain(tiny(tmp_path, url, STRICT_TURNOVER, f"pushgateway_url={dead}"))
    assert not decision.promoted
    assert decision.production_version == "20221228"
    assert "newest version (no production pointer)" in decision.notes[0]
    assert not (registry / "tiny" / PRODUCTION_FILE).exists()
    assert served_versions(registry) == {"20221228"}
    assert decision.push_error is not None
    assert "Pushgateway" in decision.push_error
    assert [r["promoted"] for r in promotions(url)] == [True, False]


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A Pushgateway's receiving end: keeps each push's method, path and body."""

    pushes: list[tuple[str, str, str]]

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        self.pushes.append(("PUT", self.path, body))
        self.send_response(200)
        self.end_headers()

    do_POST = do_PUT  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


def test_job_metrics_are_pushed_when_a_gateway_is_configured(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path)
    handler = type("Gateway", (_Gateway,), {"pushes": []})
    gateway = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=gateway.serve_forever, daemon=True).start()
    try:
        address = f"http://127.0.0.1:{gateway.server_address[1]}"
        decision = retrain(tiny(tmp_path, url, f"pushgateway_url={address}"))
    finally:
        gateway.shutdown()
        gateway.server_close()
    assert decision.promoted
    assert decision.push_error is None
    ((method, path, body),) = handler.pushes
    assert (method, path) == ("PUT", "/metrics/job/allocator_retrain/model/tiny")
    assert 'allocator_jobs_promotions_total{decision="promoted"} 1.0' in body
    assert 'allocator_jobs_promotions_total{decision="rejected"} 0.0' in body
    assert "allocator_jobs_last_success_timestamp_seconds" in body
    assert "allocator_jobs_duration_seconds_count 1.0" in body


def test_an_unmigrated_database_stops_the_job_before_training(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(RetrainError, match=r"no promotions table: run `allocator db upgrade`"):
        retrain(tiny(tmp_path, url))
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "models").exists()


def test_a_stop_asked_for_while_it_trains_ends_the_job_with_no_decision(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path)
    stop = threading.Event()
    stop.set()  # a SIGTERM before the first step: the job stops after it
    with pytest.raises(TrainingStoppedError) as stopped:
        retrain(tiny(tmp_path, url), stop=stop)
    assert stopped.value.step == 1
    assert promotions(url) == []
    assert not (tmp_path / "models").exists()  # nothing exported, no pointer


def test_a_promotion_the_database_refuses_is_undone(tmp_path: Path) -> None:
    """SQLite refuses the row (a trigger): the version goes back to the candidates, no pointer."""
    url = migrated_sqlite(tmp_path)
    engine = sa.create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse BEFORE INSERT ON promotions "
            "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
    engine.dispose()
    registry = tmp_path / "models"
    with pytest.raises(RetrainError, match=r"could not be recorded and was undone.*unset"):
        retrain(tiny(tmp_path, url))
    assert not (registry / "tiny" / PRODUCTION_FILE).exists()
    assert served_versions(registry) == set()
    assert (registry / CANDIDATES_DIR / "tiny" / "20221228" / "model.onnx").is_file()


def test_a_promotion_whose_commit_fails_restores_the_previous_pointer(
    tmp_path: Path, postgres_database: str
) -> None:
    """Postgres refuses at COMMIT (a deferred constraint trigger), after the pointer moved:
    the previous pointer comes back byte for byte and the version returns to the candidates."""
    url = remigrate(postgres_database)
    registry = tmp_path / "models"
    retrain(tiny(tmp_path, url))
    saved = (registry / "tiny" / PRODUCTION_FILE).read_bytes()

    engine = sa.create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused at commit by the test'; END $$"
        )
        conn.exec_driver_sql(
            "CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON promotions "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
    engine.dispose()
    with pytest.raises(RetrainError, match=r"undone \(production stays 20221228\).*at commit"):
        retrain(tiny(tmp_path, url))
    assert (registry / "tiny" / PRODUCTION_FILE).read_bytes() == saved
    assert served_versions(registry) == {"20221228"}
    assert (registry / CANDIDATES_DIR / "tiny" / "20221228.1").is_dir()
    assert [r["candidate_version"] for r in promotions(url)] == ["20221228"]


# --- the command line ----------------------------------------------------------------------------


def test_cli_retrain_prints_the_decision_and_exits_0_promoted_or_not(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path)
    base = [
        "retrain",
        "--config",
        str(TINY_CONFIG),
        "--set",
        f"registry={tmp_path / 'models'}",
        "--set",
        f"database_url={url}",
        "--set",
        f"trainer.output_dir={tmp_path / 'runs'}",
    ]
    runner = CliRunner()
    promoted = runner.invoke(main, [*base, "--as-of", "2022-07-04"])  # a holiday: July 1st
    assert promoted.exit_code == 0, promoted.output
    assert "PROMOTED: tiny/20220701 (production before: none)" in promoted.output
    assert "PASS turnover: mean daily turnover" in promoted.output
    assert "held out 2022-04-06 .. 2022-07-01" in promoted.output

    rejected = runner.invoke(main, [*base, "--set", STRICT_TURNOVER])
    assert rejected.exit_code == 0, rejected.output
    assert "REJECTED: tiny/20221228 (production before: 20220701)" in rejected.output
    assert "FAIL turnover: mean daily turnover" in rejected.output
    assert read_production_pointer(tmp_path / "models", "tiny")["version"] == "20220701"


def test_cli_retrain_errors_exit_nonzero_with_a_clear_message(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["retrain", "--config", str(TINY_CONFIG), "--set", "gates.x=1"])
    assert bad.exit_code == 2
    assert "gates.x: Extra inputs are not permitted" in bad.output
    missing = runner.invoke(main, ["retrain", "--config", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2
    assert "retrain config not found" in missing.output
    unmigrated = runner.invoke(
        main,
        [
            "retrain",
            "--config",
            str(TINY_CONFIG),
            "--set",
            f"database_url=sqlite:///{tmp_path / 'empty.db'}",
            "--set",
            f"registry={tmp_path / 'models'}",
        ],
    )
    assert unmigrated.exit_code == 1
    assert "error: retraining failed, production unchanged" in unmigrated.output
    assert "allocator db upgrade" in unmigrated.output
    url = migrated_sqlite(tmp_path)
    too_early = runner.invoke(
        main,
        [
            "retrain",
            "--config",
            str(TINY_CONFIG),
            "--as-of",
            "1990-03-01",
            "--set",
            f"database_url={url}",
        ],
    )
    assert too_early.exit_code == 2
    assert "retraining needs train_days + purge_days + holdout_days = 315" in too_early.output
    assert promotions(url) == []
