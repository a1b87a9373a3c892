"""A shared run trained and exported by the real pipeline serves through the serving path.

The other shared-serving tests use a directly exported actor; this one closes the loop with
``allocator train`` and ``allocator export``: the published version loads, answers requests of
more assets than its training slots, and its answers are the torch actor's, tilted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch as th

from allocator.portfolio import (
    anchor_weights,
    asset_features,
    normalize_features,
    tilt_weights,
)
from allocator.serving import load_model
from allocator.trainer.export.loaded_run import load_run
from allocator.trainer.export.run import export_run
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run import train
from tests.markets import random_walk_market, write_market
from tests.serving.conftest import decide_one, request_for
from tests.trainer.tiny import TINY_SHARED, TINY_TRAINING

th.set_num_threads(1)


def test_an_exported_shared_run_serves_twelve_assets(tmp_path: Path) -> None:
    csv = write_market(
        random_walk_market(n_dates=300, n_assets=12, seed=1).to_frame(), tmp_path / "m.csv"
    )
    overrides = [
        f"data.dataset={csv}",
        f"output_dir={tmp_path}",
        "data.train_start=2019-01-01",
        "data.train_end=2019-09-30",
        "data.validation_start=2019-10-01",
        "data.validation_end=2020-02-28",
        "env.max_assets=6",
        *TINY_TRAINING,
        *TINY_SHARED,
        "name=served-shared",
    ]
    run = train(load_config(None, overrides), tmp_path / "run").run_dir
    version = export_run(run, tmp_path / "registry", n_parity=50)
    model = load_model(version, prefer_cuda=False)
    assert model.set_policy is not None
    assert model.manifest.policy.kind == "shared"

    n = 12
    rng = np.random.default_rng(0)
    prices = 30.0 * np.exp(np.cumsum(rng.normal(0, 0.02, (n, model.prices_per_asset)), axis=1))
    current = rng.dirichlet(np.ones(n + 1))
    out, _ = decide_one(
        model, request_for(model, [f"Z{i}" for i in range(n)], prices, current), None
    )

    loaded = load_run(run)
    actor = loaded.model.actor
    policy = model.set_policy
    mask = np.ones(n + 1, dtype=bool)
    norm = model.manifest.feature_normalization
    assert norm is not None
    z = normalize_features(
        asset_features(prices, mask, policy.features), norm.normalization(), 10.0, mask
    )
    with th.no_grad():
        action = actor.forward_sets(
            th.tensor(z[None]),
            th.tensor(current[None], dtype=th.float32),
            th.ones(1, n + 1),
        ).numpy()[0]
    want = tilt_weights(action, anchor_weights(prices, mask, policy.anchor), mask, policy.k)
    np.testing.assert_allclose(out.raw_weights, want, atol=1e-6)
    assert out.raw_weights.sum() == pytest.approx(1.0, abs=1e-12)
