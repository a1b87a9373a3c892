"""The serving leg of ``allocator demo``: serve the exported demo model, ask it, stop it.

Replays the last ``steps`` market days for one portfolio through the real server and client
(so the smoothing state carries over), prints the last allocation and the latency, stops the
server as SIGTERM does and counts the recorded decisions.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from allocator.recording.migrations import upgrade
from allocator.serving.client import AllocatorClient
from allocator.serving.server import AllocationServer, ServerConfig, build_server


def local_server(registry: Path, out_dir: Path, db_name: str, spool: str) -> AllocationServer:
    """A started server on an OS-chosen port, recording to a migrated SQLite file in ``out_dir``."""
    url = f"sqlite:///{out_dir / db_name}"
    upgrade(url)
    config = ServerConfig(
        registry=registry,
        port=0,
        metrics_port=None,
        database_url=url,
        spool_dir=out_dir / spool,
    )
    return build_server(config).start()


def serve_demo(
    registry: Path,
    out_dir: Path,
    prices: NDArray[np.float64],
    assets: tuple[str, ...],
    *,
    steps: int = 300,
    echo: Callable[[str], None] = print,
) -> dict[str, float]:
    """``prices``: ``(dates, assets)``, assets with a gap in the span skipped; returns the
    figures it printed."""
    db = out_dir / "trades.db"
    server = local_server(registry, out_dir, db.name, "spool")
    model = server.registry.snapshot.default
    n_prices = model.prices_per_asset
    span = prices[-(steps + n_prices) :]
    usable = [i for i in range(span.shape[1]) if np.all(np.isfinite(span[:, i]))]
    chosen = usable[: model.max_request_assets]
    ids = [assets[i] for i in chosen]
    echo(
        f"serving {model.name}/{model.version} on {server.target} ({model.provider}); "
        f"{steps} daily allocations for {len(ids)} assets, recording to {db}"
    )
    latencies: list[float] = []
    last = None
    try:
        with AllocatorClient(server.target) as client:
            for t in range(steps):
                window = span[t : t + n_prices, chosen].T
                start = time.perf_counter()
                last = client.allocate("demo", ids, window, request_id=f"demo-{t}")
                latencies.append(time.perf_counter() - start)
    finally:
        server.stop()
    assert last is not None
    rows = sqlite3.connect(db).execute("SELECT count(*) FROM decisions").fetchone()[0]
    p50, p95 = (float(v) for v in np.percentile(np.asarray(latencies) * 1e3, [50, 95]))
    echo(f"last allocation (model {last.model_name}/{last.model_version}):")
    echo(f"  {'asset':<8} {'raw':>8} {'smoothed':>9}")
    order = np.argsort(-last.smoothed_weights)
    for k in order[:10]:
        echo(f"  {last.asset_ids[k]:<8} {last.raw_weights[k]:8.4f} {last.smoothed_weights[k]:9.4f}")
    if len(order) > 10:
        echo(f"  ... {len(order) - 10} more")
    icm = "n/a" if last.icm_reward is None else f"{last.icm_reward:.3f}"
    echo(f"turnover {last.turnover:.4f}, ICM reward {icm}")
    echo(
        f"client-measured latency over {steps} calls: P50 {p50:.2f} ms, P95 {p95:.2f} ms; "
        f"{rows} decisions recorded; server stopped cleanly"
    )
    return {"p50_ms": p50, "p95_ms": p95, "recorded": float(rows), "calls": float(steps)}
