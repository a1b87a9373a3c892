"""Typed training configs: YAML files, ``--set`` overrides, errors that name file and key, and
the resolved dump that reproduces a run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from allocator.trainer.agents.icm import ICMSettings
from allocator.trainer.agents.noise import AnnealKind, NoiseKind
from allocator.trainer.agents.regularizer import SmoothMode, SmoothnessSettings
from allocator.trainer.training.config import (
    LinearSchedule,
    SACSettings,
    TD3Settings,
    TrainConfig,
    apply_overrides,
    dump_config,
    load_config,
)
from allocator.typed_config import ConfigError

BASE = """\
name: unit
seed: 7
total_timesteps: 5000
env:
  max_assets: 3
  window: 5
  beta: 0.2
algorithm:
  gamma: 0.9
  net_arch: [32, 16]
  smoothness:
    mode: fixed
    lam: 0.5
noise:
  kind: ou
  sigma: 0.25
"""


def write(tmp_path: Path, text: str, name: str = "train.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(path: Path | None, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


# --- loading --------------------------------------------------------------------------------


def test_load_config_reads_yaml_into_typed_settings(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE))
    assert cfg.name == "unit"
    assert cfg.seed == 7
    assert cfg.total_timesteps == 5000
    assert (cfg.env.max_assets, cfg.env.window, cfg.env.beta) == (3, 5, 0.2)
    assert cfg.env.episode_length == 252  # unspecified: default
    assert isinstance(cfg.algorithm, TD3Settings)  # no name: td3
    assert cfg.algorithm.gamma == 0.9
    assert cfg.algorithm.net_arch == [32, 16]
    assert cfg.algorithm.smoothness == SmoothnessSettings(mode=SmoothMode.FIXED, lam=0.5)
    assert cfg.noise.kind == NoiseKind.OU
    assert cfg.noise.sigma == 0.25
    assert cfg.noise.anneal == AnnealKind.LINEAR


def test_no_path_and_empty_file_give_the_defaults(tmp_path: Path) -> None:
    assert load_config(None) == TrainConfig()
    assert load_config(write(tmp_path, "")) == TrainConfig()
    assert isinstance(TrainConfig().algorithm, TD3Settings)


def test_sac_by_name_gets_sac_settings_and_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "algorithm:\n  name: sac\n  ent_coef: 0.1\n"))
    assert isinstance(cfg.algorithm, SACSettings)
    assert cfg.algorithm.actor_learning_rate == 3e-4
    assert cfg.algorithm.critic_learning_rate == 3e-4
    assert cfg.algorithm.ent_coef == 0.1
    assert isinstance(load_config(None, ["algorithm.name=sac"]).algorithm, SACSettings)


def test_algorithm_section_without_name_is_td3(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "algorithm:\n  batch_size: 64\n"))
    assert isinstance(cfg.algorithm, TD3Settings)
    assert cfg.algorithm.name == "td3"
    assert cfg.algorithm.batch_size == 64
    assert cfg.algorithm.actor_learning_rate == 1e-4  # TD3's defaults, not SAC's


def test_learning_rate_may_be_a_linear_schedule(tmp_path: Path) -> None:
    text = "algorithm:\n  actor_learning_rate: {start: 0.001, end: 0.00001, end_fraction: 0.5}\n"
    cfg = load_config(write(tmp_path, text))
    assert cfg.algorithm.actor_learning_rate == LinearSchedule(
        start=1e-3, end=1e-5, end_fraction=0.5
    )
    assert cfg.algorithm.critic_learning_rate == 1e-3


# --- overrides ------------------------------------------------------------------------------


def test_set_overrides_dotted_keys_on_top_of_the_file(tmp_path: Path) -> None:
    cfg = load_config(
        write(tmp_path, BASE),
        ["algorithm.smoothness.mode=adaptive", "env.beta=0.3", "algorithm.smoothness.alpha=0.2"],
    )
    assert cfg.algorithm.smoothness.mode == SmoothMode.ADAPTIVE
    assert cfg.algorithm.smoothness.lam == 0.5  # kept from the file
    assert cfg.algorithm.smoothness.alpha == 0.2
    assert cfg.env.beta == 0.3
    assert cfg.env.window == 5


def test_set_values_are_parsed_as_yaml() -> None:
    cfg = load_config(
        None,
        [
            "algorithm.net_arch=[8, 4]",
            "progress_bar=false",
            "total_timesteps=1234",
            "icm.enabled=true",
            "algorithm.max_grad_norm=null",
            "algorithm.critic_learning_rate={start: 0.01, end: 0.001}",
        ],
    )
    assert cfg.algorithm.net_arch == [8, 4]
    assert cfg.progress_bar is False
    assert cfg.total_timesteps == 1234
    assert cfg.icm.enabled is True
    assert cfg.algorithm.max_grad_norm is None
    assert cfg.algorithm.critic_learning_rate == LinearSchedule(start=0.01, end=0.001)


def test_apply_overrides_builds_missing_sections_and_keeps_the_rest() -> None:
    tree = {"env": {"beta": 0.1, "window": 5}}
    out = apply_overrides(tree, ["env.beta=0.4", "algorithm.smoothness.lam=2", "seed=3"])
    assert out == {
        "env": {"beta": 0.4, "window": 5},
        "algorithm": {"smoothness": {"lam": 2}},
        "seed": 3,
    }


@pytest.mark.parametrize("item", ["env.beta", "=3", " =3", ""])
def test_set_without_key_value_form_is_a_config_error(item: str) -> None:
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, [item])


def test_set_below_a_scalar_is_a_config_error(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, BASE), ["env.beta.x=1"])
    assert "env.beta.x" in message
    assert "not a section" in message


# --- errors name the file and the key ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("bogus: 1\n", "bogus"),
        ("env:\n  betta: 0.3\n", "env.betta"),
        ("env:\n  reward:\n    kindd: sortino\n", "env.reward.kindd"),
        ("noise:\n  sigmaa: 0.1\n", "noise.sigmaa"),
        ("icm:\n  enabeld: true\n", "icm.enabeld"),
    ],
)
def test_unknown_key_in_file_names_file_and_dotted_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    message = config_error(path)
    assert str(path) in message
    assert key in message
    assert "Extra inputs" in message


def test_unknown_key_under_algorithm_is_rejected_and_named(tmp_path: Path) -> None:
    path = write(tmp_path, "algorithm:\n  smoothnes:\n    mode: adaptive\n")
    message = config_error(path)
    assert str(path) in message
    assert "smoothnes" in message
    assert "Extra inputs" in message


def test_unknown_key_under_algorithm_is_named_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    message = config_error(path, ["algorithm.smoothnes.mode=adaptive"])
    assert "algorithm.smoothnes:" in message


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("nosuch=1", "nosuch"),
        ("env.betta=0.3", "env.betta"),
        ("algorithm.smoothnes.mode=adaptive", "smoothnes"),
        ("env.beta=1.5", "env.beta"),
        ("env.beta=-0.1", "env.beta"),
        ("algorithm.gamma=0", "gamma"),
        ("algorithm.smoothness.mode=sometimes", "smoothness.mode"),
        ("algorithm.smoothness.lam=-1", "smoothness.lam"),
        ("noise.anneal_fraction=0", "noise.anneal_fraction"),
        ("device=tpu", "device"),
        ("name=has space", "name"),
    ],
)
def test_bad_override_names_file_and_key(tmp_path: Path, override: str, key: str) -> None:
    path = write(tmp_path, BASE)
    message = config_error(path, [override])
    assert message.startswith(f"{path}: invalid configuration")
    assert key in message


def test_errors_without_a_file_say_defaults() -> None:
    message = config_error(None, ["env.beta=1.5"])
    assert message.startswith("(defaults)")
    assert "env.beta" in message
    assert "less than 1" in message


def test_unknown_algorithm_name_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    message = config_error(path, ["algorithm.name=ppo"])
    assert str(path) in message
    assert "algorithm" in message
    assert "ppo" in message
    assert "ppo" in config_error(write(tmp_path, "algorithm: {name: ppo}\n", "b.yaml"))


@pytest.mark.parametrize(
    "key",
    [
        "policy_delay: 3",
        "critic_loss: mse",
        "smoothness: {mode: fixed}",
        "target_policy_noise: 0.1",
    ],
)
def test_td3_only_keys_under_sac_are_rejected(tmp_path: Path, key: str) -> None:
    path = write(tmp_path, f"algorithm:\n  name: sac\n  {key}\n")
    message = config_error(path)
    assert str(path) in message
    assert key.split(":")[0] in message
    assert "Extra inputs" in message


def test_sac_keys_under_td3_are_rejected(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "algorithm:\n  ent_coef: auto\n"))
    assert "ent_coef" in message


@pytest.mark.parametrize(
    "period",
    [
        {"train_end": "2016-01-01"},  # train ends after validation starts
        {"train_start": "2015-01-01"},  # train starts after it ends
        {"validation_start": "2014-06-01"},  # validation inside training
        {"validation_end": "2014-12-31"},  # validation ends before it starts
        {"train_end": "2015-01-01"},  # train end == validation start: overlap
    ],
)
def test_data_period_order_is_validated(tmp_path: Path, period: dict[str, str]) -> None:
    path = write(tmp_path, yaml.safe_dump({"data": period}))  # dates quoted as strings
    message = config_error(path)
    assert str(path) in message
    assert "data" in message
    assert "train_start < train_end < validation_start <= validation_end" in message


def test_one_day_validation_period_is_allowed(tmp_path: Path) -> None:
    text = "data:\n  validation_start: '2015-06-01'\n  validation_end: '2015-06-01'\n"
    assert str(load_config(write(tmp_path, text)).data.validation_end) == "2015-06-01"


def test_unquoted_yaml_dates_are_accepted(tmp_path: Path) -> None:
    # YAML reads an unquoted 2001-01-01 as a date; a plain config file must still load.
    text = "data:\n  train_start: 2001-01-01\n  train_end: 2010-12-31\n"
    cfg = load_config(write(tmp_path, text))
    assert str(cfg.data.train_start) == "2001-01-01"
    assert str(cfg.data.train_end) == "2010-12-31"
    cfg = load_config(None, ["data.train_end=2013-06-30"])
    assert str(cfg.data.train_end) == "2013-06-30"


@pytest.mark.parametrize("value", ["2000-13-45", "banana"])
def test_data_dates_must_be_dates(tmp_path: Path, value: str) -> None:
    message = config_error(write(tmp_path, BASE), [f"data.train_start='{value}'"])
    assert str(tmp_path / "train.yaml") in message
    assert "data.train_start" in message


# --- files that are not configs -----------------------------------------------------------------


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    message = config_error(path)
    assert str(path) in message
    assert "not found" in message


@pytest.mark.parametrize("text", ["- a\n- b\n", "42\n", "just a string\n"])
def test_non_mapping_yaml_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    message = config_error(path)
    assert str(path) in message
    assert "mapping" in message


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "env: {beta: [0.3\n")
    message = config_error(path)
    assert str(path) in message
    assert "not valid YAML" in message


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# --- dump ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        TrainConfig(),
        TrainConfig(
            name="sac-run",
            seed=3,
            algorithm=SACSettings(
                actor_learning_rate=LinearSchedule(start=1e-3, end=1e-5, end_fraction=0.4),
                ent_coef=0.2,
                net_arch=[8],
            ),
            icm=ICMSettings(enabled=True, intrinsic_weight=0.3),
        ),
        TrainConfig(
            algorithm=TD3Settings(
                smoothness=SmoothnessSettings(mode="adaptive", lam=0.1, budget=0.02),
                max_grad_norm=None,
                critic_loss="mse",
            ),
            noise={"kind": "none", "anneal": "exponential"},
            data={"assets": ["A", "B"], "dataset": "prices.csv"},
        ),
    ],
    ids=["defaults", "sac", "td3"],
)
def test_dump_config_round_trips(tmp_path: Path, cfg: TrainConfig) -> None:
    text = dump_config(cfg)
    assert load_config(write(tmp_path, text)) == cfg
    # Every setting is spelled out, defaults included.
    tree = yaml.safe_load(text)
    assert set(tree) == set(TrainConfig.model_fields)
    assert set(tree["algorithm"]) == set(type(cfg.algorithm).model_fields)
    assert tree["algorithm"]["name"] == cfg.algorithm.name
