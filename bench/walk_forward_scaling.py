"""Wall time of one tiny walk-forward run sequentially and on a local Ray with 2 workers.

The same config (``configs/walk_forward_tiny.yaml``, by default widened to four quarterly
windows and 2,000 training steps each so the windows, not the process start-ups, dominate) runs
three ways, each with torch limited to one thread per window and no database recording:

* ``sequential``: the ``local`` executor in this process, after an untimed run has paid the
  one-off imports (torch's ONNX exporter, skfolio's optimisers);
* ``ray_cold``: ``executor: ray`` starting its own local Ray (``--workers`` CPUs), so Ray's
  start-up and each worker's imports are inside the measured time (a one-shot job);
* ``ray_warm``: a local Ray started beforehand whose workers already ran the walk-forward once
  (untimed), as on a long-lived cluster; the timed run is the second one.

Per-window Sharpe ratios are compared across the runs (same seeds, so they must be identical).
With ``--repeats`` the sequential and warm runs are repeated and the best time is kept. The
load average before and after is printed: on a shared 2-core machine any other process takes a
core away from one of the two workers. Prints one JSON object; nothing passes or fails on time
(goal: ``speedup_warm`` >= 1.8). Run: ``.venv/bin/python bench/walk_forward_scaling.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from allocator.trainer.jobs.walk_forward.config import (
    WalkForwardConfig,
    load_walk_forward_config,
)
from allocator.trainer.jobs.walk_forward.runner import run_walk_forward

ROOT = Path(__file__).resolve().parents[1]


def _timed(config: WalkForwardConfig, out: Path) -> tuple[float, list[float]]:
    started = time.perf_counter()
    result = run_walk_forward(config, out_dir=out, progress=False)
    seconds = time.perf_counter() - started
    return seconds, [w.metrics()["sharpe"] for w in result.windows]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "walk_forward_tiny.yaml"))
    parser.add_argument("--end", default="2019-06-30", help="windows.end (more windows)")
    parser.add_argument("--timesteps", type=int, default=2000, help="trainer steps per window")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="best of N (sequential, warm)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)

    import ray

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="wf-bench-") as tmp:
        root = Path(tmp)

        def config(executor: str, name: str) -> WalkForwardConfig:
            return load_walk_forward_config(
                args.config,
                [
                    f"windows.end={args.end}",
                    f"trainer.total_timesteps={args.timesteps}",
                    "record=false",
                    f"registry={root / name / 'models'}",
                    f"executor={executor}",
                    f"workers={args.workers}",
                    "torch_threads=1",
                    *args.overrides,
                ],
            )

        load_before = os.getloadavg()
        _timed(config("local", "warm-up"), root / "warm-up")  # one-off imports, untimed
        seq = [_timed(config("local", f"seq{i}"), root / f"seq{i}") for i in range(args.repeats)]
        cold_s, cold_sharpe = _timed(config("ray", "cold"), root / "cold")

        init_started = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        try:
            _timed(config("ray", "ray-warm-up"), root / "ray-warm-up")  # every worker imports
            init_s = time.perf_counter() - init_started
            warm = [
                _timed(config("ray", f"warm{i}"), root / f"warm{i}") for i in range(args.repeats)
            ]
        finally:
            ray.shutdown()
        load_after = os.getloadavg()

    seq_s, seq_sharpe = min(seq)
    warm_s, _ = min(warm)
    figures = {
        "windows": len(seq_sharpe),
        "timesteps_per_window": args.timesteps,
        "workers": args.workers,
        "sequential_seconds": round(seq_s, 2),
        "ray_cold_seconds": round(cold_s, 2),
        "ray_warm_seconds": round(warm_s, 2),
        "ray_start_and_warm_up_seconds": round(init_s, 2),
        "repeats": args.repeats,
        "speedup_cold": round(seq_s / cold_s, 3),
        "speedup_warm": round(seq_s / warm_s, 3),
        "identical_sharpe": all(r[1] == seq_sharpe for r in [*seq, *warm])
        and cold_sharpe == seq_sharpe,
        "sharpe": seq_sharpe,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
    }
    print(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
