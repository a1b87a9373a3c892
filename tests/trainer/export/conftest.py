"""Two tiny runs (TD3; SAC with curiosity), trained once for the package, and their export."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.trainer.export.run import export_run
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run import train
from tests.markets import random_walk_market, write_market
from tests.trainer.export import MAX_ASSETS, SHARED_MAX_ASSETS
from tests.trainer.tiny import TINY_SHARED, TINY_TRAINING

TINY = [
    "data.train_start=2019-01-01",
    "data.train_end=2019-09-30",
    "data.validation_start=2019-10-01",
    "data.validation_end=2020-02-20",
    f"env.max_assets={MAX_ASSETS}",
    *TINY_TRAINING,
]
SAC_ICM = [
    "algorithm.name=sac",
    "icm.enabled=true",
    "icm.warmup_steps=100",
    "icm.feature_dim=16",
    "icm.hidden_dim=32",
]


@pytest.fixture(scope="package")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny TD3 run and a tiny SAC run with curiosity, trained once for the package."""
    root = tmp_path_factory.mktemp("export-runs")
    csv = write_market(
        random_walk_market(n_dates=300, n_assets=3, seed=1).to_frame(), root / "m.csv"
    )
    base = [f"data.dataset={csv}", f"output_dir={root}", *TINY]
    out = {}
    for algo, extra in (("td3", ["name=tiny-td3"]), ("sac", ["name=tiny-sac", *SAC_ICM])):
        out[algo] = train(load_config(None, base + extra), root / algo).run_dir
    return out


@pytest.fixture(scope="package")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("registry")


@pytest.fixture(scope="package")
def exported(runs: dict[str, Path], registry: Path) -> dict[str, Path]:
    """Version 1 of each run in the package's registry."""
    return {algo: export_run(run, registry) for algo, run in runs.items()}


SHARED = [
    "data.train_start=2019-01-01",
    "data.train_end=2019-12-31",
    "data.validation_start=2020-01-01",
    "data.validation_end=2020-06-30",
    f"env.max_assets={SHARED_MAX_ASSETS}",
    *TINY_TRAINING,
    *TINY_SHARED,
]
SHARED_PARITY_SAMPLES = 200


@pytest.fixture(scope="package")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny shared-policy runs (TD3; SAC with curiosity) on 6 slots of a 12-asset market, with
    the per-asset features and the tilt mapping, trained once for the package. SAC's actor
    centres its asset scores, TD3's does not: the export tests cover both graphs."""
    root = tmp_path_factory.mktemp("shared-runs")
    csv = write_market(
        random_walk_market(n_dates=400, n_assets=12, seed=1).to_frame(), root / "m.csv"
    )
    base = [f"data.dataset={csv}", f"output_dir={root}", *SHARED]
    out = {}
    sac = ["name=shared-sac", *SAC_ICM]  # centred: the default
    td3 = ["name=shared-td3", "shared.center_assets=false"]
    for algo, extra in (("td3", td3), ("sac", sac)):
        out[algo] = train(load_config(None, base + extra), root / algo).run_dir
    return out


@pytest.fixture(scope="package")
def shared_exported(shared_runs: dict[str, Path], registry: Path) -> dict[str, Path]:
    """Version 1 of each shared run in the package's registry."""
    return {
        algo: export_run(run, registry, n_parity=SHARED_PARITY_SAMPLES)
        for algo, run in shared_runs.items()
    }
