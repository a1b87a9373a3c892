"""The benchmarks run and print the JSON figures BENCHMARKS.md quotes (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert figures["asset_v1_steps_per_s"] > 0
    assert figures["asset_v1_tilt_steps_per_s"] > 0
    assert figures["assets"] == 20
    assert figures["steps"] == 300


def test_recorder_throughput_prints_its_figures():
    out = subprocess.run(
        [
            *(sys.executable, str(ROOT / "bench" / "recorder_throughput.py")),
            *("--decisions", "3000", "--ack-seconds", "0.3", "--ack-concurrency", "1,2"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    figures = json.loads(out.stdout)
    assert [p["backend"] for p in figures["sustained"]] == ["postgresql", "sqlite"]
    for p in figures["sustained"]:
        assert p["rows_in_table"] == 3000
        assert p["decisions_per_s"] > 0
        assert p["writer_cpu_us_per_decision"] > 0
    phases = {(p["backend"], p["ack"], p["concurrency"]) for p in figures["acknowledgement"]}
    assert phases == {
        (b, a, c) for b in ("postgresql", "sqlite") for a in ("durable", "queued") for c in (1, 2)
    }
    for p in figures["acknowledgement"]:
        assert p["p95_ms"] >= p["p50_ms"] > 0
        assert p["decisions_per_s"] > 0
    assert figures["weights_per_vector"] == 21


def test_request_path_profile_prints_both_trees_figures():
    """This tree beside a baseline (here this very ``src``: the loader is what is tested)."""
    out = subprocess.run(
        [
            *(sys.executable, str(ROOT / "bench" / "request_path_profile.py")),
            *("--batch", "8", "--rounds", "1", "--repeat", "1", "--single-rounds", "3"),
            *("--top", "3", "--baseline", str(ROOT / "src")),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    figures = json.loads(out.stdout)
    for tree in ("this", "baseline"):
        for phase in ("batch", "single", "single_small"):
            result = figures[tree][phase]
            assert result["us_per_decision"] > 0
            assert len(result["top"]) == 3
    assert figures["batch_size"] == 8


@pytest.mark.slow
def test_serve_latency_prints_its_figures_and_records_every_decision():
    out = subprocess.run(
        [
            *(sys.executable, str(ROOT / "bench" / "serve_latency.py")),
            *("--duration", "0.5", "--concurrency", "1,4", "--rates", "200"),
            *("--batch-size", "16", "--portfolios", "50", "--rounds", "2", "--clients", "2"),
            *("--acks", "durable,queued", "--bare-aio"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    figures = json.loads(out.stdout)
    runs = {(p["server"], p["phase"], p["round"]) for p in figures["phases"]}
    compared = {"closed_c1", "closed_c4", "batch_16", "stream_16"}
    ours = tuple(f"{db}-{ack}" for db in ("sqlite", "postgresql") for ack in ("durable", "queued"))
    servers = ("bare", "bare-aio", *ours)
    assert runs == {(s, p, r) for s in servers for p in compared for r in (0, 1)} | {
        (s, "open_200", 0) for s in ours
    }
    assert figures["clients"] == 2
    for p in figures["phases"]:
        assert set(p["codes"]) == {"OK"}, p
        assert p["p99_ms"] >= p["p95_ms"] >= p["p50_ms"] > 0
        assert p["generator_cpu"] > 0
        assert p["server_cpu"] > 0
        assert "latencies" not in p  # merged away
        # closed loops of several threads and the open loop run in both client processes
        expected = 1 if p["phase"] in {"closed_c1", "batch_16", "stream_16"} else 2
        assert p["clients"] == expected, p
        if p["phase"] == "stream_16":
            assert p["decisions_per_s"] > 0
            assert p["in_flight"] == 4
    ratios = {(c["phase"], c["database"]): c for c in figures["comparison"]}
    assert set(ratios) == {(p, d) for p in compared for d in (*ours, "bare-aio")}
    for c in ratios.values():  # each ratio is the medians' ratio it claims to be
        assert c["p50_ratio"] == round(c["allocator"]["p50_ms"] / c["bare"]["p50_ms"], 2)
    for db in ours:
        recording = figures["recording"][db]
        assert recording["ok_decisions"] > 0
        assert recording["recorded_rows"] == recording["ok_decisions"]
        assert recording["complete"]
        assert recording["server_exit_code"] == 0
    assert figures["bare_server_exit_code"] == figures["bare_aio_exit_code"] == 0


@pytest.mark.slow
def test_serve_latency_times_a_shared_model_below_and_above_its_training_slots():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "serve_latency.py"),
            "--model",
            "shared",
            "--assets",
            "3,25",
            "--duration",
            "0.3",
            "--portfolios",
            "20",
            "--databases",
            "postgresql",
            "--acks",
            "durable",
            "--rounds",
            "1",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    figures = json.loads(out.stdout)
    model = figures["model"]
    assert model["policy"] == "shared"
    assert model["training_slots"] == 20
    assert model["max_served_assets"] >= 60
    assert model["closes_per_asset"] == 31  # asset_v1 looks back 30 returns; equal anchor: 1
    phases = {(p["server"], p["phase"]): p for p in figures["phases"]}
    assert set(phases) == {
        (s, p) for s in ("bare", "postgresql") for p in ("closed_c1_a3", "closed_c1_a25")
    }
    for server in ("bare", "postgresql"):
        for assets in (3, 25):
            phase = phases[server, f"closed_c1_a{assets}"]
            assert phase["assets"] == assets
            assert set(phase["codes"]) == {"OK"}
            assert phase["p99_ms"] >= phase["p95_ms"] >= phase["p50_ms"] > 0
    recording = figures["recording"]["postgresql"]
    assert recording["recorded_rows"] == recording["ok_decisions"] > 0
    assert recording["server_exit_code"] == 0


@pytest.mark.slow
def test_serve_soak_samples_memory_and_latency_by_minute():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "serve_soak.py"),
            *("--minutes", "1", "--rate", "40", "--portfolios", "20"),
            *("--sample-seconds", "2", "--warmup-minutes", "0.25"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    figures = json.loads(out.stdout)
    (minute,) = figures["minutes"]
    assert minute["codes"] == {"OK": 2400}
    assert minute["p99_ms"] >= minute["p95_ms"] >= minute["p50_ms"] > 0
    assert len(figures["rss_samples"]) >= 25  # every 2 s for a minute, and one at the end
    assert all(s["rss_mb"] > 10 for s in figures["rss_samples"])
    growth = figures["rss_growth_after_warmup"]
    assert growth["from_s"] >= 15
    assert growth["rss_end_mb"] == figures["rss_samples"][-1]["rss_mb"]
    assert figures["recorded_rows"] == figures["ok_decisions"] == 2400
    assert figures["server_exit_code"] == 0
