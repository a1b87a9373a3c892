"""Shared pytest options and fixtures: slow learning tests run only with --run-slow (CI
passes it); one real Postgres database per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.postgres import temporary_database

# Property tests check behaviour, never speed: Hypothesis's per-example wall-clock deadline
# (200 ms) fails them on a loaded 2-core CI machine for reasons that have nothing to do with
# the property. Speed is measured by the benchmarks in bench/.
settings.register_profile("allocator", deadline=None)
settings.load_profile("allocator")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        _slow_modules_first(items)
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow (CI does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _slow_modules_first(items: list[pytest.Item]) -> None:
    """Modules holding a slow test first, longest first, each module's tests kept together and
    in order.

    ``make test`` hands whole modules to whichever worker is free (``--dist loadfile``, in
    collection order): the minutes-long learning modules start at once, one per worker, and the
    short modules fill in around them, rather than one of them starting last and running alone.
    Longest first (a module's ``CI_MINUTES``, its one-core estimate) so that the longest is
    never the one left to start after the others: in alphabetical order the 18-minute rotating
    module would start only when the 8-minute ensemble module had finished.
    """
    slow_modules = {item.path for item in items if "slow" in item.keywords}

    def order(item: pytest.Item) -> tuple[bool, float]:
        minutes = float(getattr(getattr(item, "module", None), "CI_MINUTES", 0.0))
        return item.path not in slow_modules, -minutes

    items.sort(key=order)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database for this test session, dropped (even with open sessions) at the end."""
    with temporary_database("allocator_test") as url:
        yield url
