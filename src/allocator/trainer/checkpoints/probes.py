"""Proof, on seeded probes, that an upgraded or widened checkpoint acts exactly as its backup
did: bit-identical ``predict`` actions, or for a widened model bit-identical canonical outputs:
float64 forward passes in which summation order cannot matter, so a widened model's inserted
zero terms add nothing (float32 BLAS groups a longer row's terms differently, by an ulp or two)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from numpy.typing import NDArray
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.torch_layers import FlattenExtractor
from torch import nn

from allocator.portfolio import FeatureSpec, assemble_observation
from allocator.trainer.agents.algorithms import ALGORITHMS
from allocator.trainer.agents.icm import CuriosityNet
from allocator.trainer.checkpoints.errors import CheckpointUpgradeError
from allocator.trainer.checkpoints.widening import observation_embedding
from allocator.trainer.training.run_dir import ICM_FILE, MODEL_FILE

Array = NDArray[np.float64]
Obs = NDArray[np.float32]
"""Probe observations, float32 as SB3 feeds them."""
PROBE_COUNT = 64
PROBE_SEED = 0
MAX_PROBE_MASKS = 256
"""Masks over the old slots checked when widening: all 2^m of them up to this many."""
FLOAT32_ATOL = 1e-5
"""Bound on the float32 ``predict`` difference after widening (a few ulps of BLAS reordering);
the identity itself is checked exactly in ``canonical_forward``."""
EVALUATOR_ATOL = 1e-4
"""The canonical evaluator must agree this closely with the float32 model it re-computes."""


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


def load_model(algorithm: str, path: Path) -> BaseAlgorithm:
    """A saved SmoothTD3/SmoothSAC on the CPU."""
    if algorithm not in ALGORITHMS:
        raise CheckpointUpgradeError(
            f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})"
        )
    return ALGORITHMS[algorithm].load(path, device="cpu")


@dataclass(frozen=True)
class ProbeParts:
    """A probe set before assembly: the same parts embed into any wider layout."""

    features: NDArray[np.float32]  # (n, max_assets, window)
    weights: NDArray[np.float32]  # (n, max_assets + 1)
    mask: NDArray[np.float32]  # (n, max_assets + 1)

    def observations(self, spec: FeatureSpec) -> NDArray[np.float32]:
        """The probes in ``spec``'s layout; slots beyond the parts' own are empty and masked."""
        extra = spec.max_assets - self.features.shape[1]
        feats = np.pad(self.features, ((0, 0), (0, extra), (0, 0)))
        weights, mask = (np.pad(x, ((0, 0), (0, extra))) for x in (self.weights, self.mask))
        return assemble_observation(feats, weights, mask, spec)


def probe_masks(max_assets: int, seed: int = PROBE_SEED) -> NDArray[np.float32]:
    """Every subset of live asset slots (cash always live), or a seeded sample of them."""
    if 2**max_assets <= MAX_PROBE_MASKS:
        live = np.array(list(itertools.product([0.0, 1.0], repeat=max_assets)), np.float32)
    else:
        rng = np.random.default_rng(seed)
        live = (rng.random((MAX_PROBE_MASKS, max_assets)) < 0.5).astype(np.float32)
        live[0], live[1] = 0.0, 1.0  # all masked and all live, always
    return np.concatenate([np.ones((len(live), 1), np.float32), live], axis=1)


def probe_parts(
    spec: FeatureSpec, masks: NDArray[np.float32], per_mask: int, seed: int = PROBE_SEED
) -> ProbeParts:
    """``per_mask`` seeded observations for each mask (features normal, weights Dirichlet)."""
    rng = np.random.default_rng(seed)
    mask = np.repeat(masks, per_mask, axis=0)
    n = len(mask)
    features = np.clip(rng.normal(size=(n, spec.max_assets, spec.window)), -spec.clip, spec.clip)
    weights = rng.dirichlet(np.ones(spec.n_slots), size=n) * mask
    weights /= weights.sum(axis=1, keepdims=True)
    return ProbeParts(features.astype(np.float32), weights.astype(np.float32), mask)


@dataclass(frozen=True)
class ProbeReport:
    """What the post-migration check compared and found (the canonical figures: widening only)."""

    observations: int
    masks: int
    float32_max_diff: float
    canonical_max_diff: float | None = None
    critic_canonical_max_diff: float | None = None
    icm_canonical_max_diff: float | None = None
    new_slot_max_action: float | None = None


def max_abs(a: NDArray[Any], b: NDArray[Any]) -> float:
    """The largest absolute difference of two arrays, in float64 (0 when empty)."""
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(np.max(diff)) if diff.size else 0.0


def check_same_actions(algorithm: str, before: Path, after: Path, spec: FeatureSpec) -> ProbeReport:
    """Same-shape migration: the probe actions must be bit-identical (random masks)."""
    live = np.random.default_rng(PROBE_SEED + 1).random((PROBE_COUNT, spec.max_assets)) < 0.5
    cash_and_live = np.concatenate([np.ones((PROBE_COUNT, 1)), live], axis=1)
    parts = probe_parts(spec, cash_and_live.astype(np.float32), 1)
    obs = parts.observations(spec)
    old, new = load_model(algorithm, before / MODEL_FILE), load_model(algorithm, after / MODEL_FILE)
    diff = max_abs(old.predict(obs, deterministic=True)[0], new.predict(obs, deterministic=True)[0])
    if diff != 0.0:
        raise CheckpointUpgradeError(
            f"probe actions differ after migration (max |diff| {diff:.3g})"
        )
    masks = len(np.unique(parts.mask, axis=0))
    return ProbeReport(observations=len(obs), masks=masks, float32_max_diff=diff)


def icm_net(path: Path) -> CuriosityNet:
    """The curiosity network saved in ``icm.pt``, its sizes read from the saved tensors."""
    state = th.load(path, map_location="cpu", weights_only=True)
    obs_dim, act_dim = state["dims"]
    net_state = state["net"]
    net = CuriosityNet(
        obs_dim,
        act_dim,
        feature_dim=int(net_state["encoder.2.weight"].shape[0]),
        hidden_dim=int(net_state["encoder.0.weight"].shape[0]),
    )
    net.load_state_dict(net_state)
    return net


def _check_icm(
    before: Path, after: Path, obs: tuple[Obs, Obs], acts: tuple[Array, Array], n_act: int
) -> float:
    """Exact ICM encoder, inverse-model (old slots) and forward-model outputs, old vs widened."""
    outputs = []
    for net, x, act in zip((icm_net(before), icm_net(after)), obs, acts, strict=True):
        phi = canonical_forward(net.encoder, x)
        inverse = canonical_forward(net.inverse_model, np.concatenate([phi, phi[::-1]], axis=1))
        forward = canonical_forward(net.forward_model, np.concatenate([phi, act], axis=1))
        outputs.append((phi, inverse[:, :n_act], forward))  # the old slots' inverse outputs
    return max(max_abs(a, b) for a, b in zip(*outputs, strict=True))


def _widened_probes(spec: FeatureSpec, max_assets: int) -> tuple[Obs, Obs, int]:
    """The probe observations in the old and the widened layout, and their number of masks."""
    new_spec = FeatureSpec(max_assets, spec.window, spec.clip)
    masks = probe_masks(spec.max_assets)
    parts = probe_parts(spec, masks, max(1, math.ceil(PROBE_COUNT / len(masks))))
    obs_old, obs_new = parts.observations(spec), parts.observations(new_spec)
    emb = observation_embedding(spec, max_assets)
    rest = np.setdiff1d(np.arange(emb.size), emb.index)
    if not (np.array_equal(obs_new[:, emb.index], obs_old) and not obs_new[:, rest].any()):
        raise CheckpointUpgradeError(
            "observation_embedding disagrees with assemble_observation's layout"
        )
    return obs_old, obs_new, len(masks)


def _canonical_pairs(
    old: dict[str, list[nn.Module]],
    new: dict[str, list[nn.Module]],
    x_old: NDArray[np.floating[Any]],
    x_new: NDArray[np.floating[Any]],
) -> dict[str, tuple[Array, Array]]:
    """Each network's canonical outputs, old on ``x_old`` and widened on ``x_new``."""
    return {
        name: (canonical_forward(layers, x_old), canonical_forward(new[name], x_new))
        for name, layers in old.items()
    }


def check_widened(
    algorithm: str, before: Path, after: Path, spec: FeatureSpec, max_assets: int
) -> ProbeReport:
    """Widened vs original on every mask over the old slots: actions, Q values, targets and ICM
    bit-identical in ``canonical_forward``, float32 within ``FLOAT32_ATOL``."""
    obs_old, obs_new, masks = _widened_probes(spec, max_assets)
    old, new = load_model(algorithm, before / MODEL_FILE), load_model(algorithm, after / MODEL_FILE)
    n_act = spec.n_slots
    # The old slots' actions (actor and TD3's target actor), and the new slots' (0 by design).
    actors = _canonical_pairs(actor_layers(old), actor_layers(new), obs_old, obs_new)
    canonical = max(max_abs(a, b[:, :n_act]) for a, b in actors.values())
    new_slots = max(float(np.max(np.abs(b[:, n_act:]))) for _, b in actors.values())
    f32_old = old.predict(obs_old, deterministic=True)[0]
    f32_new = new.predict(obs_new, deterministic=True)[0]
    float32 = max_abs(f32_old, f32_new[:, :n_act])
    consistency = max_abs(actors["actor"][0], f32_old)

    n = len(obs_old)  # seeded critic-input actions, the new slots' appended
    rng = np.random.default_rng(PROBE_SEED + 2)
    act_old = rng.uniform(-1, 1, (n, n_act))
    new_slot_acts = rng.uniform(-1, 1, (n, max_assets - spec.max_assets))
    acts = act_old, np.concatenate([act_old, new_slot_acts], axis=1)
    x_old, x_new = np.concatenate([obs_old, acts[0]], 1), np.concatenate([obs_new, acts[1]], 1)
    critics = _canonical_pairs(critic_layers(old), critic_layers(new), x_old, x_new)
    critic = max(max_abs(a, b) for a, b in critics.values())  # critics and their targets
    icm = None
    if (before / ICM_FILE).is_file():
        icm = _check_icm(before / ICM_FILE, after / ICM_FILE, (obs_old, obs_new), acts, n_act)
    problems = []
    if canonical != 0.0 or critic != 0.0 or (icm is not None and icm != 0.0):
        problems.append(
            f"canonical float64 outputs differ (actor {canonical:.3g}, critic {critic:.3g}, "
            f"icm {icm})"
        )
    if consistency > EVALUATOR_ATOL:
        problems.append(f"canonical evaluator is {consistency:.3g} from the float32 model")
    if float32 > FLOAT32_ATOL:
        problems.append(f"float32 actions differ by {float32:.3g} > {FLOAT32_ATOL:g}")
    if problems:
        raise CheckpointUpgradeError(
            "widened model does not act like the original: " + "; ".join(problems)
        )
    return ProbeReport(
        observations=n,
        masks=masks,
        float32_max_diff=float32,
        canonical_max_diff=canonical,
        critic_canonical_max_diff=critic,
        icm_canonical_max_diff=icm,
        new_slot_max_action=new_slots,
    )
