"""``import allocator`` names the public entry points and stays light.

Each name is loaded on first use: importing the package pulls in neither grpc nor torch, and
the client's names load without torch (a trading service installs the `client` extra only).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import allocator

ROOT = Path(__file__).resolve().parents[1]

CLIENT_NAMES = (
    "Allocation",
    "AllocationRequest",
    "AllocatorClient",
    "AllocatorError",
    "AsyncAllocatorClient",
    "ConfigError",
    "RetryPolicy",
)


def loaded_after(code: str) -> set[str]:
    """Top-level modules imported by ``code`` in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return {name.split(".")[0] for name in done.stdout.split()}


def test_import_loads_neither_grpc_nor_torch() -> None:
    loaded = loaded_after("import allocator")
    assert not loaded & {"grpc", "torch", "numpy", "pandas", "pydantic"}


def test_client_names_load_without_torch() -> None:
    loaded = loaded_after(f"from allocator import {', '.join(CLIENT_NAMES)}")
    assert "grpc" in loaded
    assert not loaded & {"torch", "stable_baselines3", "pandas", "onnxruntime"}


def test_every_public_name_resolves_to_its_definition() -> None:
    assert set(allocator.__all__) == {"__version__", *allocator._LAZY}
    assert set(CLIENT_NAMES) <= set(allocator.__all__)
    for name in allocator.__all__:
        value = getattr(allocator, name)
        if name != "__version__":
            assert value.__module__ == allocator._LAZY[name], name
    assert set(allocator.__all__) <= set(dir(allocator))


def test_unknown_names_are_attribute_errors() -> None:
    assert not hasattr(allocator, "no_such_name")
