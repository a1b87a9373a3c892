"""Latency and throughput of ``allocator serve``, beside the bare server it must stay close to.

One run starts, side by side on 127.0.0.1, ``bench/bare_server.py`` (grpcio + onnxruntime doing
only the model call, on the same ``model.onnx``) and one ``allocator serve`` per database in
``--databases`` (the embedded SQLite default and Postgres, each recording every decision) and
acknowledgement mode in ``--acks`` (durable and queued, each on its own database and spool,
named ``DATABASE-ACK``), and drives them all from a pool of ``--clients`` load-generator
processes with the stubs generated from ``proto/`` (``bench/load.py``: a closed loop's threads
and an open loop's rate are shared out over the processes, and each phase reports
``generator_cpu``, the cores its busiest generator process used, so a generator that was the
bottleneck shows; ``server_cpu`` is the cores the server under test used, which at a light
open-loop rate such as 150 calls/s shows whether anything in it spins). Phases, each
``--duration`` seconds:

- compared with the bare server, ``--rounds`` rounds with the servers interleaved inside each
  round (so a drift in the machine's speed hits all of them alike): closed loops at
  concurrency 1, 8 and 64 (threads each sending the next call when the last one returns), the
  batch call (``AllocateBatch`` of ``--batch-size`` portfolios in a loop) and the streaming
  call (one ``AllocateStream`` whose messages each carry ``--stream-size`` portfolios,
  ``--in-flight`` messages sent ahead of their answers; its latency is a message's, from its
  send to its answer);
- Allocator's own: an open-loop sweep (calls issued at fixed rates whatever the answers do,
  latency measured from the scheduled send time, so a stall is not hidden by the generator
  waiting on it).

With ``--acks durable`` alone the servers are named by their database only.

``--workers-list 1,2`` runs one ``allocator serve`` per database, ack mode and ``--workers``
count (named ``DATABASE-wN``, or ``DATABASE-ACK-wN``), all keeping smoothing state in Redis
(``--redis-url``; several workers need a shared store, and the one-process server uses it too so
that the figures compare), beside the same bare server. ``--channels`` opens that many
connections per load phase (calls spread over them): the kernel spreads a multi-process
server's connections, not its calls, so one connection would reach one worker.

``--bare-aio`` adds the same bare server on ``grpc.aio`` (``bare_server.py --aio``), compared
with ``bare`` like a database: what the asyncio server costs before any of Allocator's work.

``comparison`` gives, per compared phase and database, the medians over rounds and their
ratios to the bare server's (P50, P95, rate). Every call uses a new request id (a reused one
would be answered from the portfolio's state). At the end every server is stopped with SIGTERM
and each database's decisions table is counted: it must hold every decision answered OK
(``recording``). Prints JSON.

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
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from load import merge_parts, run_phase, split_phase  # noqa: E402  (bench/ is not a package)
from servers import (  # noqa: E402
    CONFIGS,
    Servers,
    build_registry,
    cpu_seconds,
    wait_serving,
)

BARE = "bare"
"""The target name of ``bench/bare_server.py``; the others are named by their database."""
BARE_AIO = "bare-aio"
"""``--bare-aio``: the same bare server on ``grpc.aio``, compared with ``bare`` like a database."""


def _phases(
    args: argparse.Namespace, shared: bool, max_assets: int, window: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(phases run against every server, round by round, for the ratios; phases run against
    Allocator's servers only). A flat model: closed loops at its full width, the batch call
    and the stream are compared, the open-loop sweep is Allocator's own. A shared model:
    closed loops at each requested asset count, each with portfolios of its own, all
    compared."""
    base = {
        "duration": args.duration,
        "portfolios": args.portfolios,
        "window": window,
        "channels": args.channels,
    }
    if shared:
        compared = [
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
        return compared, []
    common = {**base, "assets": max_assets}
    compared = [
        {"kind": "closed", "concurrency": int(c), **common} for c in args.concurrency.split(",")
    ]
    compared.append({"kind": "batch", "batch_size": args.batch_size, **common})
    stream = {"batch_size": args.stream_size or args.batch_size, "in_flight": args.in_flight}
    compared.append({"kind": "stream", **stream, **common})
    own = [{"kind": "open", "rate": int(r), **common} for r in args.rates.split(",") if r]
    return compared, own


def _summary(results: list[dict[str, Any]], databases: list[str]) -> list[dict[str, Any]]:
    """Per compared phase and database: the median over rounds of P50, P95 and rate, and their
    ratios to the bare server's medians (latency ratio > 1: Allocator is slower)."""
    out = []
    for phase in dict.fromkeys(r["phase"] for r in results if r["server"] == BARE):

        def median(server: str, key: str, phase: str = phase) -> float:
            values = [r[key] for r in results if r["server"] == server and r["phase"] == phase]
            return round(float(np.median(values)), 3)

        rate = "decisions_per_s" if phase.startswith(("batch", "stream")) else "req_per_s"
        bare = {k: median(BARE, k) for k in ("p50_ms", "p95_ms", rate)}
        for db in databases:
            ours = {k: median(db, k) for k in ("p50_ms", "p95_ms", rate)}
            out.append(
                {
                    "phase": phase,
                    "database": db,
                    "bare": bare,
                    "allocator": ours,
                    "p50_ratio": round(ours["p50_ms"] / bare["p50_ms"], 2),
                    "p95_ratio": round(ours["p95_ms"] / bare["p95_ms"], 2),
                    "rate_ratio": round(ours[rate] / bare[rate], 2),
                }
            )
    return out


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
    parser.add_argument(
        "--databases",
        default="sqlite,postgresql",
        help="one Allocator server recording to each (comma-separated: sqlite, postgresql)",
    )
    parser.add_argument(
        "--acks",
        default="durable,queued",
        help="one server per database and --ack mode (comma-separated: durable, queued)",
    )
    parser.add_argument(
        "--batch-window-ms", type=float, default=None, help="the servers' batch window"
    )
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    parser.add_argument(
        "--rounds", type=int, default=2, help="compared phases: rounds, servers interleaved"
    )
    parser.add_argument("--concurrency", default=None, help="default 1,8,64 (shared: 1)")
    parser.add_argument(
        "--clients", type=int, default=4, help="load-generator processes (closed and open loops)"
    )
    parser.add_argument("--rates", default="150,500,1000,2000,2500,3000")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument(
        "--stream-size", type=int, default=None, help="portfolios per stream message (batch size)"
    )
    parser.add_argument("--in-flight", type=int, default=4, help="stream messages sent ahead")
    parser.add_argument("--portfolios", type=int, default=1000)
    parser.add_argument(
        "--threads",
        type=int,
        default=16,
        help="the bare server's handler threads (the servers': state-store threads)",
    )
    parser.add_argument(
        "--workers-list",
        default="1",
        help="one Allocator server per --workers count (comma-separated; e.g. 1,2)",
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--channels", type=int, default=1, help="connections per load phase")
    parser.add_argument("--budget-ms", type=float, default=10.0)
    parser.add_argument(
        "--bare-aio",
        action="store_true",
        help="also run the bare server on grpc.aio (the asyncio server's own cost)",
    )
    args = parser.parse_args()
    databases = [d for d in args.databases.split(",") if d]
    unknown = sorted(set(databases) - {"sqlite", "postgresql"})
    if unknown or not databases:
        parser.error(f"--databases: unknown {unknown}; choose from sqlite, postgresql")
    acks = [a for a in args.acks.split(",") if a]
    if not acks or set(acks) - {"durable", "queued"}:
        parser.error(f"--acks {args.acks}: choose from durable, queued")
    workers_list = [int(n) for n in args.workers_list.split(",") if n]
    if not workers_list or min(workers_list) < 1:
        parser.error(f"--workers-list {args.workers_list}: counts >= 1")
    # One server per (database, ack, workers); named by the database alone in the default run.
    ack_of: dict[str, str] = {}
    workers_of: dict[str, int] = {}
    for db in databases:
        for ack in acks:
            for n in workers_list:
                name = db if acks == ["durable"] else f"{db}-{ack}"
                name += "" if workers_list == [1] else f"-w{n}"
                ack_of[name], workers_of[name] = ack, n
    shared_state = () if workers_list == [1] else ("--redis-url", args.redis_url)

    import psycopg

    from allocator.artifacts.manifest import read_manifest
    from allocator.recording.migrations import upgrade
    from allocator.registry.layout import MODEL_FILE
    from allocator.registry.versions import resolve
    from allocator.serving.client import AllocatorClient

    tmp = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    setup = time.perf_counter()
    registry = args.registry or build_registry(tmp, args.model or "mlp")
    name = sorted(p.name for p in registry.iterdir() if p.is_dir())[0]
    version_dir = resolve(registry, name)
    manifest = read_manifest(version_dir)
    spec = manifest.feature_spec
    shared = manifest.policy.kind == "shared"
    if args.model is not None and args.model != manifest.policy.kind:
        parser.error(f"--model {args.model}, but {registry} holds a {manifest.policy.kind} model")
    if args.concurrency is None:
        args.concurrency = "1" if shared else "1,8,64"
    if shared and max(int(n) for n in args.assets.split(",")) > manifest.served_asset_limit:
        parser.error(f"--assets {args.assets}: the model serves {manifest.served_asset_limit}")
    token = secrets.token_hex(4)
    urls: dict[str, str] = {}
    pg_dbs: dict[str, str] = {}
    info = psycopg.conninfo.conninfo_to_dict(args.postgres)
    user, host = info.get("user", "postgres"), info.get("host", "127.0.0.1")
    for server in ack_of:
        if server.startswith("sqlite"):
            urls[server] = f"sqlite:///{tmp / f'decisions-{server}.db'}"
            continue
        pg_dbs[server] = f"allocator_bench_{token}_{len(pg_dbs)}"
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{pg_dbs[server]}"')
        port = info.get("port", 5432)
        urls[server] = f"postgresql+psycopg://{user}@{host}:{port}/{pg_dbs[server]}"
    results: list[dict[str, Any]] = []
    rows: dict[str, int] = {}
    served: Any = None
    servers = Servers(tmp)
    exit_codes: dict[str, int | None] = {}
    try:
        for url in urls.values():
            upgrade(url)
        bare = [sys.executable, str(ROOT / "bench" / "bare_server.py")]
        bare += ["--model", str(version_dir / MODEL_FILE)]
        servers.start(BARE, [*bare, "--threads", str(args.threads)])
        if args.bare_aio:
            servers.start(BARE_AIO, [*bare, "--aio"])
        window = args.batch_window_ms
        for db, url in urls.items():
            servers.start(
                db,
                [
                    *(sys.executable, "-m", "allocator.cli", "serve"),
                    *("--registry", str(registry), "--metrics-port", "0"),
                    *("--database-url", url, "--spool-dir", str(tmp / f"spool-{db}"), "--cpu"),
                    *("--ack", ack_of[db]),
                    *(() if window is None else ("--batch-window-ms", str(window))),
                    *("--latency-budget-ms", str(args.budget_ms)),
                    *("--max-concurrent-rpcs", "512", "--threads", str(args.threads)),
                    *("--workers", str(workers_of[db]), *shared_state),
                ],
            )
        try:
            for server, target in servers.targets.items():
                wait_serving(target, servers.processes[server])
            setup = time.perf_counter() - setup
            with AllocatorClient(servers.targets[next(iter(urls))], timeout=10) as client:
                served = next(m for m in client.list_models() if m.name == name)
            compared, own = _phases(args, shared, served.max_assets, served.window)
            ctx = mp.get_context("spawn")
            k = 0
            with ctx.Pool(args.clients) as pool:

                def run(server: str, phase: dict[str, Any], round_: int) -> None:
                    nonlocal k
                    phase = {**phase, "tag": f"p{k}"}
                    k += 1
                    target = servers.targets[server]
                    parts = split_phase(phase, args.clients, time.time() + 0.2)
                    pid = servers.processes[server].pid
                    cpu, began = cpu_seconds(pid), time.perf_counter()
                    result = merge_parts(pool.starmap(run_phase, [(target, p) for p in parts]))
                    # the server's cores over the phase (with the 0.2 s start, a little low)
                    result["server_cpu"] = round(
                        (cpu_seconds(pid) - cpu) / (time.perf_counter() - began), 2
                    )
                    result |= {"server": server, "round": round_}
                    if shared:
                        result["assets"] = phase["assets"]
                    results.append(result)
                    time.sleep(0.3)

                for phase in compared:
                    for round_ in range(args.rounds):
                        for server in servers.targets:
                            run(server, phase, round_)
                for phase in own:
                    for db in urls:
                        run(db, phase, 0)
        finally:
            exit_codes = servers.stop()
        for db, url in urls.items():
            count = "SELECT count(*) FROM decisions"
            if db in pg_dbs:
                with psycopg.connect(url.replace("+psycopg", "")) as conn:
                    rows[db] = conn.execute(count).fetchone()[0]
            else:
                with sqlite3.connect(tmp / f"decisions-{db}.db") as conn:
                    rows[db] = conn.execute(count).fetchone()[0]
    finally:
        for pg_db in pg_dbs.values():
            with psycopg.connect(args.postgres, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)')
    recording = {}
    for db in urls:
        ok = sum(
            r["codes"].get("OK", 0) * r.get("batch_size", 1) for r in results if r["server"] == db
        )
        recording[db] = {
            "ok_decisions": ok,
            "recorded_rows": rows.get(db, -1),
            "complete": rows.get(db, -1) == ok,
            "server_exit_code": exit_codes.get(db),
            "workers": workers_of[db],
        }
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
                "comparison": _summary(results, [*urls, *([BARE_AIO] if args.bare_aio else [])]),
                "clients": args.clients,
                "recording": recording,
                "phases": results,
                "bare_server_exit_code": exit_codes.get(BARE),
                **({"bare_aio_exit_code": exit_codes.get(BARE_AIO)} if args.bare_aio else {}),
                "setup_seconds": round(setup, 1),
                "machine": machine,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
