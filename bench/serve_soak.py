"""A soak of ``allocator serve``: a steady rate for minutes, its memory and latency by minute.

A server whose memory grows with the number of requests it has answered (rather than with the
portfolios it serves) dies slowly in production and passes every short test. This runs
``allocator serve`` (default settings: in-memory state, durable acknowledgement, recording every
decision to the embedded SQLite default or to ``--database-url``) as its own process, sends it
an open-loop load of ``--rate`` calls a second for ``--minutes`` from this process (each call a
new request id, cycling over ``--portfolios`` portfolios, so the state the server must keep is
bounded), and samples the server's resident memory (``VmRSS``) every ``--sample-seconds``.

Prints JSON: per minute the calls, their codes and P50/P95/P99 (measured from the scheduled
send time, so a stall is not hidden), the RSS samples, and the RSS growth from the end of
minute 2 (after warm-up) to the end; then SIGTERM, and the decisions table counted against the
OK answers. Run: ``.venv/bin/python bench/serve_soak.py --minutes 10 --rate 150``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import make_requests, percentiles
from servers import Servers, build_registry, wait_serving


def rss_bytes(pid: int) -> int:
    """The process's resident set size, from ``/proc`` (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _summary(latencies: list[float], codes: dict[str, int]) -> dict[str, Any]:
    return {"calls": len(latencies), "codes": codes, **percentiles(latencies)}


def soak(
    target: str, pid: int, args: argparse.Namespace, window: int, assets: int
) -> dict[str, Any]:
    """The open-loop load and the RSS sampler; returns the minutes, samples and OK count."""
    import grpc

    from allocator.serving.proto.v1 import allocator_pb2 as pb
    from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(target)
    stub = pb_grpc.AllocatorStub(channel)
    templates = make_requests(args.portfolios, assets, window, prefix="soak")
    minutes = int(args.minutes)
    lock = threading.Lock()
    per_minute: list[tuple[list[float], dict[str, int]]] = [([], {}) for _ in range(minutes)]
    outstanding = threading.Semaphore(0)
    samples: list[dict[str, float]] = []
    start = time.perf_counter() + 0.1
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(
                {"t_s": round(time.perf_counter() - start, 1), "rss_mb": rss_bytes(pid) / 2**20}
            )
            stop.wait(args.sample_seconds)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def finished(scheduled: float, minute: int, future: Any) -> None:
        latency = time.perf_counter() - scheduled
        code = future.code()
        name = code.name if code is not None else "OK"
        with lock:
            latencies, codes = per_minute[minute]
            latencies.append(latency)
            codes[name] = codes.get(name, 0) + 1
        outstanding.release()

    n = int(args.rate * 60 * minutes)
    for i in range(n):
        scheduled = start + i / args.rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        request = pb.AllocateRequest()
        request.CopyFrom(templates[i % len(templates)])
        request.request_id = f"soak-{i}"
        future = stub.Allocate.future(request, timeout=5)
        minute = min(i // int(args.rate * 60), minutes - 1)
        future.add_done_callback(lambda f, s=scheduled, m=minute: finished(s, m, f))
    for _ in range(n):
        outstanding.acquire(timeout=10)
    stop.set()
    sampler.join()
    samples.append({"t_s": round(time.perf_counter() - start, 1), "rss_mb": rss_bytes(pid) / 2**20})
    channel.close()
    table = [
        {"minute": m + 1, **_summary(latencies, codes)}
        for m, (latencies, codes) in enumerate(per_minute)
    ]
    ok = sum(row["codes"].get("OK", 0) for row in table)
    return {"minutes": table, "rss_samples": samples, "ok": ok}


def rss_growth(samples: list[dict[str, float]], after_s: float) -> dict[str, float]:
    """RSS at the first sample at or after ``after_s`` and at the end, and the growth between."""
    later = [s for s in samples if s["t_s"] >= after_s]
    if len(later) < 2:
        return {}
    first, last = later[0]["rss_mb"], later[-1]["rss_mb"]
    return {
        "from_s": later[0]["t_s"],
        "rss_from_mb": round(first, 1),
        "rss_end_mb": round(last, 1),
        "rss_max_mb": round(max(s["rss_mb"] for s in later), 1),
        "growth_pct": round(100 * (last - first) / first, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", type=Path, default=None)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=150.0, help="calls per second")
    parser.add_argument("--portfolios", type=int, default=1000)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=float, default=2.0, help="growth measured after")
    parser.add_argument(
        "--database-url", default=None, help="default: an SQLite file in a temporary folder"
    )
    args = parser.parse_args()
    if args.minutes < 1 or args.rate <= 0:
        parser.error("--minutes must be at least 1 and --rate positive")

    from allocator.recording.migrations import upgrade
    from allocator.serving.client import AllocatorClient

    tmp = Path(tempfile.mkdtemp(prefix="serve-soak-"))
    registry = args.registry or build_registry(tmp)
    url = args.database_url or f"sqlite:///{tmp / 'decisions.db'}"
    upgrade(url)
    servers = Servers(tmp)
    target = servers.start(
        "server",
        [
            *(sys.executable, "-m", "allocator.cli", "serve", "--registry", str(registry)),
            *("--metrics-port", "0", "--cpu"),
            *("--database-url", url, "--spool-dir", str(tmp / "spool")),
        ],
    )
    server = servers.processes["server"]
    try:
        wait_serving(target, server)
        with AllocatorClient(target, timeout=10) as client:
            model = client.list_models()[0]
        result = soak(target, server.pid, args, model.window, model.max_assets)
    finally:
        exit_code = servers.stop()["server"]
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            rows = conn.execute("SELECT count(*) FROM decisions").fetchone()[0]
    else:
        from sqlalchemy import create_engine, text

        engine = create_engine(url)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT count(*) FROM decisions")).scalar_one()
        engine.dispose()
    machine = f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}"
    print(
        json.dumps(
            {
                "benchmark": "serve_soak",
                "rate_per_s": args.rate,
                "portfolios": args.portfolios,
                "database": url.split(":", 1)[0],
                "minutes": result["minutes"],
                "rss_growth_after_warmup": rss_growth(
                    result["rss_samples"], 60 * args.warmup_minutes
                ),
                "rss_samples": [
                    {"t_s": s["t_s"], "rss_mb": round(s["rss_mb"], 1)}
                    for s in result["rss_samples"]
                ],
                "ok_decisions": result["ok"],
                "recorded_rows": rows,
                "server_exit_code": exit_code,
                "machine": machine,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
