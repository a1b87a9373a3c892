"""Training callbacks that report what the portfolio is doing, not only what the agent learns."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback


class TurnoverCallback(BaseCallback):
    """Logs ``rollout/turnover`` and ``rollout/cost``: means over the last ``window`` steps."""

    def __init__(self, window: int = 1_000) -> None:
        super().__init__()
        self.turnover: deque[float] = deque(maxlen=window)
        self.costs: deque[float] = deque(maxlen=window)

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", []):
            if "turnover" in info:
                self.turnover.append(float(info["turnover"]))
                self.costs.append(float(info["cost"]))
        return True

    def _on_rollout_end(self) -> None:
        if self.turnover:
            self.logger.record("rollout/turnover", float(np.mean(self.turnover)))
            self.logger.record("rollout/cost", float(np.mean(self.costs)))


class StopAtStep(BaseCallback):
    """Ends ``learn`` once ``step`` timesteps are done, as an interruption would (schedules
    still span the full budget)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def _on_step(self) -> bool:
        return self.num_timesteps < self.step


class StopWhenAsked(BaseCallback):
    """Ends ``learn`` after the step during which ``event`` was set (a SIGTERM, a Ctrl-C):
    between steps the model, buffer and schedules agree, so it can be checkpointed."""

    def __init__(self, event: threading.Event) -> None:
        super().__init__()
        self.event = event

    def _on_step(self) -> bool:
        return not self.event.is_set()
