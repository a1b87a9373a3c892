"""Which draws of a suite market may choose something (development) and which only measure
(held-out): a figure is worth something only on draws nothing was chosen on."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from allocator.trainer.market.generated import MARKETS, parse_generated
from allocator.typed_config import ConfigError

SP500_DEV = "sp500_dev"
"""The suite's real market: the embedded S&P 500 in its development years."""


@dataclass(frozen=True)
class DrawSets:
    """The development and held-out draw numbers of one market kind."""

    development: range
    held_out: range


GENERATED_DRAWS = DrawSets(development=range(100, 1000), held_out=range(1000, 2000))
SP500_YEARS = DrawSets(development=range(2005, 2010), held_out=range(2005, 2010))

DRAWS: dict[str, DrawSets] = {**dict.fromkeys(MARKETS, GENERATED_DRAWS), SP500_DEV: SP500_YEARS}
"""Every suite market's draw sets by kind."""


class HeldOutDrawError(ConfigError):
    """A command that chooses was given a draw reserved for measuring."""


def draw_sets(kind: str) -> DrawSets:
    """The draw sets of ``kind``, or a ``ConfigError`` listing the known kinds."""
    try:
        return DRAWS[kind]
    except KeyError:
        raise ConfigError(f"unknown suite market {kind!r}; known: {', '.join(DRAWS)}") from None


def _span(draws: range) -> str:
    return f"{draws.start}-{draws.stop - 1}"


def require_development(kind: str, draws: Iterable[int], what: str = "this command") -> None:
    """Refuse any draw of ``kind`` outside its development set, naming the first one."""
    sets = draw_sets(kind)
    for draw in draws:
        if draw in sets.development:
            continue
        reserved = "a held-out draw" if draw in sets.held_out else "not a development draw"
        raise HeldOutDrawError(
            f"market {kind} draw {draw} is {reserved}: {what} chooses something and may use "
            f"development draws only ({_span(sets.development)}); held-out draws "
            f"({_span(sets.held_out)}) measure a recipe fixed beforehand (`allocator suite run "
            "--mode heldout`)"
        )


def refuse_held_out(kind: str, draws: Iterable[int], what: str = "this command") -> None:
    """Refuse the held-out draws of ``kind`` only (a study with its own development draws)."""
    sets = draw_sets(kind)
    held = [d for d in draws if d in sets.held_out and d not in sets.development]
    if held:
        require_development(kind, held[:1], what)


def require_development_dataset(dataset: str, what: str = "this command") -> None:
    """A trainer's ``data.dataset``: a ``generated:KIND:DRAW`` must be a development draw."""
    try:
        parsed = parse_generated(dataset)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if parsed is not None:
        require_development(parsed[0], [parsed[1]], what)


def first_draws(kind: str, n: int, held_out: bool) -> list[int]:
    """The first ``n`` draws of ``kind``'s development or held-out set."""
    sets = draw_sets(kind)
    pool = sets.held_out if held_out else sets.development
    if n > len(pool):
        raise ConfigError(f"market {kind} has only {len(pool)} draws in that set, asked for {n}")
    return list(pool[:n])
