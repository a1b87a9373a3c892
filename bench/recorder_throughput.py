"""Sustained decisions per second the recorder commits (21 weights per vector), per database.

For each of ``--backends``: Postgres in a database of its own on the server at ``--postgres``
(dropped afterwards), SQLite in a temporary file; migrates it, then submits ``--decisions``
pre-built records as fast as the recorder accepts them and times from the first submit until
every row is committed (``flush``), with the writer thread's CPU time. Records are built before
the clock starts: the figure is the recorder's (queue, batching, encoding, COPY or INSERT,
commit), not record creation.

Then, unless ``--ack-seconds 0``, what an acknowledgement costs the caller: for Postgres and a
SQLite file, each ``ack`` mode and each ``--ack-concurrency``, threads that each submit one
decision and wait for its ticket (``wait_durable``), in a loop, as the server's handlers do;
P50/P95 of submit-to-acknowledged and decisions/s. Without the server's other work, so this is
the recorder's share of a call's latency. Prints JSON.
Run: ``.venv/bin/python bench/recorder_throughput.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import secrets
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
import sqlalchemy

from allocator.portfolio import CASH_ID
from allocator.recording.migrations import upgrade
from allocator.recording.recorder import Recorder
from allocator.recording.records import DecisionRecord, ModelRecord


def make_records(n: int, assets: int, seed: int = 0, prefix: str = "bench") -> list[DecisionRecord]:
    """``n`` decisions over cash + ``assets`` assets with random weights (distributions)."""
    rng = np.random.default_rng(seed)
    ids = (CASH_ID, *(f"A{i:03d}" for i in range(assets)))
    raw = rng.dirichlet(np.ones(assets + 1), size=n)
    smoothed = rng.dirichlet(np.ones(assets + 1), size=n)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [
        DecisionRecord.create(
            request_id=f"{prefix}-{i}",
            portfolio_id=f"p{i % 1000}",
            decided_at=start + dt.timedelta(microseconds=i),
            model_name="bench",
            model_version="1",
            asset_ids=ids,
            raw_weights=raw[i],
            smoothed_weights=smoothed[i],
            turnover=float(np.abs(raw[i][1:] - smoothed[i][1:]).sum()),
            latency_seconds=0.0004,
            icm_reward=0.1,
        )
        for i in range(n)
    ]


def ack_latency(
    url: str, spool: Path, ack: str, concurrency: int, seconds: float, records: list[DecisionRecord]
) -> dict[str, float | int | str]:
    """``concurrency`` threads, each submitting one decision and waiting for its ticket."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    with Recorder(url, spool, ack=ack) as recorder:
        recorder.register_model(ModelRecord("bench", "1", "td3"))
        stop = time.perf_counter() + seconds

        def caller(k: int) -> None:
            for record in records[k::concurrency]:
                start = time.perf_counter()
                recorder.wait_durable(recorder.submit(record), 10)
                latencies[k].append(time.perf_counter() - start)
                if start > stop:
                    return

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(concurrency)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - began
    ms = np.array([x for lat in latencies for x in lat]) * 1000
    return {
        "ack": ack,
        "concurrency": concurrency,
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p95_ms": round(float(np.percentile(ms, 95)), 3),
        "decisions_per_s": round(len(ms) / elapsed, 1),
    }


def sustain(url: str, args: argparse.Namespace, spool: Path) -> dict[str, float | int]:
    """``args.decisions`` records submitted as fast as the recorder takes them, then flushed:
    decisions/s and the writer thread's CPU time per decision."""
    upgrade(url)
    records = make_records(args.decisions, args.assets)
    recorder = Recorder(url, spool, batch_size=args.batch_size, queue_size=args.decisions + 1)
    recorder.start()
    recorder.register_model(ModelRecord("bench", "1", "td3"))
    writer = next(t for t in threading.enumerate() if t.name == "allocator-recorder")
    assert writer.ident is not None
    clock = time.pthread_getcpuclockid(writer.ident)  # the writer's own CPU time
    before = time.clock_gettime(clock)
    start = time.perf_counter()
    for i in range(0, len(records), args.chunk):
        recorder.submit_many(records[i : i + args.chunk])
    submitted = time.perf_counter() - start
    recorder.flush()
    elapsed = time.perf_counter() - start
    writer_cpu = time.clock_gettime(clock) - before
    stats = recorder.stats()
    recorder.close()
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as conn:
        rows = int(conn.execute(sqlalchemy.text("SELECT count(*) FROM decisions")).scalar_one())
    engine.dispose()
    return {
        "rows_in_table": rows,
        "spooled": stats.spooled_records,
        "seconds": round(elapsed, 3),
        "submit_seconds": round(submitted, 3),
        "decisions_per_s": round(rows / elapsed, 1),
        "writer_cpu_us_per_decision": round(writer_cpu / rows * 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--decisions", type=int, default=100_000)
    parser.add_argument("--backends", default="postgresql,sqlite", help="sustained phases")
    parser.add_argument("--assets", type=int, default=20, help="risky assets (cash added)")
    parser.add_argument("--batch-size", type=int, default=5_000)
    parser.add_argument("--chunk", type=int, default=512, help="records per submit_many call")
    parser.add_argument("--ack-seconds", type=float, default=3.0, help="per ack phase; 0: none")
    parser.add_argument("--ack-concurrency", default="1,8", help="caller threads, one phase each")
    args = parser.parse_args()

    backends = [b for b in args.backends.split(",") if b]
    if not backends or set(backends) - {"postgresql", "sqlite"}:
        parser.error(f"--backends {args.backends}: choose from postgresql, sqlite")
    name = f"allocator_bench_{secrets.token_hex(4)}"
    with psycopg.connect(args.postgres, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(args.postgres)
    url = (
        f"postgresql+psycopg://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:"
        f"{info.get('port', 5432)}/{name}"
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            targets = {"postgresql": url, "sqlite": f"sqlite:///{Path(tmp) / 'bench.db'}"}
            sustained = [
                {"backend": b, **sustain(targets[b], args, Path(tmp) / f"spool-{b}")}
                for b in backends
            ]
            acks = []
            if args.ack_seconds > 0:
                sqlite_url = f"sqlite:///{Path(tmp) / 'acks.db'}"
                upgrade(sqlite_url)
                for backend, target in (("postgresql", url), ("sqlite", sqlite_url)):
                    for ack in ("durable", "queued"):
                        for c in (int(c) for c in args.ack_concurrency.split(",")):
                            fresh = make_records(
                                (5_000 if ack == "durable" else 2_000) * c,
                                args.assets,
                                len(acks) + 1,
                                f"ack{len(acks)}",
                            )
                            phase = ack_latency(
                                target,
                                Path(tmp) / f"spool-{len(acks)}",
                                ack,
                                c,
                                args.ack_seconds,
                                fresh,
                            )
                            acks.append({"backend": backend, **phase})
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    machine = f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}"
    print(
        json.dumps(
            {
                "benchmark": "recorder_throughput",
                "decisions": args.decisions,
                "weights_per_vector": args.assets + 1,
                "batch_size": args.batch_size,
                "sustained": sustained,
                "goal_decisions_per_s": 25_000,
                "acknowledgement": acks,
                "machine": machine,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
