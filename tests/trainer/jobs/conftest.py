"""Fixtures shared by the job tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.postgres import temporary_database


@pytest.fixture(scope="module")
def postgres_database() -> Iterator[str]:
    """A Postgres database of this test module's own (empty, unmigrated), dropped at the end."""
    with temporary_database("allocator_jobs") as url:
        yield url
