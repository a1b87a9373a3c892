"""The ``allocator request`` command: ask a running server for one portfolio's weights.

Like ``serving.client``, needs no onnxruntime or torch; the prices come from a wide CSV or a
synthetic random walk, the model from the server's own list.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path

import click
import numpy as np
from numpy.typing import NDArray

from allocator.registry.naming import version_key
from allocator.serving.client import Allocation, AllocatorClient, AllocatorError, ModelInfo

__all__ = [
    "format_allocation",
    "pick_model",
    "read_prices_csv",
    "request_command",
    "synthetic_prices",
]

Float64Array = NDArray[np.float64]


def pick_model(models: Sequence[ModelInfo], name: str | None, version: str | None) -> ModelInfo:
    """The model the server will use for this pin, as the API defines it."""
    if not models:
        raise click.ClickException("the server has no model loaded")
    if name is None:
        defaults = [m for m in models if m.is_default]
        if not defaults:
            raise click.ClickException("the server reports no default model: pass --model")
        name = defaults[0].name
        if version is None:
            return defaults[0]
    candidates = [m for m in models if m.name == name]
    if version is not None:
        candidates = [m for m in candidates if m.version == version]
    if not candidates:
        known = ", ".join(f"{m.name}/{m.version}" for m in models)
        pin = name if version is None else f"{name}/{version}"
        raise click.ClickException(f"model {pin} is not loaded (loaded: {known})")
    return max(candidates, key=lambda m: version_key(m.version))


def read_prices_csv(
    path: Path, rows: int, assets: Sequence[str] | None = None
) -> tuple[list[str], Float64Array]:
    """The last ``rows`` closes per asset of a wide CSV (date first, one column per asset)."""
    with path.open(newline="") as handle:
        table = [row for row in csv.reader(handle) if any(cell.strip() for cell in row)]
    if len(table) < 2 or len(table[0]) < 2:
        raise click.ClickException(f"{path}: expected a header (date, assets...) and data rows")
    columns = [cell.strip() for cell in table[0][1:]]
    wanted = list(assets) if assets else columns
    missing = [a for a in wanted if a not in columns]
    if missing:
        raise click.ClickException(f"{path}: no column for {', '.join(missing)}")
    data = table[1:]
    if len(data) < rows:
        raise click.ClickException(
            f"{path}: {len(data)} data rows, the model needs the last {rows} (window + 1)"
        )
    index = [columns.index(a) + 1 for a in wanted]
    values = np.empty((len(wanted), rows), dtype=np.float64)
    for j, row in enumerate(data[-rows:]):
        line = len(data) - rows + j + 2
        for i, col in enumerate(index):
            cell = row[col].strip() if col < len(row) else ""
            try:
                values[i, j] = float(cell)
            except ValueError:
                raise click.ClickException(
                    f"{path}:{line}: {wanted[i]} price {cell!r} is not a number"
                ) from None
    return wanted, values


def synthetic_prices(n_assets: int, rows: int, seed: int) -> tuple[list[str], Float64Array]:
    """Geometric random walks from 100: for trying a server without market data."""
    log_returns = np.random.default_rng(seed).normal(0.0003, 0.015, size=(n_assets, rows - 1))
    paths = 100.0 * np.exp(np.concatenate([np.zeros((n_assets, 1)), log_returns], axis=1).cumsum(1))
    return [f"SYN{i + 1}" for i in range(n_assets)], paths


def format_allocation(allocation: Allocation, current: Float64Array | None = None) -> str:
    columns = {"raw": allocation.raw_weights, "smoothed": allocation.smoothed_weights}
    if current is not None:
        columns["current"] = current
    width = max(len("asset"), *(len(a) for a in allocation.asset_ids))
    head = f"{'asset':<{width}}" + "".join(f"  {name:>8}" for name in columns)
    lines = [head, "-" * len(head)]
    for i, asset in enumerate(allocation.asset_ids):
        lines.append(f"{asset:<{width}}" + "".join(f"  {w[i]:>8.4f}" for w in columns.values()))
    icm = "-" if allocation.icm_reward is None else f"{allocation.icm_reward:.6g}"
    lines += [
        "",
        f"model       {allocation.model_name} version {allocation.model_version}",
        f"icm reward  {icm}",
        f"turnover    {allocation.turnover:.4f}",
        f"portfolio   {allocation.portfolio_id}",
        f"request id  {allocation.request_id}",
    ]
    return "\n".join(lines)


_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("request")
@click.option("--target", required=True, help="Server address, HOST:PORT.")
@click.option("--portfolio", "portfolio_id", required=True, help="Portfolio id.")
@click.option(
    "--prices-csv",
    type=_FILE,
    help="Wide CSV: a date column, then one column of closes per asset; the last window + 1 "
    "rows are sent.",
)
@click.option(
    "--synthetic", type=click.IntRange(min=1), help="Send N synthetic assets instead of a CSV."
)
@click.option("--assets", help="Comma-separated CSV columns to send (default: all).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --synthetic.")
@click.option("--current-weights", help="Held weights, comma-separated, CASH first.")
@click.option("--model", help="Model name (default: the server's default model).")
@click.option("--version", "model_version", help="Model version (default: the newest).")
@click.option("--request-id", help="Idempotency key (default: a fresh uuid4).")
@click.option("--token-file", type=_FILE, help="File holding the bearer token.")
@click.option("--tls-ca", type=_FILE, help="CA certificate (PEM): use TLS.")
@click.option("--tls-cert", type=_FILE, help="Client certificate (PEM), for mTLS.")
@click.option("--tls-key", type=_FILE, help="Client private key (PEM), for mTLS.")
@click.option("--tls-server-name", help="Expected server name in its certificate.")
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Deadline, s.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
def request_command(
    target: str,
    portfolio_id: str,
    prices_csv: Path | None,
    synthetic: int | None,
    assets: str | None,
    seed: int,
    current_weights: str | None,
    model: str | None,
    model_version: str | None,
    request_id: str | None,
    token_file: Path | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_server_name: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Ask a running server for one portfolio's weights and print them."""
    if (prices_csv is None) == (synthetic is None):
        raise click.UsageError("give exactly one of --prices-csv FILE and --synthetic N")
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("mTLS needs both --tls-cert and --tls-key")
    token = token_file.read_text().strip() if token_file else None
    if token_file and not token:
        raise click.UsageError(f"--token-file {token_file} is empty")
    weights = None
    try:
        if current_weights is not None:
            weights = np.array([float(x) for x in current_weights.split(",")], dtype=np.float64)
    except ValueError:
        raise click.BadParameter(
            "comma-separated numbers, CASH first", param_hint="--current-weights"
        ) from None
    options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
    client = AllocatorClient(
        target,
        token=token,
        root_certificates=tls_ca.read_bytes() if tls_ca else None,
        private_key=tls_key.read_bytes() if tls_key else None,
        certificate_chain=tls_cert.read_bytes() if tls_cert else None,
        timeout=timeout,
        options=options,
    )
    try:
        with client:
            rows = pick_model(client.list_models(), model, model_version).window + 1
            if prices_csv is not None:
                wanted = [a.strip() for a in assets.split(",")] if assets else None
                asset_ids, prices = read_prices_csv(prices_csv, rows, wanted)
            else:
                asset_ids, prices = synthetic_prices(int(synthetic or 0), rows, seed)
            allocation = client.allocate(
                portfolio_id,
                asset_ids,
                prices,
                current_weights=weights,
                request_id=request_id,
                model=model,
                version=model_version,
            )
    except AllocatorError as error:
        raise click.ClickException(f"{error.code.name}: {error.details}") from None
    if as_json:
        data = allocation.to_json()
        if data["icm_reward"] is not None and not math.isfinite(data["icm_reward"]):
            data["icm_reward"] = None
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(format_allocation(allocation, weights))
