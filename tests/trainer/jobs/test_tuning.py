"""Tuning: a tiny Optuna study writes its files, refuses bad search spaces before training,
prunes, never reads a price after the trainer's training span, and its best config trains."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from optuna.storages.journal import JournalFileOpenLock

from allocator.cli import main
from allocator.trainer.jobs.tuning.config import TuneConfig, load_tune_config
from allocator.trainer.jobs.tuning.objective import interruption
from allocator.trainer.jobs.tuning.runner import TuneResult, run_tuning
from allocator.trainer.jobs.tuning.space import tuned_config
from allocator.trainer.jobs.walk_forward.config import load_walk_forward_config
from allocator.trainer.jobs.walk_forward.window import plan
from allocator.trainer.training.config import load_config
from allocator.typed_config import ConfigError
from tests.markets import write_sp500_slice
from tests.trainer.jobs.helpers import CONFIGS
from tests.trainer.tiny import TINY_TRAINING

ASSETS = ["AAPL", "AMD", "BAC", "BBY", "CVX"]
TRAIN_END = "2013-12-31"
TRAINER = [
    *TINY_TRAINING,
    "data.train_start=2010-01-01",
    f"data.train_end={TRAIN_END}",
    "data.validation_start=2014-01-01",
    "data.validation_end=2014-06-30",
    "env.max_assets=5",
    "selection.inner_days=60",
    "selection.purge_days=5",
    "selection.eval_every=100",
    "selection.patience=0",
]
SPACE = {
    "algorithm.actor_learning_rate": {"low": 1.0e-5, "high": 1.0e-3, "log": True},
    "algorithm.batch_size": {"low": 16, "high": 64},
    "algorithm.net_arch": {"choices": [[16, 16], [32, 32]]},
}
HOUSEKEEPING = (
    "name",
    "output_dir",
    "progress_bar",
    "tensorboard",
    "html_report",
    "torch_threads",
)


def write_prices(path: Path, *, garbage_after_training: bool) -> Path:
    return write_sp500_slice(path, ASSETS, TRAIN_END, garbage_after_training=garbage_after_training)


def tune_file(folder: Path, prices: Path, **settings: Any) -> Path:
    """A tuning YAML with an inline tiny trainer on ``prices`` and the test space."""
    tree = {
        "name": "tiny_tune",
        "trainer": {"data": {"dataset": str(prices)}},
        "space": SPACE,
        "n_trials": 3,
        "sampler": {"seed": 0, "n_startup_trials": 2},
        "pruner": {"kind": "none"},
        "output_dir": str(folder / "tune"),
        **settings,
    }
    path = folder / "tune.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def tune_config(folder: Path, prices: Path, *extra: str, **settings: Any) -> TuneConfig:
    path = tune_file(folder, prices, **settings)
    return load_tune_config(path, [*(f"trainer.{o}" for o in TRAINER), *extra])


def read_trials(result: TuneResult) -> list[dict[str, str]]:
    with open(result.files["trials"], newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def prices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_prices(
        tmp_path_factory.mktemp("prices") / "clean.csv", garbage_after_training=False
    )


@pytest.fixture(scope="module")
def study(prices: Path, tmp_path_factory: pytest.TempPathFactory) -> TuneResult:
    folder = tmp_path_factory.mktemp("study")
    return run_tuning(tune_config(folder, prices), out_dir=folder / "out", progress=False)


def test_a_tiny_study_writes_every_file(study: TuneResult) -> None:
    out = study.out_dir
    assert (out / "study.journal").stat().st_size > 0
    rows = read_trials(study)
    assert [r["number"] for r in rows] == ["0", "1", "2"]
    assert {r["state"] for r in rows} == {"COMPLETE"}
    # Trial 0 trains the base config's own values; batch sizes are drawn as integers.
    assert float(rows[0]["params.algorithm.actor_learning_rate"]) == pytest.approx(1e-4)
    assert rows[0]["params.algorithm.batch_size"] == "32"
    assert rows[0]["params.algorithm.net_arch"] == "[32, 32]"
    assert all(float(r["params.algorithm.batch_size"]).is_integer() for r in rows)
    for row in rows:
        run_dir = Path(row["run_dir"])
        selection = json.loads((run_dir / "selection.json").read_text())
        assert float(row["value"]) == selection["best_score"]
        assert int(row["evaluations"]) == len(selection["evaluations"]) == 3
        assert int(row["steps"]) == 300
        # The run was never finished: no validation backtest, nothing on the validation span.
        for name in ("validation.json", "model.zip", "manifest.json", "run.json"):
            assert not (run_dir / name).exists(), name
        trained = load_config(run_dir / "config.yaml")
        assert trained.selection.enabled
        assert trained.algorithm.batch_size == int(row["params.algorithm.batch_size"])
    summary = json.loads(Path(study.files["summary"]).read_text())
    assert summary == json.loads(json.dumps(study.summary))
    assert summary["n_trials"] == summary["configurations_tried"] == 3
    assert summary["states"] == {"COMPLETE": 3}
    best = max(rows, key=lambda r: float(r["value"]))
    assert summary["best"]["number"] == int(best["number"])
    assert summary["best"]["value"] == float(best["value"])
    assert summary["data"]["last_date_seen"] == TRAIN_END
    assert summary["data"]["inner_span"]["inner_end"] <= TRAIN_END
    assert summary["trials_sharpe_variance"] > 0


def test_best_yaml_is_the_best_trials_config_and_trains_as_is(study: TuneResult) -> None:
    best = study.summary["best"]
    kept = load_config(study.files["best"])
    assert kept == tuned_config(study.config.trainer, best["params"])
    assert kept.selection.enabled
    assert kept.name == study.config.trainer.name
    assert kept.output_dir == study.config.trainer.output_dir
    assert kept.algorithm.net_arch == best["params"]["algorithm.net_arch"]
    trained = load_config(Path(best["run_dir"]) / "config.yaml")
    skip = set(HOUSEKEEPING) | {"checkpoint_every"}
    assert kept.model_dump(exclude=skip) == trained.model_dump(exclude=skip)


def test_trials_never_read_a_price_after_the_training_span(
    study: TuneResult, tmp_path: Path
) -> None:
    garbage = write_prices(tmp_path / "garbage.csv", garbage_after_training=True)
    dirty = run_tuning(
        tune_config(tmp_path, garbage, "n_trials=2"), out_dir=tmp_path / "out", progress=False
    )
    clean_rows, dirty_rows = read_trials(study)[:2], read_trials(dirty)
    keys = ["state", "value", *[f"params.{k}" for k in SPACE], "steps", "best_step"]
    assert [{k: r[k] for k in keys} for r in dirty_rows] == [
        {k: r[k] for k in keys} for r in clean_rows
    ]


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        ({"algorithm.ent_coef": {"choices": ["auto"]}}, "space.algorithm.ent_coef: not a key"),
        ({"algorithm.gamma": {"low": 0.5, "high": 1.5}}, "space.algorithm.gamma: 1.5 makes"),
        ({"data.train_end": {"choices": ["2012-12-31"]}}, "space.data.train_end: data is fixed"),
        ({"selection": {"choices": [{}]}}, "space.selection: selection.enabled is fixed"),
        ({"env.cost_bps": {"low": 0, "high": 20}}, "space.env.cost_bps: env.cost_bps is fixed"),
        ({"algorithm.batch_size": {"low": 8.5, "high": 64}}, "integer low/high"),
        ({"algorithm.net_arch": {"low": 1, "high": 2}}, "a list key takes choices"),
        ({"algorithm.gamma": {"low": 0, "high": 1, "log": True}}, "log needs low > 0"),
        ({"algorithm.gamma": {"low": 0.9}}, "needs both low and high"),
        ({"algorithm.gamma": {"choices": [0.9], "low": 0.5}}, "either choices or low/high"),
        ({"algorithm.gamma": {"low": 0.96, "high": 0.99}}, "the base config's 0.95 lies outside"),
    ],
)
def test_a_bad_search_space_is_refused_naming_the_key(
    prices: Path, tmp_path: Path, space: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match="space") as info:
        tune_config(tmp_path, prices, space=space)
    assert expected in str(info.value)


def test_a_bad_space_fails_before_any_folder_or_trial(prices: Path, tmp_path: Path) -> None:
    good = tune_config(tmp_path, prices)
    bad = TuneConfig.model_validate(
        {**good.model_dump(), "space": {"algorithm.ent_coef": {"choices": ["auto"]}}}
    )
    with pytest.raises(ConfigError, match=r"space\.algorithm\.ent_coef"):
        run_tuning(bad, out_dir=tmp_path / "never", progress=False)
    assert not (tmp_path / "never").exists()


def test_a_pruned_trial_stops_training_at_the_evaluation_that_pruned_it(
    prices: Path, tmp_path: Path
) -> None:
    """A threshold no inner Sharpe can reach: each trial is pruned at its first evaluation."""
    config = tune_config(tmp_path, prices, n_trials=2, pruner={"kind": "threshold", "lower": 1.0e9})
    result = run_tuning(config, out_dir=tmp_path / "out", progress=False)
    rows = read_trials(result)
    assert [r["state"] for r in rows] == ["PRUNED", "PRUNED"]
    for row in rows:
        assert int(row["steps"]) == 100  # selection.eval_every: the first report
        assert int(row["evaluations"]) == 1
        selection = json.loads((Path(row["run_dir"]) / "selection.json").read_text())
        assert float(row["value"]) == selection["evaluations"][0]["score"]
    assert result.summary["states"] == {"PRUNED": 2}
    assert result.best is None
    assert "best" not in result.files
    assert not (result.out_dir / "best.yaml").exists()


def test_failing_trials_are_recorded_and_stop_the_study(prices: Path, tmp_path: Path) -> None:
    """An observation window longer than the training part: every trial fails at its start."""
    config = tune_config(
        tmp_path,
        prices,
        n_trials=5,
        enqueue_base=False,
        stop_after_failures=2,
        space={"env.window": {"choices": [2000]}},
    )
    result = run_tuning(config, out_dir=tmp_path / "out", progress=False)
    rows = read_trials(result)
    assert [r["state"] for r in rows] == ["FAIL", "FAIL"]
    assert all("ConfigError" in r["error"] and "selection" in r["error"] for r in rows)
    assert all((Path(r["run_dir"]) / "error.txt").is_file() for r in rows)
    assert result.summary["stopped"].startswith("2 failed trials in a row")
    assert result.summary["configurations_tried"] == 2


def test_the_cli_runs_a_study_and_prints_the_configurations_tried(
    prices: Path, tmp_path: Path
) -> None:
    path = tune_file(tmp_path, prices)
    args = ["tune", "--config", str(path), "--out", str(tmp_path / "out"), "--no-progress"]
    trainer = [a for o in TRAINER for a in ("--set", f"trainer.{o}")]
    res = CliRunner().invoke(main, [*args, *trainer, "--set", "n_trials=1"])
    assert res.exit_code == 0, res.output
    assert "configurations tried: 1" in res.output
    assert (tmp_path / "out" / "best.yaml").is_file()
    bad = CliRunner().invoke(
        main, [*args, *trainer, "--set", "space={algorithm.ent_coef: {choices: [auto]}}"]
    )
    assert bad.exit_code == 2
    assert "space.algorithm.ent_coef" in bad.output


def test_the_shipped_tuning_config_checks_against_its_trainer() -> None:
    config = load_tune_config(CONFIGS / "tune.yaml")
    space = config.search_space()
    assert config.trainer_source is not None
    assert {p.key for p in space.params} == set(config.space)
    shared = next(p for p in space.params if p.key == "shared.hidden")
    assert shared.spec.choices == [32, 64, 128]


def test_the_walk_forward_tuning_config_sees_nothing_after_the_first_training_span(
    tmp_path: Path,
) -> None:
    """Its trainer is the shared demo with the walk-forward's changes, cut before 2010."""
    config = load_tune_config(CONFIGS / "tune_walk_forward.yaml")
    walk_forward = load_walk_forward_config(
        CONFIGS / "walk_forward.yaml", [f"registry={tmp_path / 'models'}"]
    )
    first_test = plan(walk_forward, tmp_path / "out", "L")[0].window.test_start
    trainer = config.trainer
    assert trainer.data.train_end < first_test
    assert (trainer.selection.enabled, trainer.env.action.anchor.kind) == (
        True,
        "inverse_volatility",
    )
    assert trainer.policy == load_config(CONFIGS / "td3_shared_demo.yaml").policy
    anchor = next(p for p in config.search_space().params if p.key == "env.action.anchor.kind")
    assert "equal" in anchor.spec.choices


@pytest.mark.slow
def test_trials_fan_out_on_ray_with_the_local_values(study: TuneResult, tmp_path: Path) -> None:
    """Two trials at once as Ray tasks sharing the journal: the local study's first two."""
    config = study.config.model_copy(update={"n_trials": 2, "executor": "ray", "parallel": 2})
    result = run_tuning(config, out_dir=tmp_path / "ray", progress=False)
    assert result.summary["executor"] == "ray"
    assert result.summary["parallel"] == 2
    keys = ["number", "state", "value", *[f"params.{k}" for k in SPACE], "steps"]
    local_rows, ray_rows = read_trials(study)[:2], read_trials(result)
    assert [{k: r[k] for k in keys} for r in ray_rows] == [
        {k: r[k] for k in keys} for r in local_rows
    ]
    assert (result.out_dir / "best.yaml").is_file()


def test_sigterm_stops_a_study_and_keeps_the_finished_trials(prices: Path, tmp_path: Path) -> None:
    """``kill`` (or an eviction) mid-study: the finished trial is summarized and best, the
    running one is failed, nothing is left RUNNING in the journal, and the exit is 143."""
    path = tune_file(tmp_path, prices, n_trials=50)
    out = tmp_path / "out"
    trainer = [a for o in TRAINER for a in ("--set", f"trainer.{o}")]
    command = [sys.executable, "-m", "allocator.cli", "tune", "--config", str(path)]
    proc = subprocess.Popen(
        [*command, "--out", str(out), "--no-progress", *trainer],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not (out / "trials" / "trial-0001").exists():  # trial 0 told, trial 1 training
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "trial 1 never started"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, output
    assert "tuning stopped" in output
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert rows[0]["state"] == "COMPLETE"
    assert {r["state"] for r in rows[1:]} == {"FAIL"}
    assert "Stopped" in rows[-1]["error"]
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"]["batch_size"] == int(rows[0]["params.algorithm.batch_size"])
    summary = json.loads((out / "tune.json").read_text())
    assert summary["best"]["number"] == 0
    assert "RUNNING" not in summary["states"]


def test_an_interruption_optuna_turns_into_an_error_stays_one(tmp_path: Path) -> None:
    """Interrupted before it holds its journal lock, Optuna frees the lock anyway and raises
    ``RuntimeError`` in place of the signal; a trial must stop the study on it, not fail."""
    lock = JournalFileOpenLock(str(tmp_path / "study.journal"))
    stop = KeyboardInterrupt("stopped by signal SIGTERM")

    def interrupted_acquire() -> None:
        try:
            raise stop
        except BaseException:
            lock.release()  # what JournalFileOpenLock.acquire does on any BaseException

    with pytest.raises(RuntimeError, match="did not possess lock") as raised:
        interrupted_acquire()
    assert interruption(raised.value) is stop
    assert interruption(RuntimeError("a trial's own error")) is None
