"""Latency and throughput of ``allocator serve`` with recording to Postgres on.

The server runs as its own process (``allocator serve``, CPU provider, Postgres recording) and
the load generator as another, both on 127.0.0.1. Phases, each ``--duration`` seconds:

- closed loop at concurrency 1, 8 and 32 (threads each sending the next call when the last
  one returns): P50/P95/P99 and the achieved rate;
- an open-loop sweep: calls issued at fixed rates whatever the answers do, latency measured
  from the scheduled send time (so a stall is not hidden by the generator waiting on it);
- the batch call: ``AllocateBatch`` of ``--batch-size`` portfolios in a loop, decisions/s.

Every call uses a new request id (a reused one would be answered from the portfolio's state).
At the end the server is stopped with SIGTERM and the decisions table is counted: it must
hold every decision answered OK. Prints JSON.

The model: ``--registry`` if given, else a TD3 policy of the demo config's size (20 assets,
window 30, [128, 128]) trained for a few hundred steps and exported, which costs as much per
call as a fully trained one. Run: ``.venv/bin/python bench/serve_latency.py``.

``--model shared`` trains the shared demo config instead (``configs/td3_shared_demo.yaml``: one
per-asset network of hidden size 64, asset_v1 features, the anchor tilt, 20 training slots),
whose graph has a dynamic asset axis and serves up to the manifest's ``max_served_assets``. Its
phases are closed loops (``--concurrency``, default 1) with requests of each ``--assets`` size
(default 20 and 60), each carrying the closes the model's history needs (ListModels' window
+ 1). A ``--registry`` holding a shared model runs the same phases.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


CONFIGS = {"mlp": "td3_demo.yaml", "shared": "td3_shared_demo.yaml"}
"""The config each ``--model`` trains: the flat MLP demo, or the shared (per-asset) demo."""


def build_registry(directory: Path, model: str = "mlp") -> Path:
    """Train a demo config briefly and export it: a real, full-size exported policy (a shared
    one gets the export's default ``max_served_assets``)."""
    from allocator.trainer.export.run import export_run
    from allocator.trainer.training.config import load_config
    from allocator.trainer.training.run import train

    config = load_config(
        ROOT / "configs" / CONFIGS[model],
        [
            "total_timesteps=300",
            "algorithm.learning_starts=100",
            "progress_bar=false",
            "torch_threads=1",
        ],
    )
    run = train(config, directory / "run")
    registry = directory / "registry"
    export_run(run.run_dir, registry, name="bench", version="1", n_parity=50)
    return registry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentiles(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"p50_ms": float("nan"), "p95_ms": float("nan"), "p99_ms": float("nan")}
    p50, p95, p99 = np.percentile(np.asarray(latencies) * 1e3, [50, 95, 99])
    return {"p50_ms": round(p50, 3), "p95_ms": round(p95, 3), "p99_ms": round(p99, 3)}


# --- the load generator (its own process) ------------------------------------------------


def _requests(
    n_portfolios: int, assets: int, window: int, seed: int = 0, prefix: str = "bench"
) -> list[Any]:
    from allocator.serving.proto.v1 import allocator_pb2 as pb

    rng = np.random.default_rng(seed)
    ids = [f"A{i:02d}" for i in range(assets)]
    out = []
    for p in range(n_portfolios):
        prices = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, (assets, window + 1)), axis=1))
        out.append(
            pb.AllocateRequest(
                portfolio_id=f"{prefix}-{p}", asset_ids=ids, prices=prices.ravel().tolist()
            )
        )
    return out


def run_phase(target: str, phase: dict[str, Any]) -> dict[str, Any]:
    """One phase of load against ``target``; returns latencies summarised and counts."""
    import grpc

    from allocator.serving.proto.v1 import allocator_pb2 as pb
    from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc

    options = [
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.max_receive_message_length", 64 << 20),
    ]
    channel = grpc.insecure_channel(target, options=options)
    stub = pb_grpc.AllocatorStub(channel)
    kind, duration, tag = phase["kind"], phase["duration"], phase["tag"]
    prefix = phase.get("prefix", "bench")  # its own portfolios when the asset count differs
    templates = _requests(phase["portfolios"], phase["assets"], phase["window"], prefix=prefix)
    codes: dict[str, int] = {}
    lock = threading.Lock()
    latencies: list[float] = []

    def count(code: str) -> None:
        with lock:
            codes[code] = codes.get(code, 0) + 1

    if kind == "closed":

        def worker(w: int) -> None:
            local: list[float] = []
            i = 0
            end = time.perf_counter() + duration
            while time.perf_counter() < end:
                request = pb.AllocateRequest()
                request.CopyFrom(templates[(w * 7919 + i) % len(templates)])
                request.request_id = f"{tag}-{w}-{i}"
                t0 = time.perf_counter()
                try:
                    stub.Allocate(request, timeout=5)
                    count("OK")
                except grpc.RpcError as exc:
                    count(exc.code().name)
                local.append(time.perf_counter() - t0)
                i += 1
            with lock:
                latencies.extend(local)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(phase["concurrency"])]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        calls = len(latencies)
        return {
            "phase": f"closed_c{phase['concurrency']}{phase.get('suffix', '')}",
            "concurrency": phase["concurrency"],
            "calls": calls,
            "req_per_s": round(calls / elapsed, 1),
            "codes": codes,
            **percentiles(latencies),
        }

    if kind == "open":
        rate = phase["rate"]
        n = int(rate * duration)
        done = threading.Semaphore(0)
        start = time.perf_counter() + 0.05

        def finished(scheduled: float, future: Any) -> None:
            latency = time.perf_counter() - scheduled
            code = future.code()
            count(code.name if code is not None else "OK")
            with lock:
                latencies.append(latency)
            done.release()

        for i in range(n):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            request = pb.AllocateRequest()
            request.CopyFrom(templates[i % len(templates)])
            request.request_id = f"{tag}-{i}"
            future = stub.Allocate.future(request, timeout=5)
            future.add_done_callback(lambda f, s=scheduled: finished(s, f))
        issued_for = time.perf_counter() - start
        for _ in range(n):
            done.acquire(timeout=10)
        elapsed = time.perf_counter() - start
        return {
            "phase": f"open_{rate}",
            "target_req_per_s": rate,
            "issued_req_per_s": round(n / issued_for, 1),
            "achieved_req_per_s": round(codes.get("OK", 0) / elapsed, 1),
            "calls": n,
            "codes": codes,
            **percentiles(latencies),
        }

    # batch
    size = phase["batch_size"]
    i = 0
    decisions = 0
    start = time.perf_counter()
    while time.perf_counter() - start < duration:
        batch = pb.AllocateBatchRequest()
        for k in range(size):
            item = batch.requests.add()
            item.CopyFrom(templates[k % len(templates)])
            item.request_id = f"{tag}-{i}-{k}"
        t0 = time.perf_counter()
        try:
            stub.AllocateBatch(batch, timeout=30)
            count("OK")
            decisions += size
        except grpc.RpcError as exc:
            count(exc.code().name)
        latencies.append(time.perf_counter() - t0)
        i += 1
    elapsed = time.perf_counter() - start
    return {
        "phase": f"batch_{size}",
        "batch_size": size,
        "calls": i,
        "decisions_per_s": round(decisions / elapsed, 1),
        "codes": codes,
        **percentiles(latencies),
    }


# --- orchestration -----------------------------------------------------------------------


def _wait_serving(target: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    from allocator.serving.client import AllocatorClient

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with AllocatorClient(target, timeout=1) as client:
                if client.is_serving():
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the server at {target} did not become SERVING in {timeout} s")


def _phases(
    args: argparse.Namespace, shared: bool, max_assets: int, window: int
) -> list[dict[str, Any]]:
    """The flat model's closed, open and batch phases at its full width; for a shared model,
    closed loops at each requested asset count, each with portfolios of its own."""
    base = {"duration": args.duration, "portfolios": args.portfolios, "window": window}
    if shared:
        return [
            {
                "kind": "closed",
                "concurrency": int(c),
                **base,
                "assets": int(n),
                "prefix": f"bench-a{n}",
                "suffix": f"_a{n}",
            }
            for n in args.assets.split(",")
            for c in args.concurrency.split(",")
        ]
    common = {**base, "assets": max_assets}
    phases: list[dict[str, Any]] = [
        {"kind": "closed", "concurrency": int(c), **common} for c in args.concurrency.split(",")
    ]
    phases += [{"kind": "open", "rate": int(r), **common} for r in args.rates.split(",")]
    phases.append({"kind": "batch", "batch_size": args.batch_size, **common})
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", type=Path, default=None)
    parser.add_argument(
        "--model",
        choices=sorted(CONFIGS),
        default=None,
        help="what to train without --registry (default mlp); with it, the manifest decides",
    )
    parser.add_argument(
        "--assets", default="20,60", help="shared model: assets per request, one phase each"
    )
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--concurrency", default=None, help="default 1,8,32 (shared: 1)")
    parser.add_argument("--rates", default="500,1000,2000,2500,3000")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--portfolios", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=16, help="server handler threads")
    parser.add_argument("--budget-ms", type=float, default=10.0)
    args = parser.parse_args()

    import psycopg

    from allocator.artifacts.manifest import read_manifest
    from allocator.recording.migrations import upgrade
    from allocator.registry.versions import resolve
    from allocator.serving.client import AllocatorClient

    tmp = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    setup = time.perf_counter()
    registry = args.registry or build_registry(tmp, args.model or "mlp")
    name = sorted(p.name for p in registry.iterdir() if p.is_dir())[0]
    manifest = read_manifest(resolve(registry, name))
    spec = manifest.feature_spec
    shared = manifest.policy.kind == "shared"
    if args.model is not None and args.model != manifest.policy.kind:
        parser.error(f"--model {args.model}, but {registry} holds a {manifest.policy.kind} model")
    if args.concurrency is None:
        args.concurrency = "1" if shared else "1,8,32"
    if shared and max(int(n) for n in args.assets.split(",")) > manifest.served_asset_limit:
        parser.error(f"--assets {args.assets}: the model serves {manifest.served_asset_limit}")
    db = f"allocator_bench_{secrets.token_hex(4)}"
    with psycopg.connect(args.postgres, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
    info = psycopg.conninfo.conninfo_to_dict(args.postgres)
    user, host = info.get("user", "postgres"), info.get("host", "127.0.0.1")
    url = f"postgresql+psycopg://{user}@{host}:{info.get('port', 5432)}/{db}"
    results: list[dict[str, Any]] = []
    rows = -1
    served: Any = None
    try:
        upgrade(url)
        port = free_port()
        target = f"127.0.0.1:{port}"
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "allocator.cli",
                "serve",
                "--registry",
                str(registry),
                "--port",
                str(port),
                "--metrics-port",
                "0",
                "--database-url",
                url,
                "--spool-dir",
                str(tmp / "spool"),
                "--cpu",
                "--latency-budget-ms",
                str(args.budget_ms),
                "--max-concurrent-rpcs",
                "512",
                "--workers",
                str(args.workers),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "server.log", "wb"),  # noqa: SIM115  (lives as long as the server)
        )
        try:
            _wait_serving(target, server)
            setup = time.perf_counter() - setup
            with AllocatorClient(target, timeout=10) as client:  # what a client is told to send
                served = next(m for m in client.list_models() if m.name == name)
            phases = _phases(args, shared, served.max_assets, served.window)
            ctx = mp.get_context("spawn")
            with ctx.Pool(1) as pool:
                for k, phase in enumerate(phases):
                    phase["tag"] = f"p{k}"
                    result = pool.apply(run_phase, (target, phase))
                    if shared:
                        result["assets"] = phase["assets"]
                    results.append(result)
                    time.sleep(0.5)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(120)
        with psycopg.connect(url.replace("+psycopg", "")) as conn:
            rows = conn.execute("SELECT count(*) FROM decisions").fetchone()[0]
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    ok = 0
    for r in results:
        size = r.get("batch_size", 1)
        ok += r["codes"].get("OK", 0) * size
    model: dict[str, Any] = {"max_assets": spec.max_assets, "window": spec.window}
    if shared:
        model = {
            "policy": "shared",
            "hidden": manifest.policy.hidden,
            "features": spec.kind,
            "training_slots": spec.max_assets,
            "max_served_assets": served.max_assets,
            "closes_per_asset": served.window + 1,
        }
    machine = f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}"
    print(
        json.dumps(
            {
                "benchmark": "serve_latency",
                "model": model,
                "recording": "postgresql",
                "phases": results,
                "ok_decisions": ok,
                "recorded_rows": rows,
                "server_exit_code": server.returncode,
                "setup_seconds": round(setup, 1),
                "machine": machine,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
