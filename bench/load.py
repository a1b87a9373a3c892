"""The load generator of the serving benches: requests, and one phase of load against a target.

Runs in processes of its own (``bench/serve_latency.py`` hands each phase to a pool of
``--clients`` processes), so the server under test and the generator do not share a GIL, and
the generator is not what limits a phase: the closed loops and the open-loop rate are split
over the pool (``split_phase``) and their figures merged (``merge_parts``), and every part
reports the CPU its process used (``generator_cpu``, cores), which says whether a generator
process was near a core of its own. Every call uses the stubs generated from ``proto/``, as any
client would.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np


def percentiles(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"p50_ms": float("nan"), "p95_ms": float("nan"), "p99_ms": float("nan")}
    p50, p95, p99 = np.percentile(np.asarray(latencies) * 1e3, [50, 95, 99])
    return {"p50_ms": round(p50, 3), "p95_ms": round(p95, 3), "p99_ms": round(p99, 3)}


def make_requests(
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


def split_phase(phase: dict[str, Any], clients: int, start_at: float) -> list[dict[str, Any]]:
    """One phase as parts for up to ``clients`` processes, all starting at ``start_at``
    (``time.time()``): a closed loop's threads and an open loop's rate are shared out; a batch
    or stream phase is one client's loop (its cost is the server's, per decision)."""
    kind = phase["kind"]
    if kind == "closed":
        n = max(1, min(clients, phase["concurrency"]))
        threads = list(range(phase["concurrency"]))
        parts = [threads[k::n] for k in range(n)]
        return [
            {**phase, "threads": t, "part": k, "start_at": start_at} for k, t in enumerate(parts)
        ]
    if kind == "open":
        n = max(1, clients)
        return [
            {**phase, "part": k, "parts": n, "start_at": start_at + k / (n * phase["rate"])}
            for k in range(n)
        ]
    return [{**phase, "part": 0, "start_at": start_at}]


def merge_parts(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The parts of one phase as one result: calls, codes and rates summed, percentiles over
    every part's latencies, ``generator_cpu`` the busiest generator process's."""
    first = results[0]
    if len(results) == 1:
        merged = dict(first)
    else:
        latencies = [x for r in results for x in r["latencies"]]
        codes: dict[str, int] = {}
        for r in results:
            for code, n in r["codes"].items():
                codes[code] = codes.get(code, 0) + n
        merged = {**first, **percentiles(latencies), "codes": codes}
        merged["calls"] = sum(r["calls"] for r in results)
        for key in ("req_per_s", "achieved_req_per_s", "issued_req_per_s", "decisions_per_s"):
            if key in first:
                merged[key] = round(sum(r[key] for r in results), 1)
    merged["clients"] = len(results)
    merged["generator_cpu"] = max(r["generator_cpu"] for r in results)
    merged.pop("latencies", None)
    return merged


def run_phase(target: str, phase: dict[str, Any]) -> dict[str, Any]:
    """One phase (or one part of it, ``split_phase``) against ``target``: latencies summarised
    and counts, plus the raw latencies (for ``merge_parts``) and the generator's CPU use."""
    start_at = phase.get("start_at")
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    began = time.perf_counter()
    result = _run_phase(target, phase)
    result["generator_cpu"] = round((time.process_time() - cpu) / (time.perf_counter() - began), 2)
    return result


def _run_phase(target: str, phase: dict[str, Any]) -> dict[str, Any]:
    import grpc

    from allocator.serving.proto.v1 import allocator_pb2 as pb
    from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc

    options = [
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.max_receive_message_length", 64 << 20),
        # a connection per channel (grpc shares one between channels of equal arguments by
        # default): a server of several processes spreads connections, not calls
        ("grpc.use_local_subchannel_pool", 1),
    ]
    channels = [
        grpc.insecure_channel(target, options=options) for _ in range(phase.get("channels", 1))
    ]
    stubs = [pb_grpc.AllocatorStub(channel) for channel in channels]
    stub = stubs[0]
    kind, duration = phase["kind"], phase["duration"]
    tag = f"{phase['tag']}-c{phase.get('part', 0)}"
    prefix = phase.get("prefix", "bench")  # its own portfolios when the asset count differs
    templates = make_requests(phase["portfolios"], phase["assets"], phase["window"], prefix=prefix)
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
                    stubs[w % len(stubs)].Allocate(request, timeout=5)
                    count("OK")
                except grpc.RpcError as exc:
                    count(exc.code().name)
                local.append(time.perf_counter() - t0)
                i += 1
            with lock:
                latencies.extend(local)

        ids = phase.get("threads", range(phase["concurrency"]))
        threads = [threading.Thread(target=worker, args=(w,)) for w in ids]
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
            "channels": len(stubs),
            "calls": calls,
            "req_per_s": round(calls / elapsed, 1),
            "codes": codes,
            "latencies": latencies,
            **percentiles(latencies),
        }

    if kind == "open":
        rate = phase["rate"]
        parts = phase.get("parts", 1)
        own_rate = rate / parts  # this part's share; the parts' schedules interleave
        n = int(own_rate * duration)
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
            scheduled = start + i / own_rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            request = pb.AllocateRequest()
            request.CopyFrom(templates[i % len(templates)])
            request.request_id = f"{tag}-{i}"
            future = stubs[i % len(stubs)].Allocate.future(request, timeout=5)
            future.add_done_callback(lambda f, s=scheduled: finished(s, f))
        issued_for = time.perf_counter() - start
        for _ in range(n):
            done.acquire(timeout=10)
        elapsed = time.perf_counter() - start
        return {
            "phase": f"open_{rate}",
            "target_req_per_s": rate,
            "channels": len(stubs),
            "issued_req_per_s": round(n / issued_for, 1),
            "achieved_req_per_s": round(codes.get("OK", 0) / elapsed, 1),
            "calls": n,
            "codes": codes,
            "latencies": latencies,
            **percentiles(latencies),
        }

    if kind == "stream":
        return _stream_phase(stub, phase, templates)

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
        "latencies": latencies,
        **percentiles(latencies),
    }


def _stream_phase(stub: Any, phase: dict[str, Any], templates: list[Any]) -> dict[str, Any]:
    """One ``AllocateStream`` call for ``duration`` seconds, ``in_flight`` messages ahead."""
    import grpc

    from allocator.serving.proto.v1 import allocator_pb2 as pb

    size, depth = phase["batch_size"], phase["in_flight"]
    tag = f"{phase['tag']}-c{phase.get('part', 0)}"
    names = {code.value[0]: code.name for code in grpc.StatusCode}
    slots = threading.Semaphore(depth)
    sent_at: dict[int, float] = {}
    codes: dict[str, int] = {}
    latencies: list[float] = []
    end = time.perf_counter() + phase["duration"]

    def messages() -> Any:
        i = 0
        while slots.acquire() and time.perf_counter() < end:
            message = pb.AllocateStreamRequest(sequence=i)
            for k in range(size):
                item = message.batch.requests.add()
                item.CopyFrom(templates[k % len(templates)])
                item.request_id = f"{tag}-{i}-{k}"
            sent_at[i] = time.perf_counter()
            yield message
            i += 1

    decisions = 0
    start = time.perf_counter()
    for reply in stub.AllocateStream(messages(), timeout=phase["duration"] + 60):
        latencies.append(time.perf_counter() - sent_at.pop(reply.sequence))
        code = names[reply.error.code] if reply.HasField("error") else "OK"
        codes[code] = codes.get(code, 0) + 1
        decisions += len(reply.responses)
        slots.release()
    elapsed = time.perf_counter() - start
    return {
        "phase": f"stream_{size}",
        "batch_size": size,
        "in_flight": depth,
        "calls": len(latencies),
        "decisions_per_s": round(decisions / elapsed, 1),
        "codes": codes,
        "latencies": latencies,
        **percentiles(latencies),
    }
