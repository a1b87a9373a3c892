"""The graphs of a shared (per-asset) policy: a dynamic asset axis, features normalized inside.

* ``SharedPolicyGraph`` (``model.onnx``) takes the *raw* per-asset features of any number of
  assets N (``portfolio.asset_features``), the current weights and the mask, normalizes the
  features with the manifest's statistics and returns the actor's action for cash and each
  asset. The mapping to weights is not in the graph: the tilt mapping needs the anchor, which
  the server computes from the request's own prices with ``portfolio.anchor_weights`` (as the
  environment does), so both sides call the very same numpy functions instead of a second
  implementation in graph ops.
* ``AssetObservationNormalizer`` normalizes the flat observation of the ``max_assets``
  training slots whose asset block holds raw per-asset features: the curiosity graph
  (``icm.onnx``) uses it, since the curiosity module was trained on that layout and has no
  asset axis.
"""

from __future__ import annotations

import torch
from torch import nn

from allocator.portfolio import FeatureNormalization, FeatureSpec

__all__ = [
    "AssetObservationNormalizer",
    "FeatureNormalizer",
    "SetActor",
    "SharedPolicyGraph",
    "live_slots",
]


def live_slots(mask: torch.Tensor) -> torch.Tensor:
    """Boolean live slots (B, N + 1) of a mask of any width: non-zero entries, cash always live
    (``portfolio.live_mask``)."""
    cash = torch.ones_like(mask[:, :1], dtype=torch.bool)
    return torch.cat([cash, mask[:, 1:] != 0], dim=1)


class FeatureNormalizer(nn.Module):
    """``portfolio.normalize_features`` in torch ops: ``(raw - mean) / std``, clipped, masked
    rows zeroed.

    The standardization runs in float64, as numpy does, so the result matches numpy bit for bit;
    ``where`` (not a product with the mask) zeroes masked rows even when they hold NaN.
    """

    mean: torch.Tensor
    std: torch.Tensor
    clip: torch.Tensor

    def __init__(self, norm: FeatureNormalization, clip: float) -> None:
        super().__init__()
        self.n_features = norm.n_features
        # float64 tensors, not Python floats: the exporter would store scalars as float32.
        self.register_buffer("mean", torch.tensor(norm.mean, dtype=torch.float64), False)
        self.register_buffer("std", torch.tensor(norm.std, dtype=torch.float64), False)
        self.register_buffer("clip", torch.tensor(float(clip), dtype=torch.float64), False)

    def forward(self, raw: torch.Tensor, live_assets: torch.Tensor) -> torch.Tensor:
        """``raw`` (B, N, F) and ``live_assets`` (B, N) bool -> float32 (B, N, F)."""
        z = (raw.to(torch.float64) - self.mean) / self.std
        z = torch.clamp(z, -self.clip, self.clip).to(torch.float32)  # tensor bounds: float64
        return torch.where(live_assets.unsqueeze(-1), z, 0.0)


class SetActor(nn.Module):
    """The deterministic set action of a shared TD3 or SAC actor (``forward_sets``).

    Both shared actors offer ``forward_sets(features, weights, mask)``: TD3's ``tanh(score)``,
    SAC's squashed-Gaussian mode ``tanh(mean)``, with masked slots 0.
    """

    def __init__(self, actor: nn.Module) -> None:
        super().__init__()
        if not callable(getattr(actor, "forward_sets", None)):
            raise TypeError(f"{type(actor).__name__} has no forward_sets: not a shared actor")
        self.actor = actor

    def forward(
        self, features: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        return self.actor.forward_sets(features, weights, mask)  # type: ignore[operator]


class SharedPolicyGraph(nn.Module):
    """Raw asset features (B, N, F), weights and mask (B, N + 1) -> action (B, N + 1).

    The mask the actor sees is the graph's own liveness (0/1, cash live), the same slots the
    features were masked with, whatever non-zero values the caller used.
    """

    def __init__(self, actor: nn.Module, norm: FeatureNormalization, clip: float) -> None:
        super().__init__()
        self.normalizer = FeatureNormalizer(norm, clip)
        self.actor = SetActor(actor)

    def forward(
        self, asset_features: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        live = live_slots(mask)
        features = self.normalizer(asset_features, live[:, 1:])
        return self.actor(features, weights, live.to(torch.float32))


class AssetObservationNormalizer(nn.Module):
    """A raw flat observation ``[M*F raw asset features, weights, mask]`` -> the normalized
    observation the training environment produced (``portfolio.build_asset_observation``)."""

    def __init__(self, layout: FeatureSpec, norm: FeatureNormalization) -> None:
        super().__init__()
        if layout.window != norm.n_features:
            raise ValueError(f"layout has {layout.window} features per slot, the norm {norm}")
        self.layout = layout
        self.normalizer = FeatureNormalizer(norm, layout.clip)

    def forward(self, raw: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m, f, slots = self.layout.max_assets, self.layout.window, self.layout.n_slots
        live = live_slots(mask)
        block = raw[:, : m * f].reshape(-1, m, f)
        z = self.normalizer(block, live[:, 1:]).reshape(-1, m * f)
        weights = raw[:, m * f : m * f + slots]
        return torch.cat([z, weights, live.to(torch.float32)], dim=-1)
