"""The graphs ``allocator export`` writes, as torch modules, and their export to ONNX.

* ``PolicyGraph`` (``model.onnx``) takes the *raw* observation
  (``portfolio.build_raw_observation``) and the mask, and returns the deterministic action and
  the portfolio weights. Normalization (with the manifest's statistics) and the action ->
  weights mapping are part of the graph, so a server never re-implements either and cannot
  apply stale statistics. Both are the numpy contract of ``allocator.portfolio`` in torch ops.
* ``CuriosityGraph`` (``icm.onnx``, runs trained with curiosity) returns the intrinsic reward
  of a transition.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from allocator.portfolio import FeatureSpec, NormalizationStats
from allocator.trainer.agents.icm import CuriosityNet
from allocator.trainer.export.errors import ExportError

__all__ = [
    "ONNX_OPSET",
    "ActionToWeights",
    "CuriosityGraph",
    "DeterministicActor",
    "ObservationNormalizer",
    "PolicyGraph",
    "export_graph",
    "graph_opset",
    "set_axes",
]

ONNX_OPSET = 18


class ObservationNormalizer(nn.Module):
    """``portfolio.normalize_observation`` in torch ops, for raw observations in a graph.

    The ``mask`` input decides which slots are live (non-zero, cash forced live, as
    ``portfolio.live_mask``); it replaces the observation's mask block, so the actor never sees
    a mask other than the one its weights are mapped under. The standardization runs in
    float64, as numpy does, so the normalized features match ``normalize_observation`` bit for
    bit.
    """

    cash_live: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    clip: torch.Tensor

    def __init__(self, spec: FeatureSpec, stats: NormalizationStats) -> None:
        super().__init__()
        self.max_assets = spec.max_assets
        self.window = spec.window
        self.n_slots = spec.n_slots
        self.n_features = spec.max_assets * spec.window
        # float64 tensors, not Python floats: the exporter would store scalars as float32.
        for key, value in (("mean", stats.mean), ("std", stats.std), ("clip", spec.clip)):
            self.register_buffer(key, torch.tensor(float(value), dtype=torch.float64), False)
        cash = torch.zeros(spec.n_slots, dtype=torch.bool)
        cash[0] = True
        self.register_buffer("cash_live", cash, persistent=False)

    def live(self, mask: torch.Tensor) -> torch.Tensor:
        """Boolean live slots: non-zero mask entries, cash always live."""
        return (mask != 0) | self.cash_live

    def forward(self, raw: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        live = self.live(mask)
        n = self.n_features
        z = (raw[:, :n].to(torch.float64) - self.mean) / self.std
        z = torch.clamp(z, -self.clip, self.clip).to(torch.float32)  # tensor bounds: float64
        z = z.reshape(-1, self.max_assets, self.window)
        z = torch.where(live[:, 1:].unsqueeze(-1), z, 0.0).reshape(-1, n)
        weights = raw[:, n : n + self.n_slots]
        return torch.cat([z, weights, live.to(torch.float32)], dim=-1)


class ActionToWeights(nn.Module):
    """``portfolio.action_to_weights`` in torch ops (float64 inside, as numpy; float32 out).

    Preference ``min((a + 1) / 2, 1)``, NaN and negatives as zero, masked slots zero (cash
    always live), renormalized; a row with no positive live preference goes all to cash.
    """

    cash_live: torch.Tensor
    cash_only: torch.Tensor

    def __init__(self, n_slots: int) -> None:
        super().__init__()
        cash = torch.zeros(n_slots, dtype=torch.float64)
        cash[0] = 1.0
        self.register_buffer("cash_only", cash, persistent=False)
        self.register_buffer("cash_live", cash > 0, persistent=False)

    def forward(self, action: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        live = (mask != 0) | self.cash_live
        a = action.to(torch.float64)
        a = torch.where(torch.isnan(a), -1.0, a)  # NaN: no preference (clamp would keep NaN)
        preference = torch.clamp((a + 1.0) * 0.5, 0.0, 1.0)
        v = preference * live.to(torch.float64)
        total = v.sum(dim=-1, keepdim=True)
        wanted = total > 0.0
        weights = torch.where(wanted, v / torch.where(wanted, total, 1.0), self.cash_only)
        return weights.to(torch.float32)


class DeterministicActor(nn.Module):
    """The deterministic action of an SB3 TD3 or SAC actor, in a form ``torch.export`` takes.

    SB3's docs export SAC as ``actor(obs, deterministic=True)``; that builds a
    ``torch.distributions.Normal`` whose argument validation branches on data, which
    ``torch.export`` refuses. The deterministic action is the squashed Gaussian's mode,
    ``tanh(mean)``, computed here directly; parity checks it against the SB3 call.
    """

    def __init__(self, actor: nn.Module, squashed_gaussian: bool) -> None:
        super().__init__()
        self.actor = actor
        self.squashed_gaussian = squashed_gaussian

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.squashed_gaussian:
            mean, _, _ = self.actor.get_action_dist_params(obs)  # type: ignore[operator]
            return torch.tanh(mean)
        return self.actor(obs)


class PolicyGraph(nn.Module):
    """Raw observation and mask -> (action, weights): what ``model.onnx`` computes."""

    def __init__(self, actor: nn.Module, spec: FeatureSpec, stats: NormalizationStats) -> None:
        super().__init__()
        self.normalizer = ObservationNormalizer(spec, stats)
        self.actor = actor
        self.to_weights = ActionToWeights(spec.n_slots)

    def forward(
        self, observation: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        action = self.actor(self.normalizer(observation, mask))
        return action, self.to_weights(action, mask)


class CuriosityGraph(nn.Module):
    """Raw transition and mask -> normalized, clipped intrinsic reward: ``icm.onnx``.

    One mask serves both observations: an episode's assets do not change between steps.
    """

    def __init__(self, net: CuriosityNet, normalizer: nn.Module) -> None:
        """``normalizer`` is the run's observation normalizer: ``ObservationNormalizer`` for the
        return window, ``AssetObservationNormalizer`` for per-asset features."""
        super().__init__()
        self.normalizer = normalizer
        self.net = net

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


def set_axes(n_inputs: int) -> tuple[dict[int, Any], ...]:
    """Dynamic shapes of a set graph: the batch axis, and the asset axis N of the first input
    (B, N, F) whose other inputs are per slot (B, N + 1) (cash first)."""
    batch = torch.export.Dim("batch", min=1)
    assets = torch.export.Dim("assets", min=1)
    return ({0: batch, 1: assets}, *({0: batch, 1: assets + 1} for _ in range(n_inputs - 1)))


def export_graph(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: tuple[str, ...],
    output_names: tuple[str, ...],
    path: Path,
    metadata: dict[str, str] | None = None,
    dynamic_shapes: tuple[dict[int, Any], ...] | None = None,
) -> Path:
    """Export ``module`` (dynamo exporter) to one self-contained file.

    Every input's axis 0 is a dynamic batch axis unless ``dynamic_shapes`` (positional, one
    dict per input, as ``torch.export`` takes them) says more, e.g. ``set_axes``.
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
