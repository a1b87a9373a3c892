"""Training callbacks that report what the portfolio is doing, not only what the agent learns."""

from __future__ import annotations

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
