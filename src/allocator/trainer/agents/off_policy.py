"""What ``SmoothTD3`` and ``SmoothSAC`` add to SB3 alike: curiosity, and separate actor and
critic learning-rate schedules (critics usually learn an order of magnitude faster)."""

from __future__ import annotations

from typing import Any

from stable_baselines3.common.policies import ContinuousCritic
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import ConstantSchedule

from allocator.trainer.agents.curiosity import CuriosityMixin
from allocator.trainer.agents.icm import ICMSettings


class SmoothOffPolicy(CuriosityMixin):
    """Mixin placed before SB3's TD3 or SAC: two learning-rate schedules and an optional ICM."""

    actor_lr_schedule: Schedule
    critic_lr_schedule: Schedule
    # What the SB3 algorithm it is mixed into provides.
    _current_progress_remaining: float
    critic: ContinuousCritic

    def _init_smooth(
        self,
        actor_learning_rate: float | Schedule,
        critic_learning_rate: float | Schedule,
        icm: ICMSettings | None,
        kwargs: dict[str, Any],
    ) -> None:
        """Before SB3's ``__init__``: the schedules, and the curiosity buffer class in kwargs."""
        self.actor_lr_schedule, self.critic_lr_schedule = (
            lr if callable(lr) else ConstantSchedule(lr)
            for lr in (actor_learning_rate, critic_learning_rate)
        )
        self._init_curiosity(icm, kwargs)

    def _setup_model(self) -> None:
        """SB3 builds every optimizer at the actor's rate: start the critic's at its own."""
        super()._setup_model()  # type: ignore[misc]
        for group in self.critic.optimizer.param_groups:
            group["lr"] = self.critic_lr_schedule(1.0)
        self._setup_curiosity()

    def _update_learning_rate(self, optimizers: Any) -> None:
        """SB3 applies one schedule to all optimizers; apply each its own."""
        progress = self._current_progress_remaining
        actor_lr = self.actor_lr_schedule(progress)
        critic_lr = self.critic_lr_schedule(progress)
        for opt in optimizers if isinstance(optimizers, list) else [optimizers]:
            lr = critic_lr if opt is self.critic.optimizer else actor_lr
            for group in opt.param_groups:
                group["lr"] = lr
        self.logger.record("train/actor_learning_rate", actor_lr)
        self.logger.record("train/critic_learning_rate", critic_lr)
