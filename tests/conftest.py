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
    """Modules holding a slow test first, each module's tests kept together and in order.

    ``make test`` hands whole modules to whichever worker is free (``--dist loadfile``, in
    collection order): the minutes-long learning modules start at once, one per worker, and the
    short modules fill in around them, rather than one of them starting last and running alone.
    """
    slow_modules = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.path not in slow_modules)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database for this test session, dropped (even with open sessions) at the end."""
    with temporary_database("allocator_test") as url:
        yield url
