"""The graphs ``allocator export`` writes, and their export to ONNX. A policy graph normalizes
the raw input with each member's own statistics (a server cannot apply stale ones) and outputs
their mean action; a flat graph also maps it to weights (a tilt needs prices: the server's).
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

ONNX_OPSET = 18


def live_slots(mask: torch.Tensor) -> torch.Tensor:
    """Boolean live slots (B, N + 1): non-zero entries, cash always live."""
    cash = torch.ones_like(mask[:, :1], dtype=torch.bool)
    return torch.cat([cash, mask[:, 1:] != 0], dim=1)


class ActionToWeights(nn.Module):
    """``portfolio.action_to_weights`` in torch ops (float64 inside, as numpy; float32 out)."""

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
    """``portfolio.normalize_features`` in torch ops, in float64 as numpy (bit for bit); ``where``
    zeroes masked rows even when they hold NaN."""

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
    """A raw flat observation -> the normalized one the training environment produced; the
    ``mask`` input replaces the observation's mask block, so the actor sees the mask its
    weights are mapped under."""

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
        z = self.normalizer(raw[:, : m * f].reshape(-1, m, f), live[:, 1:]).reshape(-1, m * f)
        return torch.cat([z, raw[:, m * f : m * f + slots], live.to(torch.float32)], dim=-1)


class Member(nn.Module):
    """One run of a policy graph: raw inputs, normalized with the run's statistics -> its
    deterministic action. SAC's mode is ``tanh(mean)`` computed directly: SB3's
    ``deterministic=True`` builds a ``Normal`` whose validation ``torch.export`` refuses."""

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
            z = self.normalizer(features, live[:, 1:])
            return self.actor.forward_sets(z, weights, live.to(torch.float32))  # type: ignore[operator]
        obs = self.normalizer(*inputs)
        if self.squashed_gaussian:
            mean, _, _ = self.actor.get_action_dist_params(obs)  # type: ignore[operator]
            return torch.tanh(mean)
        return self.actor(obs)


class PolicyGraph(nn.Module):
    """The raw inputs of k >= 1 members -> their mean action (and a flat graph's weights)."""

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
    """Raw transition and mask (one: an episode's assets do not change) -> intrinsic reward."""

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
        with warnings.catch_warnings(action="ignore"):
            yield
    finally:
        logger.setLevel(level)


def policy_axes(shared: bool) -> tuple[tuple[dict[int, Any], ...]]:
    """Dynamic shapes of a ``PolicyGraph``'s ``*inputs``: batch, and a shared graph's assets N."""
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
    """Export ``module`` (dynamo) to one self-contained file that passes the full ONNX check;
    axis 0 of every input is dynamic unless ``dynamic_shapes`` says more."""
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
    assert program is not None  # dynamo=True always returns a program
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
