"""Per-asset shared networks (Deep Sets): one small network scores every asset from its own row
and a context pooled over the live assets, so permuting assets permutes the actions, masked slots
(even NaN) influence nothing, and the actor runs on any number of assets."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.torch_layers import create_mlp
from torch import nn

LIVE_THRESHOLD = 0.5
"""A mask entry above this marks its slot live (masks are stored as 0.0 / 1.0 floats)."""

HEAD_INIT = 3e-3
"""Output layers start uniform in +-HEAD_INIT, so a fresh actor's scores are ~0: under the tilt
mapping it starts at the anchor portfolio instead of at a random tilt."""


@dataclass(frozen=True)
class ObservationLayout:
    """Where the parts of the flat observation ``[M*F asset block, M+1 weights, M+1 mask]`` lie."""

    n_assets: int
    n_features: int

    @classmethod
    def from_spaces(
        cls, observation_space: spaces.Space[Any], action_space: spaces.Space[Any], n_features: int
    ) -> ObservationLayout:
        """The layout of an environment's spaces; ``n_features`` is explicit so a mismatched
        ``F`` raises instead of reading weights as features."""
        obs_shape = observation_space.shape
        act_shape = action_space.shape
        if obs_shape is None or len(obs_shape) != 1 or act_shape is None or len(act_shape) != 1:
            raise ValueError(
                f"shared policy needs flat Box spaces, got {obs_shape} and {act_shape}"
            )
        n_assets = int(act_shape[0]) - 1
        if n_assets < 1 or n_features < 1:
            raise ValueError(f"need >= 1 asset slot and feature, got {n_assets}, {n_features}")
        layout = cls(n_assets, n_features)
        if layout.obs_dim != int(obs_shape[0]):
            raise ValueError(
                f"observation of {obs_shape[0]} values does not fit {n_assets} asset slots of "
                f"{n_features} features (expected {layout.obs_dim} = {n_assets}*{n_features} "
                f"+ 2*{n_assets + 1}); is policy_kwargs n_features right?"
            )
        return layout

    @property
    def obs_dim(self) -> int:
        return self.n_assets * self.n_features + 2 * (self.n_assets + 1)

    def split(self, obs: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """``(features (B, M, F), weights (B, M+1), mask (B, M+1))`` views of a (B, D) batch."""
        block = self.n_assets * self.n_features
        slots = self.n_assets + 1
        features = obs[:, :block].reshape(-1, self.n_assets, self.n_features)
        return features, obs[:, block : block + slots], obs[:, block + slots : block + 2 * slots]


def small_init(layer: nn.Linear, scale: float = HEAD_INIT) -> nn.Linear:
    """Uniform weights in +-scale and a zero bias: the layer starts close to outputting 0."""
    nn.init.uniform_(layer.weight, -scale, scale)
    nn.init.zeros_(layer.bias)
    return layer


_EXACT_SUMS: ContextVar[bool] = ContextVar("allocator_exact_pooled_sums", default=True)


@contextmanager
def slot_order_sums() -> Iterator[None]:
    """Slot-order sums and live-rows-only passes for ``train``: gradient steps need no
    permutation-exact bits, which sorted sums (the default, as in the exported graph) give."""
    token = _EXACT_SUMS.set(False)
    try:
        yield
    finally:
        _EXACT_SUMS.reset(token)


def order_free_sum(x: th.Tensor, dim: int) -> th.Tensor:
    """Sum over ``dim``, sorted first (same bits for any order) unless in ``slot_order_sums``."""
    if _EXACT_SUMS.get():
        x = th.sort(x, dim=dim).values
    return x.sum(dim=dim)


def live_assets(mask: th.Tensor) -> th.Tensor:
    """Which asset slots (1..N, cash excluded) are live: bool (B, N)."""
    return mask[:, 1:] > LIVE_THRESHOLD


def slot_live(mask: th.Tensor) -> th.Tensor:
    """Live slots including cash, which is always live: bool (B, N + 1)."""
    cash = th.ones_like(mask[:, :1], dtype=th.bool)
    return th.cat([cash, live_assets(mask)], dim=1)


def masked_mean_max(h: th.Tensor, live: th.Tensor, nonneg: bool = False) -> th.Tensor:
    """``[mean, max]`` (..., B, 2H) of ``h`` (..., B, N, H) over live rows, zeros when none is;
    ``where``, since ``0 * NaN`` would let a masked row through; ``nonneg``: no masked max."""
    m = live.unsqueeze(-1)
    count = m.sum(dim=-2).clamp(min=1).to(h.dtype)
    zeroed = th.where(m, h, 0.0)
    mean = order_free_sum(zeroed, dim=-2) / count
    if nonneg:
        return th.cat([mean, zeroed.amax(dim=-2)], dim=-1)
    top = th.where(m, h, float("-inf")).amax(dim=-2)
    top = th.where(live.any(dim=-1, keepdim=True), top, 0.0)
    return th.cat([mean, top], dim=-1)


def zeroed_mean_max(dense: th.Tensor, live: th.Tensor) -> th.Tensor:
    """``masked_mean_max`` of a non-negative ``dense`` (..., B, N, H) already zero on masked
    rows (``LiveRows.scatter``), in slot order: no masking pass is left to do."""
    count = live.sum(dim=-1, keepdim=True).clamp(min=1).to(dense.dtype)
    return th.cat([dense.sum(dim=-2) / count, dense.amax(dim=-2)], dim=-1)


class LiveRows:
    """The live asset rows of a (B, N) batch of sets: per-asset layers skip the masked half."""

    def __init__(self, live: th.Tensor) -> None:
        self.shape = (int(live.shape[0]), int(live.shape[1]))
        self.index = live.reshape(-1).nonzero().squeeze(1)
        self.batch = th.div(self.index, self.shape[1], rounding_mode="floor")

    def gather(self, x: th.Tensor) -> th.Tensor:
        """Rows (L, K) of ``x`` (B, N, K) at the live slots."""
        return x.reshape(-1, x.shape[-1]).index_select(0, self.index)

    def scatter(self, rows: th.Tensor) -> th.Tensor:
        """``rows`` (..., L, K) back in place, (..., B, N, K), zero on the masked slots."""
        dense = rows.new_zeros(*rows.shape[:-2], self.shape[0] * self.shape[1], rows.shape[-1])
        return dense.index_copy(-2, self.index, rows).unflatten(-2, self.shape)


def live_rows_only(x: th.Tensor, activation: type[nn.Module]) -> bool:
    """Whether per-asset layers may run on the live rows alone: while training, for ReLU (zero
    rows leave the max unchanged), on CPU (finding the rows costs a GPU a host sync)."""
    return not _EXACT_SUMS.get() and issubclass(activation, nn.ReLU) and x.device.type == "cpu"


def centered(scores: th.Tensor, live: th.Tensor) -> th.Tensor:
    """``scores`` (B, N) less their mean over live assets; masked entries are the caller's."""
    count = live.sum(dim=1, keepdim=True).clamp(min=1).to(scores.dtype)
    total = order_free_sum(th.where(live, scores, 0.0), dim=1)
    return scores - total.unsqueeze(1) / count


def asset_inputs(features: th.Tensor, per_slot: th.Tensor, live: th.Tensor) -> th.Tensor:
    """Rows ``[features_i, per_slot_i...]`` (B, N, F + K), masked rows zero; ``per_slot`` is
    (B, N + 1, K) with cash first, which is dropped."""
    rows = th.cat([features, per_slot[:, 1:]], dim=-1)
    return th.where(live.unsqueeze(-1), rows, 0.0)


class SharedActorNet(nn.Module):
    """Scores ``(B, N + 1, n_outputs)``: asset ``rho([h_i, c])`` with ``h_i = phi([f_i, w_i])``,
    ``c = context([mean h, max h, w_cash])``; cash ``cash_head(c)``. ``center_assets`` removes
    the live assets' mean score, a common shift that could drift every action to +1 (off by
    default: a policy saved without the flag loads as it was trained)."""

    def __init__(
        self,
        n_features: int,
        hidden: int = 64,
        n_outputs: int = 1,
        activation_fn: type[nn.Module] = nn.ReLU,
        center_assets: bool = False,
    ) -> None:
        super().__init__()
        self.center_assets = center_assets
        # SB3's create_mlp: Linear and activation per hidden size, then (output_dim > 0) a Linear.
        self.encoder = nn.Sequential(*create_mlp(n_features + 1, -1, [hidden] * 2, activation_fn))
        self.context = nn.Sequential(*create_mlp(2 * hidden + 1, -1, [hidden], activation_fn))
        self.rho = nn.Sequential(*create_mlp(2 * hidden, n_outputs, [hidden], activation_fn))
        small_init(self.rho[-1])  # type: ignore[arg-type]
        self.cash_head = small_init(nn.Linear(hidden, n_outputs))
        self.activation_fn = activation_fn

    def forward(self, features: th.Tensor, weights: th.Tensor, mask: th.Tensor) -> th.Tensor:
        """Raw scores for cash and every asset slot; masked slots' rows are zero."""
        live = live_assets(mask)
        if live_rows_only(features, self.activation_fn):
            asset, c = self._live_assets(features, weights, live)
        else:
            nonneg = issubclass(self.activation_fn, nn.ReLU)
            h = self.encoder(asset_inputs(features, weights.unsqueeze(-1), live))
            c = self.context(th.cat([masked_mean_max(h, live, nonneg), weights[:, :1]], dim=-1))
            asset = self.rho(th.cat([h, c.unsqueeze(1).expand(-1, h.shape[1], -1)], dim=-1))
        if self.center_assets:
            first = centered(asset[..., 0], live).unsqueeze(-1)
            asset = th.cat([first, asset[..., 1:]], dim=-1)
        scores = th.cat([self.cash_head(c).unsqueeze(1), asset], dim=1)
        return th.where(slot_live(mask).unsqueeze(-1), scores, 0.0)

    def _live_assets(
        self, features: th.Tensor, weights: th.Tensor, live: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor]:
        """Asset scores (zero on masked slots) and the context from the live rows only; ``rho``'s
        first layer runs as ``W_h h_i + (W_c c + b)``, the context half once per portfolio."""
        rows = LiveRows(live)
        h = self.encoder(rows.gather(th.cat([features, weights[:, 1:].unsqueeze(-1)], dim=-1)))
        c = self.context(th.cat([zeroed_mean_max(rows.scatter(h), live), weights[:, :1]], dim=-1))
        first = self.rho[0]
        assert isinstance(first, nn.Linear)
        width = h.shape[-1]
        per_portfolio = F.linear(c, first.weight[:, width:], first.bias)
        z = F.linear(h, first.weight[:, :width]) + per_portfolio.index_select(0, rows.batch)
        for layer in list(self.rho)[1:]:
            z = layer(z)
        return rows.scatter(z), c


class SharedQNet(nn.Module):
    """One critic: ``Q = head([mean g, max g, w_cash, a_cash, log(1 + n_live)])`` with
    ``g_i = phi([f_i, w_i, a_i])`` over live assets; the count because mean pooling cannot tell
    two assets from twenty (the critic never leaves its ``M`` slots, unlike the actor)."""

    def __init__(
        self, n_features: int, hidden: int = 64, activation_fn: type[nn.Module] = nn.ReLU
    ) -> None:
        super().__init__()
        self.encoder = nn.Sequential(*create_mlp(n_features + 2, -1, [hidden] * 2, activation_fn))
        self.head = nn.Sequential(*create_mlp(2 * hidden + 3, 1, [hidden], activation_fn))
        self.activation_fn = activation_fn

    def forward(
        self, features: th.Tensor, weights: th.Tensor, mask: th.Tensor, actions: th.Tensor
    ) -> th.Tensor:
        """Q (B, 1) of the actions (B, N + 1) in the state; masked slots' actions are ignored."""
        return stacked_q([self], features, weights, mask, actions)[0]


def stacked_mlp(layers: Sequence[nn.Sequential], x: th.Tensor, shared: bool) -> th.Tensor:
    """C same-shaped MLPs in one pass: (C, ..., out) from ``x`` (..., K) shared, or (C, ..., K)."""
    n = len(layers)
    lead = x.shape[:-1] if shared else x.shape[1:-1]
    out = x.reshape(-1, x.shape[-1]) if shared else x.reshape(n, -1, x.shape[-1])
    for modules in zip(*layers, strict=True):
        first = modules[0]
        if not isinstance(first, nn.Linear):
            out = first(out)  # the activation: one type for every member
            continue
        linears: list[nn.Linear] = list(modules)
        if shared:
            weight = th.cat([m.weight for m in linears])
            bias = th.cat([m.bias for m in linears])
            out = F.linear(out, weight, bias).unflatten(-1, (n, -1)).transpose(0, 1)
            shared = False
        else:
            weight = th.stack([m.weight for m in linears]).transpose(1, 2)
            bias = th.stack([m.bias for m in linears]).unsqueeze(1)
            out = th.baddbmm(bias, out, weight)
    return out.reshape(n, *lead, out.shape[-1])


def stacked_q(
    nets: Sequence[SharedQNet],
    features: th.Tensor,
    weights: th.Tensor,
    mask: th.Tensor,
    actions: th.Tensor,
) -> th.Tensor:
    """Q (C, B, 1) of every critic in ``nets`` (same sizes, own weights) in one batched pass:
    on small CPU networks every operator call has a fixed cost."""
    activation = nets[0].activation_fn
    live = live_assets(mask)
    per_slot = th.stack([weights, actions], dim=-1)
    if live_rows_only(features, activation):
        rows = LiveRows(live)
        inputs = rows.gather(th.cat([features, per_slot[:, 1:]], dim=-1))
        g = rows.scatter(stacked_mlp([q.encoder for q in nets], inputs, shared=True))
        pooled = zeroed_mean_max(g, live)
    else:
        inputs = asset_inputs(features, per_slot, live)
        g = stacked_mlp([q.encoder for q in nets], inputs, shared=True)
        pooled = masked_mean_max(g, live, issubclass(activation, nn.ReLU))
    count = th.log1p(live.sum(dim=1, keepdim=True).to(pooled.dtype))
    extra = th.cat([weights[:, :1], actions[:, :1], count], dim=-1)
    head_in = th.cat([pooled, extra.expand(len(nets), -1, -1)], dim=-1)
    return stacked_mlp([q.head for q in nets], head_in, shared=False)
