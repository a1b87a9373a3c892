"""``SmoothSAC``: SB3's SAC with separate actor/critic learning rates and optional curiosity."""

from __future__ import annotations

from stable_baselines3 import SAC

from allocator.trainer.agents.off_policy import SmoothOffPolicy
from allocator.trainer.agents.shared_networks import slot_order_sums


class SmoothSAC(SmoothOffPolicy, SAC):
    """SAC whose actor (and entropy coefficient) and critic follow their own schedules."""

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        """SB3's SAC updates (pooled sums in slot order: no gradient step needs their bits),
        then the ICM's figures of this call logged beside SAC's."""
        with slot_order_sums():
            super().train(gradient_steps, batch_size)
        self._log_curiosity()
