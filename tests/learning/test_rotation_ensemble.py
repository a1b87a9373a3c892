"""The ensemble study's judge: it replays what training measured, and averages what it loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.learning.rotation import (
    MEMBER_OFFSETS,
    ensemble_draws_refused,
    judge_ensemble,
    member_dir,
    train_member,
)


def test_three_copies_of_one_member_score_as_that_member(tmp_path: Path) -> None:
    """The judge replays the control run's own validation (it raises otherwise), and the mean
    of three identical policies is that policy: the same held-out Sharpe and turnover."""
    first = train_member(tmp_path, 1, 0, "cpu", steps=800)
    for offset in MEMBER_OFFSETS[1:]:
        shutil.copytree(first, member_dir(tmp_path, 1, offset))
    row = judge_ensemble(tmp_path, 1)
    control, ensemble = row["control"], row["ensemble-3"]
    assert ensemble["policy_sharpe"] == pytest.approx(control["policy_sharpe"], abs=1e-5)
    assert ensemble["policy_turnover"] == pytest.approx(control["policy_turnover"], abs=1e-5)
    assert control["excess"] == pytest.approx(control["policy_sharpe"] - row["momentum_sharpe"])
    assert row["member_sharpes"] == [control["policy_sharpe"]] * 3


def test_a_member_of_another_market_is_refused(tmp_path: Path) -> None:
    """Members fitted on another draw's prices would not be one policy's seeds."""
    train_member(tmp_path, 1, 0, "cpu", steps=600)
    other = train_member(tmp_path, 2, 0, "cpu", steps=600)
    for offset in MEMBER_OFFSETS[1:]:
        shutil.copytree(other, member_dir(tmp_path, 1, offset))
    with pytest.raises(ValueError, match=r"draw 1: .* other prices"):
        judge_ensemble(tmp_path, 1)


@pytest.mark.parametrize("draws", [[10], [5], [1, 42]], ids=["judged-before", "test-draw", "mixed"])
def test_the_study_refuses_draws_outside_its_two_sets(draws: list[int]) -> None:
    assert ensemble_draws_refused(draws) is not None
    assert ensemble_draws_refused([1, 2, 3, 4]) is None
    assert ensemble_draws_refused(range(42, 58)) is None
