"""Learning tests: TD3 on generated markets where the right answer is known (the settings every
learning test starts from are ``tests.learning.recipes.config``).

Slow (minutes): skipped by default, run by CI (``make test`` with CI=true passes --run-slow).
The adaptive regularizer's test on the rotating market is ``test_adaptive_smoothness.py``.
"""

from __future__ import annotations

import pytest

from allocator.trainer.training.run import train
from tests.learning.recipes import config
from tests.markets import drift_market, write_market

# About 3 minutes on one core here, and about as fast on CI: the limit leaves a wide margin
# and still stops a hang inside CI's 90 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
CI_MINUTES = 3  # on one idle core (tests/conftest.py orders slow modules by it)


def test_td3_finds_the_drifting_asset(tmp_path):
    """One asset drifts up among drift-less ones: the trained agent holds > 80% of it."""
    path = write_market(drift_market(drift=0.004, vol=0.005), tmp_path / "drift.csv")
    run = train(config(path, 50_000, ["env.beta=0.2"]), tmp_path / "run")
    held = run.validation["td3"].executed_weights["UP"]
    assert held.mean() > 0.8, f"mean weight in the drifting asset on held-out days: {held.mean()}"
