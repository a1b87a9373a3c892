"""Registries on disk for tests: exported-model directories in the layout the exporter writes."""

from __future__ import annotations

from pathlib import Path

from tests.serving import Spec, write_exported_model

SPEC = Spec(max_assets=3, window=4)
"""The shape of every model in the test registries: small, so building one is quick."""


def build_registry(root: Path, spec: Spec) -> Path:
    """``alpha`` versions 1, 2, 9, 10 (the policy seeded with the version number), ``beta/3``,
    ``beta/4`` without a manifest (an export in progress, not a version) and a stray file."""
    for version in ["1", "2", "9", "10"]:
        write_exported_model(root / "alpha" / version, spec, seed=int(version))
    write_exported_model(root / "beta" / "3", spec)
    (root / "beta" / "4").mkdir()
    (root / "README.md").write_text("not a model")
    return root
