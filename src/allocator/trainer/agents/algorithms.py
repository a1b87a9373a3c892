"""The algorithms a config or a manifest names (``algorithm: td3``), by that name, and what is
done to either's actor alike."""

from __future__ import annotations

import torch as th
from torch import nn

from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.shared_policies import SharedActorBase
from allocator.trainer.agents.td3 import SmoothTD3

Algorithm = SmoothTD3 | SmoothSAC
"""A trained model of either algorithm: both carry an ``actor`` and ``critic``."""

ALGORITHMS: dict[str, type[Algorithm]] = {"td3": SmoothTD3, "sac": SmoothSAC}
"""Algorithm name (``TrainConfig.algorithm.name``, ``Manifest.algorithm``) -> its class."""


def zero_actions(actor: nn.Module) -> None:
    """Make a deterministic actor's action exactly 0 (a tilt's anchor): zero the layers its
    scores come out of (the shared heads, or the last linear layer of SB3's flat ``mu``)."""
    if isinstance(actor, SharedActorBase):
        heads: list[nn.Module] = [actor.net.rho[-1], actor.net.cash_head]
    else:
        mu = getattr(actor, "mu", None)
        if mu is None:
            raise TypeError(f"{type(actor).__name__} has no action head to zero")
        heads = [[m for m in mu.modules() if isinstance(m, nn.Linear)][-1]]
    with th.no_grad():
        for layer in heads:
            assert isinstance(layer, nn.Linear)
            layer.weight.zero_()
            layer.bias.zero_()
