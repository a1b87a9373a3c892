"""What ``SmoothTD3`` and ``SmoothSAC`` add to SB3 alike: curiosity, and separate actor and
critic learning-rate schedules (critics usually learn an order of magnitude faster)."""

from __future__ import annotations

from typing import Any

from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.policies import ContinuousCritic
from stable_baselines3.common.preprocessing import get_action_dim, get_flattened_obs_dim
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import ConstantSchedule, update_learning_rate

from allocator.trainer.agents.curiosity import CuriosityReplayBuffer
from allocator.trainer.agents.icm import ICMSettings, IntrinsicCuriosity


class SmoothOffPolicy(OffPolicyAlgorithm):
    """Base placed before SB3's TD3 or SAC: two learning-rate schedules and an optional ICM."""

    critic: ContinuousCritic

    def __init__(
        self,
        policy: Any,
        env: Any,
        actor_learning_rate: float | Schedule = 3e-4,
        critic_learning_rate: float | Schedule = 3e-4,
        icm: ICMSettings | None = None,
        **kwargs: Any,
    ) -> None:
        """The schedules, and the curiosity buffer class, before SB3's ``__init__``."""
        self.actor_lr_schedule, self.critic_lr_schedule = (
            lr if callable(lr) else ConstantSchedule(lr)
            for lr in (actor_learning_rate, critic_learning_rate)
        )
        self.icm_settings = icm or ICMSettings()
        self.icm: IntrinsicCuriosity | None = None
        if self.icm_settings.enabled:
            kwargs["replay_buffer_class"] = CuriosityReplayBuffer
        super().__init__(policy, env, learning_rate=actor_learning_rate, **kwargs)

    def _setup_model(self) -> None:
        """SB3 builds every optimizer at the actor's rate: start the critic's at its own."""
        super()._setup_model()
        update_learning_rate(self.critic.optimizer, self.critic_lr_schedule(1.0))
        if self.icm_settings.enabled:
            obs_dim = get_flattened_obs_dim(self.observation_space)
            act_dim = get_action_dim(self.action_space)
            self.icm = IntrinsicCuriosity(obs_dim, act_dim, self.icm_settings, device=self.device)
            assert isinstance(self.replay_buffer, CuriosityReplayBuffer)
            self.replay_buffer.attach(self.icm, lambda: self.num_timesteps)

    def _update_learning_rate(self, optimizers: Any) -> None:
        """SB3 applies one schedule to all optimizers; apply each its own."""
        progress = self._current_progress_remaining
        actor_lr = self.actor_lr_schedule(progress)
        critic_lr = self.critic_lr_schedule(progress)
        for opt in optimizers if isinstance(optimizers, list) else [optimizers]:
            update_learning_rate(opt, critic_lr if opt is self.critic.optimizer else actor_lr)
        self.logger.record("train/actor_learning_rate", actor_lr)
        self.logger.record("train/critic_learning_rate", critic_lr)

    def _log_curiosity(self) -> None:
        if self.icm is not None:
            for key, value in self.icm.last_stats.items():
                self.logger.record(key, value)

    def _excluded_save_params(self) -> list[str]:
        # The ICM is saved beside the SB3 zip (icm.pt), never pickled into it.
        return [*super()._excluded_save_params(), "icm"]
