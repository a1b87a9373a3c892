"""The benchmarks run and print the JSON figures BENCHMARKS.md quotes (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_env_throughput_prints_its_figures():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "env_throughput.py"),
            "--steps",
            "300",
            "--naive-steps",
            "40",
            "--repeats",
            "1",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    figures = json.loads(out.stdout)
    assert figures["steps_per_s"] > 0
    assert figures["naive_pandas_loc_steps_per_s"] > 0
    assert figures["assets"] == 20
    assert figures["steps"] == 300


def test_recorder_throughput_prints_its_figures():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "recorder_throughput.py"), "--decisions", "3000"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    figures = json.loads(out.stdout)
    assert figures["rows_in_table"] == 3000
    assert figures["weights_per_vector"] == 21
    assert figures["decisions_per_s"] > 0
