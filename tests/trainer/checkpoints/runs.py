"""The frozen version-1 runs of tests/fixtures/checkpoints, and how the tests copy and compare them.

Every test upgrades a copy in tmp_path; the fixtures themselves are never touched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
TD3, SAC = "v1_td3", "v1_sac_icm"
WIDTH = {TD3: 2, SAC: 3}
ALGO = {TD3: "td3", SAC: "sac"}


def copy_fixture(tmp_path: Path, name: str) -> Path:
    """A fresh copy of the fixture run ``name`` under ``tmp_path``."""
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def tree(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` by relative path, with its bytes (to compare directories)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
