"""The ICM in SB3's off-policy algorithms: the replay buffer's ``sample`` trains it on each batch
and mixes in its bonus, so TD3 and SAC share it unchanged."""

from __future__ import annotations

from collections.abc import Callable

from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from allocator.trainer.agents.icm import IntrinsicCuriosity


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
