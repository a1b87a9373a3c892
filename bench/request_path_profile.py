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

``--baseline SRC`` measures another source tree too (e.g. ``git archive COMMIT src | tar -x -C
/tmp/base``): each tree runs whole in its own process (``PYTHONPATH``), so any change between
them compares, and the two take turns run by run (``--repeat`` runs each, best kept), so a
change in the machine's load hits both alike. Results: ``this`` and ``baseline``.

The model: ``--registry DIR`` (an exported model, e.g. the one ``serve_latency.py`` trains),
else a synthetic policy + ICM of the demo shape (``--assets`` slots, window 30) written with
``onnx.helper``, which costs less per ONNX call than a trained MLP but the same in Python.
Run: ``.venv/bin/python bench/request_path_profile.py``; prints JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import subprocess
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


def measure(
    phases: dict[str, Phase], rounds: int, repeat: int, top: int
) -> dict[str, dict[str, Any]]:
    """Per variant, us per decision (best of ``repeat``) and one profiled pass's top entries.

    The variants (this tree, and ``--baseline``'s) take turns round by round, so a change in
    the machine's load hits them alike."""
    for prepare, run in phases.values():
        run(prepare(-1))  # warm up: imports, first states, onnxruntime's first call
    wall = {name: [0.0] * repeat for name in phases}
    cpu = {name: [0.0] * repeat for name in phases}
    decisions = {name: [0] * repeat for name in phases}
    k = 0
    for r in range(repeat):
        for _ in range(rounds):
            for name, (prepare, run) in phases.items():
                wire = prepare(k)
                t0, c0 = time.perf_counter(), time.process_time()
                decisions[name][r] += run(wire)
                wall[name][r] += time.perf_counter() - t0
                cpu[name][r] += time.process_time() - c0
            k += 1
    out: dict[str, dict[str, Any]] = {}
    for name, (prepare, run) in phases.items():
        profiler = cProfile.Profile()
        profiled = 0
        for _ in range(rounds):
            wire = prepare(k)
            k += 1
            profiler.enable()
            profiled += run(wire)
            profiler.disable()
        out[name] = _summary(wall[name], cpu[name], decisions[name], profiler, profiled, top)
    return out


def _summary(
    wall: list[float],
    cpu: list[float],
    decisions: list[int],
    profiler: cProfile.Profile,
    profiled: int,
    top: int,
) -> dict[str, Any]:
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).name}:{line}" if line else file
        rows.append((tottime, cumtime, calls, f"{where}({name})"))
    rows.sort(reverse=True)
    return {
        "us_per_decision": round(min(w / n for w, n in zip(wall, decisions, strict=True)) * 1e6, 2),
        "cpu_us_per_decision": round(
            min(c / n for c, n in zip(cpu, decisions, strict=True)) * 1e6, 2
        ),
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


def compare(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """This tree and ``args.baseline`` in turns, each run a process of its own (``--repeat 1``);
    per phase the best run's figures."""
    import allocator  # where this tree's package lives: its src/ goes on the path as is

    trees = {"this": Path(allocator.__file__).resolve().parents[1], "baseline": args.baseline}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(args.repeat):
        for name, src in trees.items():
            command = [sys.executable, __file__, *argv, "--repeat", "1"]
            env = {**os.environ, "PYTHONPATH": str(src)}
            done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
            runs[name].append(json.loads(done.stdout))
    out = {k: v for k, v in runs["this"][0].items() if k not in ("this", "command")}
    for name, results in runs.items():
        out[name] = {
            kind: min((r["this"][kind] for r in results), key=lambda f: f["cpu_us_per_decision"])
            for kind in results[0]["this"]
        }
    return out


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
    parser.add_argument(
        "--baseline", type=Path, help="another tree's src/ to run beside this one, in turns"
    )
    args = parser.parse_args()
    if args.baseline is not None:
        argv = [a for a in sys.argv[1:] if a not in ("--baseline", str(args.baseline))]
        out = compare(args, [a for a in argv if not a.startswith("--baseline=")])
        command = " ".join(["bench/request_path_profile.py", *sys.argv[1:]])
        print(json.dumps({"command": command, **out}, indent=2))
        return

    from allocator.recording.recorder import Recorder
    from allocator.serving import load_model
    from allocator.serving import step as this_step
    from allocator.serving.proto.v1 import allocator_pb2 as pb
    from allocator.serving.server import _model_record
    from allocator.serving.state import MemoryStateStore

    variants = {"this": this_step}

    with tempfile.TemporaryDirectory() as tmp:
        root = args.registry or synthetic_registry(Path(tmp) / "registry", args.assets, 30)
        model_dir = next(p for p in sorted(root.glob("*/*")) if (p / "manifest.json").exists())
        model = load_model(model_dir, prefer_cuda=False)
        per = model.prices_per_asset
        recorder = Recorder(f"sqlite:///{tmp}/bench.db", Path(tmp) / "spool", ack="queued")
        recorder.register_model(_model_record(model))

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

        def phases(module: Any, kind: str) -> Phase:
            """One variant's phase: its own ``DecisionStep`` (and store) over the same wire."""
            step = module.DecisionStep(MemoryStateStore(), recorder)
            to_batch = getattr(module, "batch_response", None)  # bytes joined, where it exists

            def batch_round(wire: bytes) -> int:
                parsed = pb.AllocateBatchRequest.FromString(wire)  # what gRPC's handler does
                answers = step.allocate_batch(parsed, resolve)
                if to_batch is not None:
                    response = to_batch(answers)
                else:
                    response = pb.AllocateBatchResponse(responses=[a.response for a in answers])
                response.SerializeToString()
                return len(answers)

            def one(data: bytes) -> int:
                parsed = pb.AllocateRequest.FromString(data)
                step.allocate(parsed, resolve).response.SerializeToString()
                return 1

            return (batch_wire, batch_round) if kind == "batch" else (wires[kind], one)

        def single_wire(n: int, pid: str) -> Callable[[int], bytes]:
            request = make_request(pb, rng, pid, "", n, per)

            def wire(k: int) -> bytes:
                if k % 100 == 0:
                    written()
                request.request_id = f"{pid}-{k}"
                return request.SerializeToString()

            return wire

        wires = {
            "single": single_wire(args.assets, "s"),
            "single_small": single_wire(args.small_assets, "t"),
        }
        rounds = {
            "batch": args.rounds,
            "single": args.single_rounds,
            "single_small": args.single_rounds,
        }
        results = {
            kind: measure(
                {name: phases(module, kind) for name, module in variants.items()},
                rounds[kind],
                args.repeat,
                args.top,
            )
            for kind in ("batch", "single", "single_small")
        }
        out = {
            "command": " ".join(["bench/request_path_profile.py", *sys.argv[1:]]),
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
            "model": f"{model.name}/{model.version}",
            "assets": args.assets,
            "prices_per_asset": per,
            "batch_size": args.batch,
            "small_assets": args.small_assets,
            **{name: {kind: results[kind][name] for kind in results} for name in variants},
        }
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
