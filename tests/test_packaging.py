"""Install groups: a serving install never pulls torch; training pins torch 2.13.0."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_training_pins_torch_and_serving_does_not_list_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert "torch==2.13.0" in extras["train"]
    for group in ("serve",):
        assert not any(
            dep.lower().startswith(("torch", "stable-baselines3")) for dep in extras[group]
        )
    assert not any(
        dep.split(">")[0].split("=")[0] == "onnxruntime" for deps in extras.values() for dep in deps
    ), "use onnxruntime-gpu only"


def test_serving_install_resolves_without_torch(tmp_path):
    """pip's resolver, asked for `allocator[serve]`, installs neither torch nor SB3."""
    report = tmp_path / "report.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            f"{ROOT}[serve]",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "onnxruntime-gpu" in names
    assert not names & {"torch", "stable-baselines3", "gymnasium", "nvidia-cudnn-cu12"}, names
