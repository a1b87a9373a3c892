"""The registry every registry test starts from (see ``tests.registry.build_registry``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.registry import SPEC, build_registry


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    return build_registry(tmp_path / "registry", SPEC)
