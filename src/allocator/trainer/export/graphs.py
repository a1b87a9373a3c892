"""The graphs ``allocator export`` writes, as torch modules, and their export to ONNX.

A policy graph holds k >= 1 members (one run, or a seed ensemble): each member normalizes the
one raw input with the statistics its own run fitted and runs its deterministic actor, and the
graph outputs the mean of their actions, so an ensemble has a single model's inputs and outputs.
The representation decides the rest:

* ``PolicyGraph`` (``model.onnx``) of a flat MLP: the *raw* observation
  (``portfolio.build_raw_observation``) and the mask -> the action and the portfolio weights
  (``portfolio.action_to_weights`` of the mean action, in torch ops); of a shared per-asset
  policy: the raw per-asset features of any number of assets N (``portfolio.asset_features``),
  the weights and the mask -> the action, with a dynamic asset axis. The tilt mapping needs the
  anchor, which the server computes from the request's own prices with
  ``portfolio.anchor_weights`` (as the environment does), so it stays out of the graph.
* ``CuriosityGraph`` (``icm.onnx``, runs trained with curiosity): the intrinsic reward of a
  transition.

Normalization and the affine mapping are part of the graph, so a server never re-implements
either and cannot apply stale statistics. Why the mean of actions: the action is the one output
both representations share, and the mapping stays the one the manifest names; for the tilt
``w ~ anchor * exp(k a)`` the mean action is the geometric mean of the members' tilts, so one
member's extreme bet is damped, and masked slots stay 0.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from allocator.portfolio import FeatureNormalization, FeatureSpec, NormalizationStats
from allocator.trainer.agents.icm import CuriosityNet
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.loaded_run import LoadedRun

__all__ = [
    "ONNX_OPSET",
    "ActionToWeights",
    "CuriosityGraph",
    "FeatureNormalizer",
    "Member",
    "ObservationNormalizer",
    "PolicyGraph",
    "export_graph",
    "graph_opset",
    "live_slots",
    "policy_axes",
]

ONNX_OPSET = 18


def live_slots(mask: torch.Tensor) -> torch.Tensor:
    """Boolean live slots (B, N + 1) of a mask of any width: non-zero entries, cash always live
    (``portfolio.live_mask``)."""
    cash = torch.ones_like(mask[:, :1], dtype=torch.bool)
    return torch.cat([cash, mask[:, 1:] != 0], dim=1)


class ActionToWeights(nn.Module):
    """``portfolio.action_to_weights`` in torch ops (float64 inside, as numpy; float32 out).

    Preference ``min((a + 1) / 2, 1)``, NaN and negatives as zero, masked slots zero (cash
    always live), renormalized; a row with no positive live preference goes all to cash.
    """

    cash_only: torch.Tensor

    def __init__(self, n_slots: int) -> None:
        super().__init__()
        cash = torch.zeros(n_slots, dtype=torch.float64)
        cash[0] = 1.0
        self.register_buffer("cash_only", cash, persistent=False)

    def forward(self, action: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        live = live_slots(mask)
        a = action.to(torch.float64)
        a = torch.where(torch.isnan(a), -1.0, a)  # NaN: no preference (clamp would keep NaN)
        preference = torch.clamp((a + 1.0) * 0.5, 0.0, 1.0)
        v = preference * live.to(torch.float64)
        total = v.sum(dim=-1, keepdim=True)
        wanted = total > 0.0
        weights = torch.where(wanted, v / torch.where(wanted, total, 1.0), self.cash_only)
        return weights.to(torch.float32)


class FeatureNormalizer(nn.Module):
    """``portfolio.normalize_features`` in torch ops: ``(raw - mean) / std``, clipped, masked
    rows zeroed; one mean and standard deviation (the return window's ``NormalizationStats``)
    or one per feature (``FeatureNormalization``).

    The standardization runs in float64, as numpy does, so the result matches numpy bit for bit;
    ``where`` (not a product with the mask) zeroes masked rows even when they hold NaN.
    """

    mean: torch.Tensor
    std: torch.Tensor
    clip: torch.Tensor

    def __init__(self, stats: NormalizationStats | FeatureNormalization, clip: float) -> None:
        super().__init__()
        # float64 tensors, not Python floats: the exporter would store scalars as float32.
        self.register_buffer("mean", torch.tensor(stats.mean, dtype=torch.float64), False)
        self.register_buffer("std", torch.tensor(stats.std, dtype=torch.float64), False)
        self.register_buffer("clip", torch.tensor(float(clip), dtype=torch.float64), False)

    def forward(self, raw: torch.Tensor, live_assets: torch.Tensor) -> torch.Tensor:
        """``raw`` (B, N, F) and ``live_assets`` (B, N) bool -> float32 (B, N, F)."""
        z = (raw.to(torch.float64) - self.mean) / self.std
        z = torch.clamp(z, -self.clip, self.clip).to(torch.float32)  # tensor bounds: float64
        return torch.where(live_assets.unsqueeze(-1), z, 0.0)


class ObservationNormalizer(nn.Module):
    """A raw flat observation ``[M*F raw features, weights, mask]`` -> the normalized
    observation the training environment produced: ``portfolio.normalize_observation`` for the
    return window, ``portfolio.build_asset_observation`` for per-asset features.

    The ``mask`` input decides which slots are live (non-zero, cash forced live, as
    ``portfolio.live_mask``); it replaces the observation's mask block, so the actor never sees
    a mask other than the one its weights are mapped under.
    """

    def __init__(
        self, layout: FeatureSpec, stats: NormalizationStats | FeatureNormalization
    ) -> None:
        super().__init__()
        if isinstance(stats, FeatureNormalization) and layout.window != stats.n_features:
            raise ValueError(f"layout has {layout.window} features per slot, the norm {stats}")
        self.layout = layout
        self.normalizer = FeatureNormalizer(stats, layout.clip)

    def forward(self, raw: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m, f, slots = self.layout.max_assets, self.layout.window, self.layout.n_slots
        live = live_slots(mask)
        block = raw[:, : m * f].reshape(-1, m, f)
        z = self.normalizer(block, live[:, 1:]).reshape(-1, m * f)
        weights = raw[:, m * f : m * f + slots]
        return torch.cat([z, weights, live.to(torch.float32)], dim=-1)


class Member(nn.Module):
    """One run of a policy graph: the graph's raw inputs, normalized with the run's own
    statistics, -> the run's deterministic action.

    Flat: (observation, mask) -> the actor on the normalized observation. SB3's docs export SAC
    as ``actor(obs, deterministic=True)``, which builds a ``torch.distributions.Normal`` whose
    argument validation branches on data, and ``torch.export`` refuses that; the squashed
    Gaussian's mode ``tanh(mean)`` is computed here directly (parity checks it against SB3).

    Shared: (asset_features, weights, mask) -> ``forward_sets`` (TD3's ``tanh(score)``, SAC's
    ``tanh(mean)``, masked slots 0). The actor sees the graph's own liveness (0/1, cash live),
    the slots the features were masked with, whatever non-zero values the caller used.
    """

    def __init__(self, loaded: LoadedRun) -> None:
        super().__init__()
        self.actor = loaded.model.actor
        self.shared, self.squashed_gaussian = loaded.shared, loaded.squashed_gaussian
        self.normalizer = (
            FeatureNormalizer(loaded.observation_norm, loaded.asset_spec.clip)
            if loaded.shared
            else ObservationNormalizer(loaded.spec, loaded.stats)
        )

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.shared:
            features, weights, mask = inputs
            live = live_slots(mask)
            live_assets, live_f = live[:, 1:], live.to(torch.float32)
            z = self.normalizer(features, live_assets)
            return self.actor.forward_sets(z, weights, live_f)  # type: ignore[operator]
        obs = self.normalizer(*inputs)
        if self.squashed_gaussian:
            mean, _, _ = self.actor.get_action_dist_params(obs)  # type: ignore[operator]
            return torch.tanh(mean)
        return self.actor(obs)


class PolicyGraph(nn.Module):
    """The raw inputs of k >= 1 members' representation -> their mean action, and a flat
    graph's weights (``ActionToWeights``); the inputs are positional, as ``Member`` takes them.
    """

    def __init__(self, members: Sequence[LoadedRun]) -> None:
        super().__init__()
        if not members:
            raise ValueError("a policy graph needs >= 1 members")
        self.members = nn.ModuleList(Member(m) for m in members)
        n_slots = members[0].spec.n_slots
        self.to_weights = None if members[0].shared else ActionToWeights(n_slots)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        actions = [member(*inputs) for member in self.members]
        action = actions[0] if len(actions) == 1 else torch.stack(actions, dim=0).mean(dim=0)
        return action if self.to_weights is None else (action, self.to_weights(action, inputs[-1]))


class CuriosityGraph(nn.Module):
    """Raw transition and mask -> normalized, clipped intrinsic reward: ``icm.onnx``.

    One mask serves both observations: an episode's assets do not change between steps.
    """

    def __init__(self, loaded: LoadedRun) -> None:
        super().__init__()
        assert loaded.icm is not None
        self.normalizer = ObservationNormalizer(loaded.spec, loaded.observation_norm)
        self.net: CuriosityNet = loaded.icm.net

    def forward(
        self,
        previous_observation: torch.Tensor,
        action: torch.Tensor,
        observation: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        previous = self.normalizer(previous_observation, mask)
        current = self.normalizer(observation, mask)
        return self.net(previous, action, current)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's progress lines and warnings (CLI output stays readable)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def policy_axes(shared: bool) -> tuple[tuple[dict[int, Any], ...]]:
    """Dynamic shapes of a ``PolicyGraph``'s inputs, nested in one tuple as ``forward(*inputs)``
    takes them: the batch axis, and for a shared graph the asset axis N of the features
    (B, N, F), whose other inputs are per slot (B, N + 1) (cash first)."""
    batch = torch.export.Dim("batch", min=1)
    if not shared:
        return (({0: batch}, {0: batch}),)
    assets = torch.export.Dim("assets", min=1)
    return (({0: batch, 1: assets}, {0: batch, 1: assets + 1}, {0: batch, 1: assets + 1}),)


def export_graph(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: tuple[str, ...],
    output_names: tuple[str, ...],
    path: Path,
    metadata: dict[str, str] | None = None,
    dynamic_shapes: tuple[Any, ...] | None = None,
) -> Path:
    """Export ``module`` (dynamo exporter) to one self-contained file.

    Every input's axis 0 is a dynamic batch axis unless ``dynamic_shapes`` (positional, as
    ``torch.export`` takes them: one dict per parameter, one tuple of dicts for ``*inputs``)
    says more, e.g. ``policy_axes``.
    ``onnx.checker.check_model(full_check=True)`` must pass; ``metadata`` goes into the
    model's ``metadata_props`` so a server can see what it loaded.
    """
    module = module.eval()
    batch = torch.export.Dim("batch", min=1)
    dynamic = dynamic_shapes or tuple({0: batch} for _ in example)  # positional: names differ
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(
            module,
            example,
            None,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=dynamic,
            opset_version=ONNX_OPSET,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    if program is None:  # pragma: no cover - dynamo=True always returns a program
        raise ExportError("torch.onnx.export returned no program")
    proto = program.model_proto
    if metadata:
        onnx.helper.set_model_props(proto, metadata)
    onnx.save(proto, str(path))
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"{path.name}: ONNX checker failed: {exc}") from exc
    return path


def graph_opset(path: Path) -> int:
    """The default-domain opset a saved ONNX model imports."""
    model = onnx.load(str(path), load_external_data=False)
    return next(int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx"))
