"""``allocator suite``: the recipe on generated markets whose right answer is known and on the
S&P 500 development years, scored beside its yardsticks; exit 2 on a bad config or a draw the
mode may not use, 1 when a run failed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from allocator.cli.options import (
    config_option,
    emit_json,
    fail,
    failing,
    interrupted_exit_code,
    json_options,
    overrides_option,
    sigterm_stops,
)


@click.group()
def suite() -> None:
    """The market suite: generated markets with known answers, plus the S&P 500 development
    years (see docs/suite.md)."""


@suite.command("run")
@config_option(
    "suite YAML (configs/suite.yaml: every market; configs/suite_ci.yaml: the CI gate)",
    required=True,
)
@overrides_option("override a key, e.g. --set draws=3 --set trainer.algorithm.gamma=0.9")
@click.option("--recipe", help="trainer YAML to run (default: the config's trainer)")
@click.option(
    "--mode",
    type=click.Choice(["development", "heldout"]),
    help="development (default): development draws, the only ones anything may be chosen on; "
    "heldout: held-out draws, to measure a recipe fixed beforehand. Never choose a recipe, "
    "setting or rule from heldout figures: tune and selection studies refuse those draws.",
)
@click.option("--draws", type=int, help="draws per generated market")
@click.option("--markets", help="comma-separated market kinds (default: config's)")
@click.option("--steps", type=int, help="training steps per run")
@click.option(
    "--executor",
    type=click.Choice(["local", "processes", "ray"]),
    help="run in this process, in worker processes or as Ray tasks (default: the config's)",
)
@click.option("--workers", type=int, help="processes or Ray CPUs at once")
@click.option("--out", type=click.Path(file_okay=False), help="write the report here")
@click.option("--progress/--no-progress", default=True, show_default=True)
@json_options
def suite_run(
    config_path: str,
    overrides: tuple[str, ...],
    recipe: str | None,
    mode: str | None,
    draws: int | None,
    markets: str | None,
    steps: int | None,
    executor: str | None,
    workers: int | None,
    out: str | None,
    progress: bool,
    as_json: bool,
    json_out: str | None,
) -> None:
    """Train the recipe on every draw of every market and print the table over draws.

    Scores, on each draw's held-out days and net of the same costs: the policy, its anchor,
    equal weight, the best top-k momentum or reversal rule chosen on the training span, and the
    generator's Bayes filter where it is known (the ceiling).
    """
    # the trainer (torch, SB3) and the suite: imported only when a suite runs
    from allocator.trainer.jobs.suite.config import load_suite_config
    from allocator.trainer.jobs.suite.runner import run_suite
    from allocator.trainer.market.data import DataError
    from allocator.typed_config import ConfigError

    extra = [f"trainer={recipe}"] if recipe else []
    extra += list(overrides)
    settings = {"mode": mode, "draws": draws, "executor": executor, "workers": workers}
    extra += [f"{key}={value}" for key, value in settings.items() if value is not None]
    if markets:
        extra.append(f"markets=[{markets}]")
    if steps is not None:
        extra.append(f"trainer.total_timesteps={steps}")
    with failing(ConfigError):
        config = load_suite_config(config_path, extra)

    def report(row: dict[str, Any], done: int, total: int) -> None:
        if progress:
            click.echo(
                f"[{done}/{total}] {row['market']} draw {row['draw']}: policy "
                f"{row['policy_sharpe']}, rule {row['rule_sharpe']} ({row['rule']})",
                err=True,
            )

    try:
        with sigterm_stops():
            result = run_suite(config, out_dir=out, progress=report)
    except (ConfigError, DataError) as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:
        fail("suite stopped; rows.jsonl holds the runs that finished", interrupted_exit_code(exc))
    if not as_json:
        click.echo(
            f"suite ({config.mode} draws), {len(result.rows)} runs in {result.seconds:.0f} s"
        )
        click.echo(result.table)
    for name, path in result.files.items():
        click.echo(f"{name}: {path}", err=as_json)
    emit_json(json.loads(Path(result.files["json"]).read_text()), as_json, json_out)


@suite.command("choose")
@click.argument("screens", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@json_options
def suite_choose(screens: tuple[str, ...], as_json: bool, json_out: str | None) -> None:
    """Apply the default-recipe rule to screened candidates: one finished development suite
    run per directory (named after it), each condition met or not, and the one chosen.

    Qualifies: above the best training-span rule on every signal market, within 0.05 Sharpe
    of its anchor on the random walk and the S&P 500 development years, no action dimension
    near its bound 20% of the time on any market. Chosen: the qualifier closing the largest
    share of the rule-to-ceiling gap on the rotating markets; with none, the candidate meeting
    most conditions (ties: mean policy minus rule over the signal markets).
    """
    # light: json and the suite's summaries, no trainer
    from allocator.trainer.jobs.suite.choice import choose, read_screen, verdict_table
    from allocator.typed_config import ConfigError

    with failing(ConfigError):
        verdicts = [read_screen(Path(s)) for s in screens]
    chosen = choose(verdicts)
    if not as_json:
        click.echo(verdict_table(verdicts))
        how = "qualifies" if chosen.qualifies else f"meets most conditions ({chosen.met})"
        click.echo(f"chosen: {chosen.name} ({how})")
    payload = {
        "chosen": chosen.name,
        "qualifies": chosen.qualifies,
        "candidates": [
            {
                "name": v.name,
                "conditions": v.conditions,
                "met": v.met,
                "qualifies": v.qualifies,
                "excess_over_rule": v.excess,
                "gap_closed": v.gap_closed,
            }
            for v in verdicts
        ],
    }
    emit_json(payload, as_json, json_out)
