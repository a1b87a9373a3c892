"""Canonical float64 evaluation: forward passes in which summation order cannot matter, so a
widened model's inserted zero terms add nothing and it must match the original bit for bit
(float32 BLAS groups a longer row's terms differently, by an ulp or two)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import NDArray
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.torch_layers import FlattenExtractor
from torch import nn

from allocator.trainer.checkpoints.errors import CheckpointUpgradeError

Array = NDArray[np.float64]


def _elementwise(module: nn.Module, x: Array) -> Array:
    """Activations, element by element in float64 (scalar libm: no SIMD-path differences)."""
    if isinstance(module, nn.ReLU):
        return np.maximum(x, 0.0)
    if isinstance(module, nn.Tanh):
        return np.vectorize(math.tanh, otypes=[np.float64])(x)
    if isinstance(module, nn.ELU):
        alpha = float(module.alpha)
        return np.vectorize(lambda v: v if v > 0 else alpha * math.expm1(v), otypes=[np.float64])(x)
    if isinstance(module, (nn.Identity, nn.Flatten)):
        return x
    raise CheckpointUpgradeError(f"cannot verify a network with a {type(module).__name__} layer")


def canonical_linear(x: Array, w: Array, b: Array) -> Array:
    """``x @ w.T + b`` with each dot product's terms sorted and added one by one in float64:
    the sum depends only on the multiset of its terms."""
    out = np.empty((len(x), w.shape[0]))
    chunk = max(1, 4_000_000 // (w.shape[0] * (w.shape[1] + 1)))
    for s in range(0, len(x), chunk):
        xs = x[s : s + chunk]
        bias = np.broadcast_to(b[None, :, None], (len(xs), w.shape[0], 1))
        terms = np.concatenate([w[None] * xs[:, None, :], bias], axis=2)
        terms.sort(axis=2)
        out[s : s + chunk] = np.cumsum(terms, axis=2)[..., -1]  # accumulate: sequential
    return out


def canonical_forward(layers: Iterable[nn.Module], x: NDArray[np.floating[Any]]) -> Array:
    """A float64 forward pass in which summation order cannot matter (``canonical_linear``)."""
    out = np.asarray(x, dtype=np.float64)
    for module in layers:
        if isinstance(module, nn.Sequential):
            out = canonical_forward(module, out)
        elif isinstance(module, nn.Linear):
            w = module.weight.detach().cpu().double().numpy()
            bias = module.bias
            b = np.zeros(len(w)) if bias is None else bias.detach().cpu().double().numpy()
            out = canonical_linear(out, w, b)
        else:
            out = _elementwise(module, out)
    return out


def actor_layers(model: BaseAlgorithm) -> dict[str, list[nn.Module]]:
    """The deterministic actor(s) of a TD3/SAC ``MlpPolicy`` as plain layer lists."""
    policy: Any = model.policy
    if not isinstance(policy.actor.features_extractor, FlattenExtractor):
        raise CheckpointUpgradeError("cannot verify: the actor's features extractor is not Flatten")
    if hasattr(policy.actor, "latent_pi"):  # SAC: deterministic action = tanh(mu(latent))
        if policy.actor.use_sde:
            raise CheckpointUpgradeError("cannot verify a SAC actor with gSDE")
        return {"actor": [*policy.actor.latent_pi, policy.actor.mu, nn.Tanh()]}
    return {"actor": list(policy.actor.mu), "actor_target": list(policy.actor_target.mu)}


def critic_layers(model: BaseAlgorithm) -> dict[str, list[nn.Module]]:
    """The twin critics and their targets of a TD3/SAC ``MlpPolicy`` as plain layer lists."""
    policy: Any = model.policy
    return {
        f"{name}.qf{i}": list(q)
        for name in ("critic", "critic_target")
        for i, q in enumerate(getattr(policy, name).q_networks)
    }
