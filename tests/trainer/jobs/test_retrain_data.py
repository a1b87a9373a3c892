"""Jobs on prices that move (``dataset: database``): ingest new days, retrain, and the candidate
is trained and judged on them, on SQLite and on a real Postgres; walk-forward plans its windows
on the stored prices as on the same data from a file.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from allocator.artifacts.manifest import read_manifest
from allocator.cli import main
from allocator.registry.pointer import read_production_pointer
from allocator.trainer.jobs.retrain.config import RetrainConfig, load_retrain_config
from allocator.trainer.jobs.retrain.runner import retrain
from allocator.trainer.jobs.walk_forward.window import plan
from allocator.trainer.market.data import MarketData, load_sp500
from allocator.trainer.training.run_dir import CONFIG_FILE
from allocator.typed_config import ConfigError
from tests.markets import to_long_frame
from tests.trainer.jobs.helpers import CONFIGS, migrated_sqlite, remigrate, rows
from tests.trainer.jobs.helpers import tiny as tiny_walk_forward

ASSETS = ["AAPL", "JNJ", "KO", "MSFT"]  # configs/retrain_tiny.yaml's universe
FIRST_END = "2022-09-30"
NEW_END = "2022-10-31"


@pytest.fixture(scope="module")
def prices() -> MarketData:
    return load_sp500().select(ASSETS).between("2021-01-01", NEW_END)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A trade database migrated to head, on each backend."""
    if request.param == "sqlite":
        return migrated_sqlite(tmp_path)
    return remigrate(request.getfixturevalue("postgres_database"))


def tiny_on_database(tmp_path: Path, *overrides: str) -> RetrainConfig:
    """configs/retrain_tiny.yaml reading its prices from the trade database."""
    return load_retrain_config(
        CONFIGS / "retrain_tiny.yaml",
        [
            "trainer.data.dataset=database",
            f"registry={tmp_path / 'models'}",
            f"trainer.output_dir={tmp_path / 'runs'}",
            *overrides,
        ],
    )


def ingest(data: MarketData, path: Path, url: str) -> str:
    """``allocator data ingest`` of ``data`` written to ``path``, as an operator runs it."""
    to_long_frame(data).to_csv(path, index=False)
    result = CliRunner().invoke(main, ["data", "ingest", str(path), "--database-url", url])
    assert result.exit_code == 0, result.output
    return result.output


def test_ingest_new_days_then_retrain_trains_and_gates_the_candidate_on_them(
    tmp_path: Path, database: str, prices: MarketData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", database)
    out = ingest(prices.between(None, FIRST_END), tmp_path / "history.csv", database)
    assert "0 rejected" in out
    first = retrain(tiny_on_database(tmp_path))
    assert first.promoted  # no production model yet; the tiny config's gates are loose
    assert first.spans.holdout_end == dt.date.fromisoformat(FIRST_END)

    new_days = prices.between("2022-10-01", NEW_END)
    out = ingest(new_days, tmp_path / "october.csv", database)
    assert f"{new_days.n_dates * len(ASSETS)} added, 0 changed" in out

    second = retrain(tiny_on_database(tmp_path))
    spans = second.spans
    assert spans.holdout_end == dt.date.fromisoformat(NEW_END)
    # Every span moved forward by exactly the trading days ingested.
    dates = list(prices.dates.date)
    for name in ("train_start", "train_end", "holdout_start", "holdout_end"):
        moved = dates.index(getattr(spans, name)) - dates.index(getattr(first.spans, name))
        assert moved == new_days.n_dates, name
    # Trained on them: the run's resolved config and the candidate's manifest say so.
    config = yaml.safe_load((second.run_dir / CONFIG_FILE).read_text())["data"]
    assert (config["dataset"], config["as_of"]) == ("database", NEW_END)
    manifest = read_manifest(second.candidate_dir).data
    assert (manifest.train_end, manifest.validation_end) == (str(spans.train_end), NEW_END)
    # Gated on them, against the model promoted from the old data.
    assert second.production_version == first.candidate_version
    recorded = rows(database, "SELECT holdout_end, promoted FROM promotions ORDER BY id")
    assert [str(r["holdout_end"]) for r in recorded] == [FIRST_END, NEW_END]
    pointer = read_production_pointer(tmp_path / "models", "tiny")["version"]
    assert pointer == (second.candidate_version if second.promoted else first.candidate_version)


def test_database_prices_from_another_database_than_the_jobs_are_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'prices.db'}")
    config = tiny_on_database(tmp_path, f"database_url={migrated_sqlite(tmp_path)}")
    with pytest.raises(ConfigError, match=r"reads the prices from \$DATABASE_URL"):
        retrain(config)
    assert not (tmp_path / "runs").exists()


def test_walk_forward_plans_its_windows_on_the_database_prices_as_on_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = migrated_sqlite(tmp_path)
    monkeypatch.setenv("DATABASE_URL", url)
    wf_assets = ["AAPL", "MSFT", "JPM", "XOM"]  # configs/walk_forward_tiny.yaml's universe
    ingest(
        load_sp500().select(wf_assets).between("2017-01-01", "2018-12-31"), tmp_path / "p.csv", url
    )
    on_db = plan(tiny_walk_forward(tmp_path, "trainer.data.dataset=database"), tmp_path, "db")
    on_sp500 = plan(tiny_walk_forward(tmp_path), tmp_path, "file")
    assert [j.window for j in on_db] == [j.window for j in on_sp500]
    assert {j.trainer.data.dataset for j in on_db} == {"database"}  # not taken for a path
    with pytest.raises(ConfigError, match=r"reads the prices from \$DATABASE_URL"):
        plan(
            tiny_walk_forward(
                tmp_path, "trainer.data.dataset=database", f"database_url=sqlite:///{tmp_path}/x.db"
            ),
            tmp_path,
            "other",
        )
