"""Per-asset shared networks ("identical independent evaluators", Deep Sets) for actor and critic.

A flat MLP over ``[asset block, weights, mask]`` learns a separate function for every asset slot:
what it learns about slot 3 does not transfer to slot 5, its output depends on which slot an
asset happens to sit in, and it cannot take more assets than it was built for. Here every asset
is scored by the same small network from its own features and weight, plus a context pooled
over all live assets (masked mean and max, which ignore order and count). The consequences,
which the tests hold:

- permuting live assets (features, weights, mask) permutes the actor's asset actions and leaves
  the critics' Q unchanged;
- masked slots influence nothing (their rows are replaced by zeros before any arithmetic, so
  even NaN there is harmless) and get action 0;
- the actor runs on any number of assets (``forward_sets``), not only the ``M`` slots of the
  flat observation it was trained on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import pairwise

import torch as th
from gymnasium import spaces
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
        cls, observation_space: spaces.Space, action_space: spaces.Space, n_features: int
    ) -> ObservationLayout:
        """The layout of an environment's spaces; refuses an ``n_features`` that does not fit.

        ``M`` comes from the action (``M + 1`` slots, cash first); ``n_features`` is passed
        explicitly rather than inferred, so a feature set and a policy built for different
        ``F`` fail here instead of silently reading weights as features.
        """
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


def mlp(sizes: Sequence[int], activation: type[nn.Module], final_activation: bool) -> nn.Sequential:
    """Linear layers through ``sizes``, an activation between them (and after the last if asked)."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(pairwise(sizes)):
        layers.append(nn.Linear(n_in, n_out))
        if final_activation or i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


def small_init(layer: nn.Linear, scale: float = HEAD_INIT) -> nn.Linear:
    """Uniform weights in +-scale and a zero bias: the layer starts close to outputting 0."""
    nn.init.uniform_(layer.weight, -scale, scale)
    nn.init.zeros_(layer.bias)
    return layer


_EXACT_SUMS: ContextVar[bool] = ContextVar("allocator_exact_pooled_sums", default=True)


@contextmanager
def slot_order_sums() -> Iterator[None]:
    """Pooled sums in slot order inside this block, instead of sorted first.

    Sorting makes a permutation of the assets give the same bits, which the exported graph and
    every inference path keep; it also costs a few ms per batch (about a quarter of a TD3 gradient
    step on CPU). Gradient steps do not need the bits (slot order changes a sum by a rounding
    error), so the trainers' ``train`` runs here.
    """
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


def masked_mean_max(h: th.Tensor, live: th.Tensor) -> th.Tensor:
    """``[mean, max]`` of ``h`` (B, N, H) over live rows, (B, 2H); zeros when none is live.

    ``where`` rather than multiplying by the mask: ``0 * NaN`` would let a masked row through.
    The sum runs over the values sorted along the asset axis (``order_free_sum``): float
    addition is not associative, and summing in slot order would make the context (and every
    action) depend on the assets' order by a few ulps; sorted, a permutation gives the same bits.
    """
    m = live.unsqueeze(-1)
    count = m.sum(dim=1).clamp(min=1).to(h.dtype)
    mean = order_free_sum(th.where(m, h, th.zeros_like(h)), dim=1) / count
    top = h.masked_fill(~m, float("-inf")).amax(dim=1)
    top = th.where(live.any(dim=1, keepdim=True), top, th.zeros_like(top))
    return th.cat([mean, top], dim=-1)


def centered(scores: th.Tensor, live: th.Tensor) -> th.Tensor:
    """``scores`` (B, N) less their mean over live assets (summed sorted, as in
    ``masked_mean_max``, so a permutation gives the same bits); masked entries are left as
    they are (the caller zeroes them)."""
    count = live.sum(dim=1, keepdim=True).clamp(min=1).to(scores.dtype)
    total = order_free_sum(th.where(live, scores, th.zeros_like(scores)), dim=1)
    return scores - total.unsqueeze(1) / count


def asset_inputs(features: th.Tensor, per_slot: th.Tensor, live: th.Tensor) -> th.Tensor:
    """Per-asset rows ``[features_i, per_slot_i...]`` (B, N, F + K), masked rows set to zero.

    ``per_slot`` is (B, N + 1, K) with cash first; cash is dropped here (it has no features).
    """
    rows = th.cat([features, per_slot[:, 1:]], dim=-1)
    return th.where(live.unsqueeze(-1), rows, th.zeros_like(rows))


class SharedActorNet(nn.Module):
    """Scores every slot from its own row and a pooled context: ``(B, N + 1, n_outputs)``.

    ``h_i = phi([f_i, w_i])``; ``c = context([mean h, max h, w_cash])``;
    asset score ``rho([h_i, c])``; cash score ``cash_head(c)`` (its bias is the learned cash
    preference). ``n_outputs`` is 1 for TD3 (the pre-tanh score) and 2 for SAC (mean, log std).

    ``center_assets`` subtracts the live assets' mean from their first output (the pre-tanh
    score or mean; never the log std). Adding the same amount to every asset's score changes
    no asset's weight against another, only the book against cash, and the cash head already
    has that say: uncentred, that common shift is free to drift until every asset action sits
    at +1 (an equal-weight book with tanh's gradient gone). Centred, an asset's action says
    how it differs from the others. Training configs turn it on (``shared.center_assets``);
    here it stays off by default, so a policy saved without the flag loads as it was trained.
    """

    def __init__(
        self,
        n_features: int,
        hidden: int = 64,
        n_outputs: int = 1,
        activation_fn: type[nn.Module] = nn.ReLU,
        center_assets: bool = False,
    ) -> None:
        super().__init__()
        self.n_features = n_features
        self.n_outputs = n_outputs
        self.center_assets = center_assets
        self.encoder = mlp([n_features + 1, hidden, hidden], activation_fn, final_activation=True)
        self.context = mlp([2 * hidden + 1, hidden], activation_fn, final_activation=True)
        self.rho = mlp([2 * hidden, hidden, n_outputs], activation_fn, final_activation=False)
        small_init(self.rho[-1])  # type: ignore[arg-type]
        self.cash_head = small_init(nn.Linear(hidden, n_outputs))

    def forward(self, features: th.Tensor, weights: th.Tensor, mask: th.Tensor) -> th.Tensor:
        """Raw scores for cash and every asset slot; masked slots' rows are zero."""
        live = live_assets(mask)
        h = self.encoder(asset_inputs(features, weights.unsqueeze(-1), live))
        c = self.context(th.cat([masked_mean_max(h, live), weights[:, :1]], dim=-1))
        asset = self.rho(th.cat([h, c.unsqueeze(1).expand(-1, h.shape[1], -1)], dim=-1))
        if self.center_assets:
            first = centered(asset[..., 0], live).unsqueeze(-1)
            asset = th.cat([first, asset[..., 1:]], dim=-1)
        scores = th.cat([self.cash_head(c).unsqueeze(1), asset], dim=1)
        return th.where(slot_live(mask).unsqueeze(-1), scores, th.zeros_like(scores))


class SharedQNet(nn.Module):
    """One critic: ``Q = head([mean g, max g, w_cash, a_cash, log(1 + n_live)])`` with
    ``g_i = phi([f_i, w_i, a_i])`` over live assets.

    The live count enters because mean pooling alone cannot tell two assets from twenty, and
    a portfolio's value depends on how many assets share it; the critic only ever sees the
    ``M`` slots it was trained on, so this costs no generality (the actor, which must run on
    other set sizes, gets no count).
    """

    def __init__(
        self, n_features: int, hidden: int = 64, activation_fn: type[nn.Module] = nn.ReLU
    ) -> None:
        super().__init__()
        self.encoder = mlp([n_features + 2, hidden, hidden], activation_fn, final_activation=True)
        self.head = mlp([2 * hidden + 3, hidden, 1], activation_fn, final_activation=False)

    def forward(
        self, features: th.Tensor, weights: th.Tensor, mask: th.Tensor, actions: th.Tensor
    ) -> th.Tensor:
        """Q (B, 1) of the actions (B, N + 1) in the state; masked slots' actions are ignored."""
        live = live_assets(mask)
        per_slot = th.stack([weights, actions], dim=-1)
        g = self.encoder(asset_inputs(features, per_slot, live))
        count = th.log1p(live.sum(dim=1, keepdim=True).to(g.dtype))
        head_in = [masked_mean_max(g, live), weights[:, :1], actions[:, :1], count]
        return self.head(th.cat(head_in, dim=-1))
