"""Every script in examples/ runs as a reader would run it, on its smallest settings.

Each runs in a fresh interpreter from the repository root with ``--out`` in a temporary
directory, and must exit 0 and write what its README row promises.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

pytest.importorskip("torch")  # the examples need the `train` extra


def run_example(name: str, out: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--out", str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_example_is_tested_and_listed() -> None:
    """A new script gets a test here (``test_<its name>``) and a row in examples/README.md."""
    scripts = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    assert [s for s in scripts if f"test_{s}" not in globals()] == []
    readme = (EXAMPLES / "README.md").read_text()
    assert [s for s in scripts if f"]({s}.py)" not in readme] == []


def test_custom_baseline(tmp_path: Path) -> None:
    out = run_example("custom_baseline.py", tmp_path, "--end", "2018-06-30")
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert set(metrics) == {"inverse-volatility", "equal-weight", "hrp"}
    assert "inverse-volatility" in out


def test_train_serve(tmp_path: Path) -> None:
    out = run_example("train_serve.py", tmp_path, "--steps", "200", "--days", "2")
    assert (tmp_path / "models" / "example" / "1" / "model.onnx").is_file()
    assert "smoothed (execute this)" in out
    assert "fund-2:" in out  # the asyncio client's batch
    assert (tmp_path / "trades.db").is_file()


def test_walk_forward(tmp_path: Path) -> None:
    out = run_example("walk_forward.py", tmp_path, "--set", "trainer.total_timesteps=200")
    assert (tmp_path / "report" / "report.md").is_file()
    assert f"interactive: {tmp_path / 'report' / 'report.html'}" in out
    assert "goal:" in out


def test_paper_trading(tmp_path: Path) -> None:
    out = run_example("paper_trading.py", tmp_path, "--steps", "200", "--bars", "8")
    with sqlite3.connect(tmp_path / "trades.db") as conn:
        (fills,) = conn.execute("SELECT count(*) FROM fills").fetchone()
        (cycles,) = conn.execute("SELECT count(*) FROM trade_cycles").fetchone()
        (decisions,) = conn.execute("SELECT count(*) FROM decisions").fetchone()
    assert cycles == decisions == 8  # one recorded server decision per traded bar
    assert fills > 0
    assert f"fills: {fills}," in out
    assert "paper-desk: active; last bar 2018-07-12" in out
    compare = json.loads((tmp_path / "compare.json").read_text())
    assert compare["bars"] == 8
    # fractional shares at the model's cost rate: the account tracks its backtest closely
    assert abs(compare["tracking_difference"]) < 1e-3
