"""The ICM in SB3's off-policy algorithms: the replay buffer's ``sample`` trains it on each batch
and mixes in its bonus, so TD3 and SAC share it unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch as th
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from allocator.trainer.agents.icm import ICMSettings, IntrinsicCuriosity


class CuriosityReplayBuffer(ReplayBuffer):
    """Replay buffer whose samples carry extrinsic + intrinsic reward once an ICM is attached."""

    curiosity: IntrinsicCuriosity | None = None
    clock: Callable[[], int] | None = None
    batches = 0

    def attach(self, curiosity: IntrinsicCuriosity, clock: Callable[[], int]) -> None:
        self.curiosity = curiosity
        self.clock = clock
        self.batches = 0

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        batch = super().sample(batch_size, env=env)
        if self.curiosity is None or self.clock is None:
            return batch
        if self.batches % self.curiosity.settings.update_every == 0:
            self.curiosity.update(batch.observations, batch.actions, batch.next_observations)
        self.batches += 1
        intrinsic = self.curiosity.intrinsic_reward(
            batch.observations, batch.actions, batch.next_observations
        )
        return batch._replace(rewards=self.curiosity.mix(batch.rewards, intrinsic, self.clock()))


class CuriosityMixin:
    """Gives an SB3 off-policy algorithm an optional ICM, logged under ``icm/``."""

    icm: IntrinsicCuriosity | None
    # What the SB3 algorithm it is mixed into provides.
    device: th.device
    logger: Logger

    def _init_curiosity(self, settings: ICMSettings | None, kwargs: dict[str, Any]) -> None:
        self.icm_settings = settings or ICMSettings()
        self.icm = None
        if self.icm_settings.enabled:
            kwargs["replay_buffer_class"] = CuriosityReplayBuffer

    def _setup_curiosity(self) -> None:
        if not self.icm_settings.enabled:
            return
        obs_dim = int(self.observation_space.shape[0])  # type: ignore[attr-defined]
        act_dim = int(self.action_space.shape[0])  # type: ignore[attr-defined]
        self.icm = IntrinsicCuriosity(obs_dim, act_dim, self.icm_settings, device=self.device)
        self.replay_buffer.attach(self.icm, lambda: self.num_timesteps)  # type: ignore[attr-defined]

    def _log_curiosity(self) -> None:
        if self.icm is not None:
            for key, value in self.icm.last_stats.items():
                self.logger.record(key, value)

    def _excluded_save_params(self) -> list[str]:
        # The ICM is saved beside the SB3 zip (icm.pt), never pickled into it.
        return [*super()._excluded_save_params(), "icm"]  # type: ignore[misc]
