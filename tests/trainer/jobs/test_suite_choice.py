"""The default-recipe rule applied to screened candidates: which conditions each meets, which
one it chooses, and that held-out runs cannot be chosen on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from allocator.cli import main
from allocator.trainer.jobs.suite.choice import choose, verdict
from allocator.trainer.jobs.suite.report import summarize
from allocator.typed_config import ConfigError

SIGNAL = ("drift", "rotating_short", "rotating_long")


def _row(market: str, policy: float, rule: float, *, anchor: float = 0.5, near: float = 0.05):
    signal = market in SIGNAL
    return {
        "market": market,
        "draw": 0,
        "signal": signal,
        "rule": "TopKMomentum(lookback=20, k=1)",
        "policy_sharpe": policy,
        "anchor_sharpe": anchor,
        "equal_weight_sharpe": anchor,
        "rule_sharpe": rule,
        "ceiling_sharpe": rule + 1.0 if signal else None,
        "policy_turnover": 0.1,
        "near_bound": near / 2,
        "near_bound_max_dim": near,
    }


def _document(
    policy_over_rule: dict[str, float], harm: float = 0.0, near: float = 0.05
) -> dict[str, Any]:
    """A development suite's document: each signal market's policy ``policy_over_rule`` above
    a rule at 1.0 (two draws alike), the random walk ``harm`` off its anchor."""
    rows = []
    for market, over in policy_over_rule.items():
        rows += [_row(market, 1.0 + over, 1.0, near=near) for _ in range(2)]
    rows += [_row("random_walk", 0.5 + harm, 0.4, near=near) for _ in range(2)]
    return {"mode": "development", "summary": summarize(rows, reps=200)}


def test_a_candidate_above_every_rule_doing_no_harm_qualifies() -> None:
    good = verdict("good", _document({"drift": 0.2, "rotating_short": 0.5, "rotating_long": 0.3}))
    assert good.qualifies
    assert good.gap_closed == pytest.approx(0.4)  # (0.5 + 0.3) / 2 of a gap of 1.0
    short = verdict(
        "short", _document({"drift": -0.1, "rotating_short": 0.5, "rotating_long": 0.3})
    )
    assert not short.qualifies
    assert short.conditions == {**good.conditions, "above the rule: drift": False}
    harmful = verdict("harm", _document({"drift": 0.2}, harm=-0.08))
    assert not harmful.conditions["within 0.05 of its anchor: random_walk"]
    collapsed = verdict("collapsed", _document({"drift": 0.2}, near=0.4))
    assert not collapsed.conditions["no collapse"]


def test_the_qualifier_closing_most_of_the_gap_is_chosen() -> None:
    small = verdict("small", _document({"rotating_short": 0.2, "rotating_long": 0.2}))
    large = verdict("large", _document({"rotating_short": 0.6, "rotating_long": 0.5}))
    failing = verdict("failing", _document({"rotating_short": 0.9, "rotating_long": -0.1}))
    assert choose([small, failing, large]).name == "large"
    at_rule = verdict("at_rule", _document({"rotating_short": 0.0, "rotating_long": 0.0}))
    assert at_rule.gap_closed == 0.0  # a gap of zero is a figure, not a missing one


def test_a_tie_goes_to_fewer_training_steps_per_draw_counting_every_seed() -> None:
    gaps = {"rotating_short": 0.6, "rotating_long": 0.5}

    def candidate(name: str, steps: int, seeds: int) -> Any:
        config = {"trainer": {"total_timesteps": steps}, "seeds": seeds}
        return verdict(name, {**_document(gaps), "config": config})

    ensemble = candidate("ensemble", 10_000, 3)
    single = candidate("single", 20_000, 1)
    assert ensemble.cost == 30_000
    assert choose([ensemble, single]).name == "single"
    assert choose([candidate("short-ensemble", 5_000, 3), single]).name == "short-ensemble"


def test_without_a_qualifier_most_conditions_then_the_larger_excess() -> None:
    two = verdict("two", _document({"drift": 0.1, "rotating_short": -0.2, "rotating_long": 0.1}))
    one = verdict("one", _document({"drift": 0.9, "rotating_short": -0.2, "rotating_long": -0.2}))
    assert choose([one, two]).name == "two"
    alike = verdict(
        "alike", _document({"drift": 0.3, "rotating_short": -0.2, "rotating_long": 0.1})
    )
    assert choose([two, alike]).name == "alike"  # same conditions, larger mean excess


def test_held_out_runs_cannot_be_chosen_on() -> None:
    document = {**_document({"drift": 0.2}), "mode": "heldout"}
    with pytest.raises(ConfigError, match="development draws only"):
        verdict("peeked", document)


def test_the_command_prints_each_condition_and_the_choice(tmp_path: Path) -> None:
    for name, over in (("weak", 0.1), ("strong", 0.4)):
        screen = tmp_path / name
        screen.mkdir()
        document = _document({"rotating_short": over, "rotating_long": over})
        (screen / "suite.json").write_text(json.dumps(document))
    result = CliRunner().invoke(
        main, ["suite", "choose", str(tmp_path / "weak"), str(tmp_path / "strong")]
    )
    assert result.exit_code == 0, result.output
    assert "| above the rule: rotating_short | yes | yes |" in result.output
    assert "chosen: strong (qualifies)" in result.output
    (tmp_path / "unfinished").mkdir()
    missing = CliRunner().invoke(main, ["suite", "choose", str(tmp_path / "unfinished")])
    assert missing.exit_code == 2
    assert "no suite.json" in missing.output
