"""Train a tiny model, export it to a registry, serve it and ask it from Python.

The whole life of a policy on a laptop's scale: ``train`` writes a run directory (model,
normalization statistics, manifest, validation backtest), ``export_run`` turns it into a
verified ONNX version in a registry (``REGISTRY/NAME/1/``), the allocation server loads that
registry, and ``AllocatorClient`` asks it for weights day after day for one portfolio, so the
server's smoothing carries from one answer to the next. The server runs in this process here;
in production it is ``allocator serve --registry REGISTRY`` and only the client part below
runs in your service (``AllocatorClient``, or ``AsyncAllocatorClient`` under asyncio).

    python examples/train_serve.py --out runs/examples/train_serve
    python examples/train_serve.py --steps 3000     # a longer (still small) training run
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path

import numpy as np

from allocator import AllocationRequest, AllocatorClient, AsyncAllocatorClient
from allocator.recording.migrations import upgrade
from allocator.serving.server import ServerConfig, build_server
from allocator.trainer.export.run import export_run
from allocator.trainer.market.data import load_sp500
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run import train

ASSETS = ["AAPL", "MSFT", "JPM", "XOM"]


def train_and_export(out: Path, steps: int) -> Path:
    """A tiny TD3 on four S&P 500 stocks, exported to ``out/models``; returns the registry."""
    config = load_config(
        None,  # the defaults, then these overrides (the same `key=value` as `--set`)
        [
            "name=example",
            f"data.assets=[{','.join(ASSETS)}]",
            "data.train_start=2016-01-01",
            "data.train_end=2017-12-31",
            "data.validation_start=2018-01-01",
            "data.validation_end=2018-06-30",
            f"env.max_assets={len(ASSETS)}",
            "env.window=10",
            "env.episode_length=60",
            f"total_timesteps={steps}",
            "algorithm.learning_starts=100",
            "algorithm.batch_size=32",
            "algorithm.net_arch=[32,32]",
            "progress_bar=false",
            "tensorboard=false",
            "torch_threads=1",
            f"output_dir={out}",
        ],
    )
    run_dir = out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run = train(config, run_dir)
    print(f"trained {config.algorithm.name} for {steps} steps: {run.run_dir}")
    registry = out / "models"
    if registry.exists():
        shutil.rmtree(registry)
    version_dir = export_run(run.run_dir, registry, name="example")
    print(f"exported (ONNX, parity checked): {version_dir}")
    return registry


def ask(target: str, days: int) -> None:
    """What a trading service does: list the models, then ask for weights every day."""
    data = load_sp500().select(ASSETS)
    with AllocatorClient(target) as client:
        model = client.list_models()[0]
        print(f"serving {model.name}/{model.version}: {model.window + 1} closes per asset")
        closes = data.prices[-(days + model.window + 1) :]  # (dates, assets)
        for day in range(days):
            window = closes[day : day + model.window + 1].T  # (assets, window + 1)
            allocation = client.allocate("example-portfolio", ASSETS, window)
    print(f"after {days} days, model {allocation.model_name}/{allocation.model_version}:")
    for asset, raw, smoothed in zip(
        allocation.asset_ids, allocation.raw_weights, allocation.smoothed_weights, strict=True
    ):
        print(f"  {asset:<6} raw {raw:.4f}  smoothed (execute this) {smoothed:.4f}")
    assert np.isclose(allocation.smoothed_weights.sum(), 1.0)


async def ask_many(target: str) -> None:
    """The asyncio client: several portfolios in one call (all answered, or none)."""
    data = load_sp500().select(ASSETS)
    async with AsyncAllocatorClient(target) as client:
        window = (await client.list_models())[0].window
        closes = data.prices[-(window + 1) :].T
        requests = [
            AllocationRequest(f"fund-{k}", ASSETS[: 2 + k], closes[: 2 + k]) for k in range(3)
        ]
        for allocation in await client.allocate_batch(requests):
            weights = ", ".join(
                f"{a} {w:.3f}"
                for a, w in zip(allocation.asset_ids, allocation.smoothed_weights, strict=True)
            )
            print(f"  {allocation.portfolio_id}: {weights}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/examples/train_serve"))
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--days", type=int, default=5, help="daily allocations to ask for")
    args = parser.parse_args(argv)

    registry = train_and_export(args.out, args.steps)
    database = f"sqlite:///{args.out / 'trades.db'}"
    upgrade(database)  # the trade schema: every decision the server makes is recorded
    server = build_server(
        ServerConfig(
            registry=registry,
            port=0,  # any free port
            metrics_port=None,
            database_url=database,
            spool_dir=args.out / "spool",
        )
    ).start()
    try:
        ask(server.target, args.days)
        print("a batch for three portfolios, from the asyncio client:")
        asyncio.run(ask_many(server.target))
    finally:
        server.stop()
    print(f"decisions recorded in {args.out / 'trades.db'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
