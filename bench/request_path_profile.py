"""Python time per decision on the request path, in process, with cProfile's top entries.

Runs ``DecisionStep`` exactly as the server does (parsed ``AllocateBatchRequest`` /
``AllocateRequest`` in, the answers' bytes out), against an in-memory state store and a real
``Recorder`` (SQLite, queued acknowledgement, its writer not started: the records are built and
queued as on the request path; between rounds, untimed, the queue is emptied as the server's
writer thread would empty it, so the garbage collector does not walk an ever-growing queue).
Every round sends new request ids for the same portfolios, so each decision continues a state,
as under steady load. Phases:

- ``batch``: ``allocate_batch`` of ``--batch`` portfolios of ``--assets`` assets, then the
  response's bytes (gRPC serializes it);
- ``single``: ``allocate`` of one portfolio of ``--assets`` assets, then its bytes;
- ``single_small``: the same for a portfolio of ``--small-assets`` assets.

Each phase is timed without the profiler (best of ``--repeat`` runs of ``--rounds`` rounds;
wall-clock and process CPU time, the latter steadier on a machine shared with other work), then
profiled once; ``top`` lists cProfile's entries by own time (``tottime``), per decision.

The model: ``--registry DIR`` (an exported model, e.g. the one ``serve_latency.py`` trains),
else a synthetic policy + ICM of the demo shape (``--assets`` slots, window 30) written with
``onnx.helper``, which costs less per ONNX call than a trained MLP but the same in Python.
Run: ``.venv/bin/python bench/request_path_profile.py``; prints JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def synthetic_registry(directory: Path, assets: int, window: int) -> Path:
    """A policy and ICM of the demo's shape, as the test suite builds them (no training)."""
    sys.path.insert(0, str(ROOT))
    from tests.serving import Spec
    from tests.serving.conftest import write_tiny_model

    write_tiny_model(directory / "bench" / "1", Spec(max_assets=assets, window=window))
    return directory


def make_request(pb: Any, rng: np.random.Generator, pid: str, rid: str, n: int, per: int) -> Any:
    prices = 100.0 * np.exp(rng.normal(0.0, 0.01, size=(n, per)).cumsum(axis=1))
    weights = rng.dirichlet(np.ones(n + 1))
    return pb.AllocateRequest(
        portfolio_id=pid,
        request_id=rid,
        asset_ids=[f"A{i}" for i in range(n)],
        prices=prices.ravel().tolist(),
        current_weights=weights.tolist(),
    )


Phase = tuple[Callable[[int], bytes], Callable[[bytes], int]]
"""(the wire bytes of round k, not timed; what the server does with them -> decisions)."""


def measure(phase: Phase, rounds: int, repeat: int, top: int) -> dict[str, Any]:
    """us per decision (best of ``repeat``), then one profiled pass and its top entries."""
    prepare, run = phase
    run(prepare(-1))  # warm up: imports, first states, onnxruntime's first call
    best = cpu_best = float("inf")
    k = 0
    for _ in range(repeat):
        elapsed = cpu = 0.0
        decisions = 0
        for _ in range(rounds):
            wire = prepare(k)
            k += 1
            t0, c0 = time.perf_counter(), time.process_time()
            decisions += run(wire)
            elapsed += time.perf_counter() - t0
            cpu += time.process_time() - c0
        best = min(best, elapsed / decisions)
        cpu_best = min(cpu_best, cpu / decisions)
    profiler = cProfile.Profile()
    profiled = 0
    for _ in range(rounds):
        wire = prepare(k)
        k += 1
        profiler.enable()
        profiled += run(wire)
        profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).name}:{line}" if line else file
        rows.append((tottime, cumtime, calls, f"{where}({name})"))
    rows.sort(reverse=True)
    return {
        "us_per_decision": round(best * 1e6, 2),
        "cpu_us_per_decision": round(cpu_best * 1e6, 2),  # steadier on a shared machine
        "profiled_us_per_decision": round(
            sum(r[0] for r in rows) / profiled * 1e6, 2
        ),  # inflated by cProfile's own overhead
        "top": [
            {
                "function": f,
                "tottime_us_per_decision": round(t / profiled * 1e6, 2),
                "cumtime_us_per_decision": round(c / profiled * 1e6, 2),
                "calls_per_decision": round(n / profiled, 3),
            }
            for t, c, n, f in rows[:top]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--registry", type=Path, help="an exported-model registry (NAME/VERSION)")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--assets", type=int, default=20)
    parser.add_argument("--small-assets", type=int, default=4)
    parser.add_argument("--window", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=8, help="batches per timed run")
    parser.add_argument("--single-rounds", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()

    from allocator.recording.recorder import Recorder
    from allocator.serving import load_model
    from allocator.serving.proto.v1 import allocator_pb2 as pb
    from allocator.serving.server import _model_record
    from allocator.serving.state import MemoryStateStore
    from allocator.serving.step import DecisionStep

    with tempfile.TemporaryDirectory() as tmp:
        root = args.registry or synthetic_registry(Path(tmp) / "registry", args.assets, 30)
        model_dir = next(p for p in sorted(root.glob("*/*")) if (p / "manifest.json").exists())
        model = load_model(model_dir, prefer_cuda=False)
        per = model.prices_per_asset
        recorder = Recorder(f"sqlite:///{tmp}/bench.db", Path(tmp) / "spool", ack="queued")
        recorder.register_model(_model_record(model))
        step = DecisionStep(MemoryStateStore(), recorder)

        def resolve(name: str | None, version: str | None) -> Any:
            return model

        rng = np.random.default_rng(0)
        batches = [
            pb.AllocateBatchRequest(
                requests=[
                    make_request(pb, rng, f"p{i}", "", args.assets, per) for i in range(args.batch)
                ]
            )
            for _ in range(4)
        ]

        def written() -> None:
            recorder._queue.clear()  # what the (not started) writer thread would have taken

        def batch_wire(k: int) -> bytes:
            written()
            batch = batches[k % len(batches)]
            for i, r in enumerate(batch.requests):
                r.request_id = f"b{k}-{i}"
            return batch.SerializeToString()

        def batch_round(wire: bytes) -> int:
            parsed = pb.AllocateBatchRequest.FromString(wire)  # what gRPC's handler does
            answers = step.allocate_batch(parsed, resolve)
            pb.AllocateBatchResponse(responses=[a.response for a in answers]).SerializeToString()
            return len(answers)

        def single(n: int, pid: str) -> Phase:
            request = make_request(pb, rng, pid, "", n, per)

            def wire(k: int) -> bytes:
                if k % 100 == 0:
                    written()
                request.request_id = f"{pid}-{k}"
                return request.SerializeToString()

            def one(data: bytes) -> int:
                parsed = pb.AllocateRequest.FromString(data)
                step.allocate(parsed, resolve).response.SerializeToString()
                return 1

            return wire, one

        out = {
            "command": " ".join(["bench/request_path_profile.py", *sys.argv[1:]]),
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
            "model": f"{model.name}/{model.version}",
            "assets": args.assets,
            "prices_per_asset": per,
            "batch": measure((batch_wire, batch_round), args.rounds, args.repeat, args.top)
            | {"size": args.batch},
            "single": measure(single(args.assets, "s"), args.single_rounds, args.repeat, args.top),
            "single_small": measure(
                single(args.small_assets, "t"), args.single_rounds, args.repeat, args.top
            )
            | {"assets": args.small_assets},
        }
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
