"""``allocator serve``'s settings: flags > ALLOCATOR_* variables > --config file > defaults,
and a bad value named where it came from. The retraining job and the database URL read the
same variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from allocator.cli import main
from allocator.recording.settings import DEFAULT_DATABASE_URL, database_url
from allocator.serving.config import load_server_config
from allocator.typed_config import ConfigError, env_overrides

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No ALLOCATOR_* or DATABASE_URL of the shell running the tests."""
    import os

    for name in list(os.environ):
        if name.startswith("ALLOCATOR_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return path


def test_environment_and_file_set_the_settings(monkeypatch, tmp_path):
    config_file = write_config(tmp_path, "registry: /models\nport: 6000\nthreads: 3\n")
    monkeypatch.setenv("ALLOCATOR_PORT", "7000")
    monkeypatch.setenv("ALLOCATOR_DATABASE_URL", "sqlite:///env.db")
    monkeypatch.setenv("ALLOCATOR_PUSHGATEWAY_URL", "http://elsewhere")  # not serve's: ignored
    config = load_server_config({}, config_file)
    assert str(config.registry) == "/models"  # the file
    assert config.threads == 3  # the file
    assert config.port == 7000  # the environment over the file
    assert config.database_url == "sqlite:///env.db"
    assert config.host == "127.0.0.1"  # the default


def test_a_flag_overrides_the_environment_and_the_file(monkeypatch, tmp_path):
    config_file = write_config(tmp_path, "registry: /models\nport: 6000\n")
    monkeypatch.setenv("ALLOCATOR_PORT", "7000")
    monkeypatch.setenv("ALLOCATOR_REGISTRY", "/env-models")
    config = load_server_config({"port": 8000}, config_file)
    assert config.port == 8000
    assert str(config.registry) == "/env-models"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("env", "ALLOCATOR_PORT: Input should be a valid integer"),
        ("file", "port (in "),
        ("flag", "--port: Input should be less than or equal to 65535"),
    ],
)
def test_a_bad_value_names_where_it_came_from(monkeypatch, tmp_path, source, expected):
    config_file = write_config(tmp_path, "registry: /models\n")
    flags: dict[str, object] = {}
    if source == "env":
        monkeypatch.setenv("ALLOCATOR_PORT", "fifty")
    elif source == "file":
        config_file.write_text("registry: /models\nport: fifty\n")
    else:
        flags["port"] = 70000
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_server_config(flags, config_file)


def test_missing_and_unknown_settings_are_explained(tmp_path):
    with pytest.raises(ConfigError, match=r"registry: Field required.*ALLOCATOR_REGISTRY"):
        load_server_config({})
    typo = write_config(tmp_path, "registry: /models\nthread: 3\n")
    with pytest.raises(ConfigError, match=r"thread .in .*: Extra inputs are not permitted"):
        load_server_config({}, typo)
    with pytest.raises(ConfigError, match="no such file"):
        load_server_config({}, tmp_path / "absent.yaml")


def test_the_command_reports_a_bad_variable_without_a_traceback(monkeypatch, tmp_path):
    monkeypatch.setenv("ALLOCATOR_REGISTRY", str(tmp_path))
    monkeypatch.setenv("ALLOCATOR_WORKERS", "0")
    result = CliRunner().invoke(main, ["serve", "--cpu"])
    assert result.exit_code == 2
    assert "error: ALLOCATOR_WORKERS: Input should be greater than or equal to 1" in result.output
    assert "Traceback" not in result.output


def test_database_url_prefers_the_allocator_variable(monkeypatch):
    assert database_url() == DEFAULT_DATABASE_URL
    monkeypatch.setenv("DATABASE_URL", "sqlite:///fallback.db")
    assert database_url() == "sqlite:///fallback.db"  # the documented fallback still works
    monkeypatch.setenv("ALLOCATOR_DATABASE_URL", "sqlite:///ours.db")
    assert database_url() == "sqlite:///ours.db"


def test_retrain_reads_its_variables_between_the_file_and_set(monkeypatch):
    from allocator.trainer.jobs.retrain.config import RetrainConfig, load_retrain_config

    environ = {"ALLOCATOR_GATES__MAX_TURNOVER": "0.2", "ALLOCATOR_PORT": "1"}
    assert env_overrides(RetrainConfig, environ) == [
        ("ALLOCATOR_GATES__MAX_TURNOVER", "gates.max_turnover=0.2")
    ]
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("ALLOCATOR_GATES__MAX_TURNOVER", "0.2")
    monkeypatch.setenv("ALLOCATOR_MODEL_NAME", "from-env")
    config = load_retrain_config("configs/retrain.yaml", ["model_name=from-set"])
    assert config.gates.max_turnover == 0.2
    assert config.model_name == "from-set"
    monkeypatch.setenv("ALLOCATOR_HOLDOUT_DAYS", "two")
    with pytest.raises(ConfigError, match="ALLOCATOR_HOLDOUT_DAYS"):
        load_retrain_config("configs/retrain.yaml")
