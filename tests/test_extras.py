"""Ray, Optuna, TensorBoard and MLflow are extras of their own: each part that needs one, run
without it, says which extra to install instead of failing with a bare ImportError."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from allocator.trainer import MissingExtraError, require_extra


@pytest.mark.parametrize(
    ("module", "extra"),
    [("ray", "ray"), ("optuna", "tune"), ("tensorboard", "tensorboard"), ("mlflow", "mlflow")],
)
def test_a_missing_extra_is_named(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(MissingExtraError, match=rf"pip install 'allocator\[{extra}\]'"):
        require_extra(module, extra, "this part")


def test_the_ray_executor_names_the_extra(monkeypatch):
    """Every job's Ray executor (walk-forward, tuning, suite) is this one."""
    from allocator.trainer.jobs.executors import ExecutorSettings, open_executor

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingExtraError, match=r"allocator\[ray\]"):
        open_executor(ExecutorSettings(executor="ray", workers=1), str, str)


def test_tune_without_optuna_says_which_extra(monkeypatch, tmp_path):
    from allocator.cli import main

    monkeypatch.setitem(sys.modules, "optuna", None)
    result = CliRunner().invoke(main, ["tune", "--config", str(tmp_path / "any.yaml")])
    assert result.exit_code == 2
    assert "pip install 'allocator[tune]'" in result.output
    assert "Traceback" not in result.output


def test_train_tracked_in_mlflow_without_it_says_which_extra(monkeypatch, tmp_path):
    from allocator.cli import main

    monkeypatch.setitem(sys.modules, "mlflow", None)
    args = ["train", "--set", "tracking.backend=mlflow", "--set", f"output_dir={tmp_path}"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "pip install 'allocator[mlflow]'" in result.output
    assert "Traceback" not in result.output
    assert not list(tmp_path.iterdir()), "refused before any run directory was made"
