"""The graphs of a seed ensemble: k members' networks in one ONNX graph, their actions averaged.

Each member keeps the normalization statistics its own run fitted (on the same span, so
usually equal, but nothing relies on it): the graph normalizes the one raw input once per
member, runs that member's deterministic actor, and averages the k actions. The inputs and
outputs are a single model's:

* ``EnsemblePolicyGraph`` (flat MLP): raw observation and mask -> (mean action, weights), the
  weights being ``portfolio.action_to_weights`` of the mean action, as a single flat graph maps
  its own action.
* ``SharedEnsemblePolicyGraph`` (shared policy): raw asset features (B, N, F), weights and mask
  -> mean action, with the dynamic asset axis; the server tilts the anchor by that action as it
  does for one model.

Why actions and not weights: the action is the one output both representations share, and the
mapping stays the one the manifest names. For the tilt mapping ``w ~ anchor * exp(k a)`` the
mean action is the geometric mean of the members' tilts around the same anchor, renormalized: an
asset every member likes stays liked, one member's extreme bet is damped, and the mean of
actions in [-1, 1] is still a valid action. Masked slots are 0 in every member's action, so in
the mean too, and the mean keeps each member's permutation equivariance.
"""

from __future__ import annotations

import torch
from torch import nn

from allocator.portfolio import FeatureNormalization, FeatureSpec, NormalizationStats
from allocator.trainer.export.graphs import ActionToWeights, ObservationNormalizer
from allocator.trainer.export.shared_graphs import FeatureNormalizer, SetActor, live_slots

__all__ = ["EnsemblePolicyGraph", "SharedEnsemblePolicyGraph", "mean_action"]


def mean_action(actions: list[torch.Tensor]) -> torch.Tensor:
    """The members' actions averaged (one ``ReduceMean`` over a stacked member axis)."""
    return torch.stack(actions, dim=0).mean(dim=0)


class EnsemblePolicyGraph(nn.Module):
    """Raw observation and mask -> (mean action, weights) of k flat members."""

    def __init__(
        self, actors: list[nn.Module], spec: FeatureSpec, stats: list[NormalizationStats]
    ) -> None:
        """``actors[i]`` is member i's deterministic actor (``DeterministicActor``) on
        observations normalized with ``stats[i]``."""
        super().__init__()
        if len(actors) != len(stats) or len(actors) < 2:
            raise ValueError(f"an ensemble needs >= 2 actors, one per statistics: {len(actors)}")
        self.normalizers = nn.ModuleList(ObservationNormalizer(spec, s) for s in stats)
        self.actors = nn.ModuleList(actors)
        self.to_weights = ActionToWeights(spec.n_slots)

    def forward(
        self, observation: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        actions = [
            actor(normalizer(observation, mask))
            for normalizer, actor in zip(self.normalizers, self.actors, strict=True)
        ]
        action = mean_action(actions)
        return action, self.to_weights(action, mask)


class SharedEnsemblePolicyGraph(nn.Module):
    """Raw asset features (B, N, F), weights and mask (B, N + 1) -> mean action (B, N + 1)."""

    def __init__(
        self, actors: list[nn.Module], norms: list[FeatureNormalization], clip: float
    ) -> None:
        """``actors[i]`` is member i's shared SB3 actor (``forward_sets``) on features
        normalized with ``norms[i]``; ``clip`` is the feature set's, the same for every member."""
        super().__init__()
        if len(actors) != len(norms) or len(actors) < 2:
            raise ValueError(f"an ensemble needs >= 2 actors, one per statistics: {len(actors)}")
        self.normalizers = nn.ModuleList(FeatureNormalizer(n, clip) for n in norms)
        self.actors = nn.ModuleList(SetActor(a) for a in actors)

    def forward(
        self, asset_features: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        live = live_slots(mask)
        live_assets, live_f = live[:, 1:], live.to(torch.float32)
        actions = [
            actor(normalizer(asset_features, live_assets), weights, live_f)
            for normalizer, actor in zip(self.normalizers, self.actors, strict=True)
        ]
        return mean_action(actions)
