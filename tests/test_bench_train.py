"""``bench/train_throughput.py`` runs every variant and prints its figures (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("vanilla", "fixed", "adaptive", "adaptive_icm")


def test_train_throughput_prints_every_variant():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "train_throughput.py"),
            "--steps",
            "15",
            "--repeats",
            "2",
            "--learning-starts",
            "20",
            "--batch-size",
            "16",
            "--buffer-size",
            "500",
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    figures = json.loads(out.stdout)
    assert set(figures["variants"]) == set(VARIANTS)
    for name in VARIANTS:
        entry = figures["variants"][name]
        assert entry["steps_per_s"] > 0
        assert len(entry["steps_per_s_runs"]) == 2
        assert all(rate > 0 for rate in entry["steps_per_s_runs"])
        # Two timed learn(15) after a 20-step warm-up: one gradient step per env step after it.
        assert entry["n_updates"] == 30
        if name != "vanilla":
            assert entry["ratio_vs_vanilla"] > 0
    assert figures["variants"]["vanilla"]["algorithm"] == "TD3"
    assert figures["variants"]["adaptive_icm"]["algorithm"] == "SmoothTD3"
    assert figures["steps"] == 15
    assert figures["repeats"] == 2
    assert figures["batch_size"] == 16
    assert figures["device"] == "cpu"
    assert figures["torch_threads"] == 1
    assert figures["assets"] == 20


def test_train_throughput_compares_the_shared_policy_with_the_mlp():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "train_throughput.py"),
            "--quick",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--variants",
            "adaptive,shared,shared_asset_v1",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    variants = json.loads(out.stdout)["variants"]
    assert variants["adaptive"]["policy"] == "TD3Policy"
    for name in ("shared", "shared_asset_v1"):
        assert variants[name]["policy"] == "SharedTD3Policy"
        assert variants[name]["ratio_vs_mlp"] > 0
        assert variants[name]["n_updates"] == 50  # --quick: 50 timed steps after the warm-up


def test_train_throughput_runs_the_default_recipe_with_and_without_its_bound_penalty():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "train_throughput.py"),
            "--quick",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--variants",
            "recipe,recipe_unbounded",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    variants = json.loads(out.stdout)["variants"]
    for name in ("recipe", "recipe_unbounded"):
        assert variants[name]["policy"] == "SharedTD3Policy"
        assert variants[name]["batch_size"] == 128  # the recipe's own, not --quick's
        assert variants[name]["steps_per_s"] > 0
        assert variants[name]["n_updates"] == 50
    assert variants["recipe"]["bound_penalty_weight"] > 0
    assert variants["recipe_unbounded"]["bound_penalty_weight"] == 0
