"""A small exported shared policy for the serving tests, built from the real torch networks.

The actor is ``SharedTD3Policy``'s (the per-asset network training uses) on a ``PortfolioEnv``
of the new representation; its parameters are perturbed so its actions are far from 0 (a
freshly initialized head outputs ~0, which would make every tilt the anchor and hide mistakes).
The graph is exported here as the exporter does for a shared run: raw per-asset features in,
normalized inside (``portfolio.normalize_features``), ``forward_sets`` with a dynamic asset
axis, the action out. The manifest is schema 3 with the representation's settings.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from torch import nn

from allocator.artifacts.manifest import (
    TILT_MAPPING,
    AnchorInfo,
    DataInfo,
    FeatureNormalizationInfo,
    FeatureSpecInfo,
    Manifest,
    NormalizationInfo,
    PolicyInfo,
    TiltInfo,
    checksums,
    write_manifest,
)
from allocator.portfolio import FeatureNormalization, fit_feature_normalization
from allocator.registry.layout import SHARED_POLICY_INPUTS, SHARED_POLICY_OUTPUTS
from allocator.trainer.agents.shared_policies import SharedTD3Actor, SharedTD3Policy
from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from tests.markets import random_walk_market
from tests.serving import OPSET, Spec
from tests.serving.conftest import action_icm_model

SLOTS = 6
"""Training slots M of the test model: requests of 3 and 12 assets are below and above it."""
MAX_SERVED = 20
BETA = 0.5
COST_BPS = 10.0

ENV_CONFIG = EnvConfig(
    max_assets=SLOTS,
    window=5,
    episode_length=20,
    beta=BETA,
    cost_bps=COST_BPS,
    features="asset_v1",
    horizons=[3, 6],
    vol_window=4,
    action={
        "mapping": "tilt",
        "k": 1.5,
        "anchor": {"kind": "inverse_volatility", "cash_share": 0.1, "vol_window": 8},
    },
)


@dataclass
class SharedFixture:
    """The torch actor, the environment settings and statistics it was exported with."""

    actor: SharedTD3Actor
    config: EnvConfig
    norm: FeatureNormalization
    data: MarketData

    @property
    def n_features(self) -> int:
        return self.config.asset_feature_spec.n_features

    def icm_spec(self) -> Spec:
        """The flat layout the ICM of this model reads: M slots of F raw features."""
        return Spec(max_assets=SLOTS, window=self.n_features)


class ServedActor(nn.Module):
    """What the shared graph computes: normalize the raw features, then ``forward_sets``."""

    def __init__(self, actor: SharedTD3Actor, norm: FeatureNormalization, clip: float) -> None:
        super().__init__()
        self.actor = actor
        self.register_buffer("mean", th.tensor(norm.mean, dtype=th.float32))
        self.register_buffer("std", th.tensor(norm.std, dtype=th.float32))
        self.clip = clip

    def forward(self, features: th.Tensor, weights: th.Tensor, mask: th.Tensor) -> th.Tensor:
        z = ((features - self.mean) / self.std).clamp(-self.clip, self.clip)
        live = (mask[:, 1:] > 0.5).unsqueeze(-1)
        z = th.where(live, z, th.zeros_like(z))
        return self.actor.forward_sets(z, weights, mask)


def build_fixture(seed: int = 0) -> SharedFixture:
    """The actor of a ``SharedTD3Policy`` on the representation's env, perturbed, in eval mode."""
    th.manual_seed(seed)
    data = random_walk_market(n_dates=160, n_assets=14, seed=seed + 11)
    norm = fit_feature_normalization(data.prices[:80], ENV_CONFIG.asset_feature_spec)
    env = PortfolioEnv(data, ENV_CONFIG, feature_norm=norm)
    policy = SharedTD3Policy(
        env.observation_space,
        env.action_space,
        lambda _: 1e-3,
        n_features=ENV_CONFIG.n_features,
        hidden=16,
    )
    actor = policy.actor
    with th.no_grad():
        for p in actor.parameters():
            p.add_(0.4 * th.randn_like(p))
    actor.eval()
    return SharedFixture(actor=actor, config=ENV_CONFIG, norm=norm, data=data)


def export_graph(fixture: SharedFixture, path: Path, *, fixed_assets: bool = False) -> None:
    """``model.onnx`` of the shared policy; ``fixed_assets`` freezes the asset axis (a bad
    export the loader must refuse)."""
    module = ServedActor(fixture.actor, fixture.norm, fixture.config.obs_clip).eval()
    n = 4
    example = (
        th.zeros(2, n, fixture.n_features),
        th.full((2, n + 1), 1.0 / (n + 1)),
        th.ones(2, n + 1),
    )
    slots: dict[int, str] = {0: "batch"} if fixed_assets else {0: "batch", 1: "slots"}
    assets: dict[int, str] = {0: "batch"} if fixed_assets else {0: "batch", 1: "assets"}
    features, weights, mask = SHARED_POLICY_INPUTS
    (action,) = SHARED_POLICY_OUTPUTS
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated, still supported
        warnings.simplefilter("ignore", DeprecationWarning)
        th.onnx.export(
            module,
            example,
            str(path),
            input_names=list(SHARED_POLICY_INPUTS),
            output_names=[action],
            dynamic_axes={features: assets, weights: slots, mask: slots, action: slots},
            opset_version=OPSET,
            dynamo=False,
        )


def shared_manifest(fixture: SharedFixture, files: dict[str, str], **changes: Any) -> Manifest:
    """The schema-3 manifest of the exported shared policy."""
    config = fixture.config
    anchor = config.action.anchor
    fields: dict[str, Any] = {
        "name": "shared-test",
        "algorithm": "td3",
        "feature_spec": FeatureSpecInfo.for_assets(SLOTS, config.asset_feature_spec),
        "normalization": NormalizationInfo(mean=0.0, std=1.0),
        "feature_normalization": FeatureNormalizationInfo.of(fixture.norm),
        "policy": PolicyInfo(kind="shared", hidden=16),
        "action_mapping": TILT_MAPPING,
        "tilt": TiltInfo(
            k=config.action.k,
            anchor=AnchorInfo(
                kind=anchor.kind, cash_share=anchor.cash_share, vol_window=anchor.vol_window
            ),
        ),
        "max_served_assets": MAX_SERVED,
        "beta": BETA,
        "cost_bps": COST_BPS,
        "data": DataInfo(
            dataset="synthetic",
            universe=list(fixture.data.assets),
            train_start="2019-01-01",
            train_end="2019-05-01",
        ),
        "export": {"format": "onnx", "opset": OPSET, "anchor_and_tilt": "server (numpy)"},
        "files": files,
    }
    fields.update(changes)
    return Manifest(**fields)


def write_shared_model(
    directory: Path,
    fixture: SharedFixture,
    *,
    icm: bool = False,
    fixed_assets: bool = False,
    **manifest_changes: Any,
) -> Path:
    """An exported shared-policy directory (``icm``: plus the action-reading test ICM graph
    over the flat M-slot observation of raw features)."""
    directory.mkdir(parents=True, exist_ok=True)
    export_graph(fixture, directory / "model.onnx", fixed_assets=fixed_assets)
    names = ["model.onnx"]
    if icm:
        model = action_icm_model(fixture.icm_spec())
        (directory / "icm.onnx").write_bytes(model.SerializeToString())
        names.append("icm.onnx")
    files = checksums(directory, names)
    write_manifest(directory, shared_manifest(fixture, files, **manifest_changes))
    return directory


def reference_action(
    fixture: SharedFixture, normalized: np.ndarray, weights: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """The torch actor's action on already-normalized features (what training runs)."""
    with th.no_grad():
        out = fixture.actor.forward_sets(
            th.tensor(np.asarray(normalized), dtype=th.float32),
            th.tensor(np.asarray(weights), dtype=th.float32),
            th.tensor(np.asarray(mask, dtype=np.float32)),
        )
    return out.numpy()
