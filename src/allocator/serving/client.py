"""A small client of the allocation server, and the ``allocator request`` command built on it.

Meant for trading services and notebooks: this module itself needs grpcio, grpcio-health-checking,
numpy and click only (no onnxruntime, no torch). Every call sends the
bearer token as metadata when one is given, and every gRPC failure surfaces as
``AllocatorError`` carrying the status code and the server's message (which names the bad field).

Example::

    with AllocatorClient("localhost:50051", token=token) as client:
        window = client.list_models()[0].window
        allocation = client.allocate("fund-7", ["AAPL", "MSFT"], prices)  # prices: (2, window+1)
        print(allocation.smoothed_weights)                                  # CASH first
"""

from __future__ import annotations

import csv
import json
import math
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import click
import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from numpy.typing import ArrayLike, NDArray

from allocator.serving.proto import SERVICE_NAME, allocator_pb2, allocator_pb2_grpc

__all__ = [
    "CASH_ID",
    "Allocation",
    "AllocationRequest",
    "AllocatorClient",
    "AllocatorError",
    "ModelInfo",
    "request_command",
]

CASH_ID = "CASH"
"""The id the server answers for the cash slot, first in every weight vector."""
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Batch answers for thousands of portfolios exceed gRPC's 4 MiB default."""

Float64Array = NDArray[np.float64]


class AllocatorError(Exception):
    """A failed call: the gRPC status ``code`` and the server's ``details``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> AllocatorError:
        # Errors raised by a call are also grpc.Call objects carrying code() and details().
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


@dataclass(frozen=True)
class Allocation:
    """The server's answer for one portfolio; weight arrays are parallel to ``asset_ids``."""

    request_id: str
    portfolio_id: str
    asset_ids: tuple[str, ...]
    """``CASH`` first, then the request's assets in request order."""
    raw_weights: Float64Array
    smoothed_weights: Float64Array
    """What to execute."""
    model_name: str
    model_version: str
    icm_reward: float | None
    """``None`` when the model has no ICM or the portfolio had no previous observation."""
    turnover: float

    @classmethod
    def from_proto(cls, message: allocator_pb2.AllocateResponse) -> Allocation:
        return cls(
            request_id=message.request_id,
            portfolio_id=message.portfolio_id,
            asset_ids=tuple(message.asset_ids),
            raw_weights=np.asarray(message.raw_weights, dtype=np.float64),
            smoothed_weights=np.asarray(message.smoothed_weights, dtype=np.float64),
            model_name=message.model.name,
            model_version=message.model.version,
            icm_reward=message.icm_reward if message.HasField("icm_reward") else None,
            turnover=message.turnover,
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (lists of floats), for ``--json`` and logs."""
        data = asdict(self)
        data["asset_ids"] = list(self.asset_ids)
        data["raw_weights"] = self.raw_weights.tolist()
        data["smoothed_weights"] = self.smoothed_weights.tolist()
        return data


@dataclass(frozen=True)
class ModelInfo:
    """One loaded model version, as ``ListModels`` describes it."""

    name: str
    version: str
    algorithm: str
    max_assets: int
    window: int
    """Requests send ``window + 1`` prices per asset."""
    beta: float
    has_icm: bool
    provider: str
    is_default: bool

    @classmethod
    def from_proto(cls, message: allocator_pb2.ModelInfo) -> ModelInfo:
        return cls(
            name=message.name,
            version=message.version,
            algorithm=message.algorithm,
            max_assets=message.max_assets,
            window=message.window,
            beta=message.beta,
            has_icm=message.has_icm,
            provider=message.provider,
            is_default=message.is_default,
        )


@dataclass(frozen=True)
class AllocationRequest:
    """One portfolio's request for ``allocate_batch`` (a dict with these keys works too)."""

    portfolio_id: str
    asset_ids: Sequence[str]
    prices: ArrayLike
    """Shape ``(len(asset_ids), window + 1)``, oldest first."""
    current_weights: ArrayLike | None = None
    """``len(asset_ids) + 1`` weights, CASH first; ``None`` lets the server use its state."""
    request_id: str | None = None
    """Idempotency key; a fresh uuid4 when ``None``. Reuse it when retrying."""
    model: str | None = None
    version: str | None = None

    def to_proto(self) -> allocator_pb2.AllocateRequest:
        assets = list(self.asset_ids)
        prices = np.asarray(self.prices, dtype=np.float64)
        if prices.ndim != 2 or prices.shape[0] != len(assets):
            raise ValueError(
                f"prices must have shape (len(asset_ids), window + 1) = ({len(assets)}, ...), "
                f"got {prices.shape}"
            )
        message = allocator_pb2.AllocateRequest(
            portfolio_id=self.portfolio_id,
            request_id=self.request_id or str(uuid.uuid4()),
            asset_ids=assets,
            prices=prices.ravel().tolist(),
        )
        if self.current_weights is not None:
            weights = np.asarray(self.current_weights, dtype=np.float64).ravel()
            message.current_weights.extend(weights.tolist())
        if self.model or self.version:
            message.model.name = self.model or ""
            message.model.version = self.version or ""
        return message


class AllocatorClient:
    """A channel to one allocation server; use it as a context manager to close the channel.

    TLS is used when any of ``root_certificates`` (PEM bytes; ``None`` with a client key means
    the system roots), ``private_key`` and ``certificate_chain`` is given; the last two together
    are the client's certificate for mTLS. ``options`` are extra gRPC channel options, e.g.
    ``("grpc.ssl_target_name_override", "allocator.internal")``.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        timeout: float = 5.0,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if (private_key is None) != (certificate_chain is None):
            raise ValueError("mTLS needs both private_key and certificate_chain")
        self.target = target
        self.timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        channel_options = [
            ("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE_BYTES),
            *options,
        ]
        if root_certificates is None and private_key is None:
            self._channel = grpc.insecure_channel(target, options=channel_options)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=root_certificates,
                private_key=private_key,
                certificate_chain=certificate_chain,
            )
            self._channel = grpc.secure_channel(target, credentials, options=channel_options)
        self._stub = allocator_pb2_grpc.AllocatorStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return method(
                request,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            raise AllocatorError.from_rpc_error(error) from None

    def allocate(
        self,
        portfolio_id: str,
        asset_ids: Sequence[str],
        prices: ArrayLike,
        current_weights: ArrayLike | None = None,
        request_id: str | None = None,
        model: str | None = None,
        version: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Allocation:
        """Weights for one portfolio now; ``prices`` has shape ``(len(asset_ids), window + 1)``.

        Retrying with the same ``request_id`` is safe: the server answers it once.
        """
        request = AllocationRequest(
            portfolio_id, asset_ids, prices, current_weights, request_id, model, version
        ).to_proto()
        return Allocation.from_proto(self._call(self._stub.Allocate, request, timeout))

    def allocate_batch(
        self,
        requests: Iterable[AllocationRequest | Mapping[str, Any]],
        *,
        timeout: float | None = None,
    ) -> list[Allocation]:
        """Weights for many portfolios in one call, in request order; all or nothing."""
        items = [
            r.to_proto() if isinstance(r, AllocationRequest) else AllocationRequest(**r).to_proto()
            for r in requests
        ]
        batch = allocator_pb2.AllocateBatchRequest(requests=items)
        response = self._call(self._stub.AllocateBatch, batch, timeout)
        return [Allocation.from_proto(r) for r in response.responses]

    def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        response = self._call(self._stub.ListModels, allocator_pb2.ListModelsRequest(), timeout)
        return [ModelInfo.from_proto(m) for m in response.models]

    def reset_portfolio(self, portfolio_id: str, *, timeout: float | None = None) -> bool:
        """Forget the portfolio's smoothing state; True when the server had any."""
        request = allocator_pb2.ResetPortfolioRequest(portfolio_id=portfolio_id)
        return bool(self._call(self._stub.ResetPortfolio, request, timeout).existed)

    def health(
        self, services: Sequence[str] = ("", SERVICE_NAME), *, timeout: float | None = None
    ) -> dict[str, str]:
        """Status name per service from ``grpc.health.v1.Health/Check``.

        ``SERVING`` or ``NOT_SERVING``; ``SERVICE_UNKNOWN`` where the server does not know the
        name. Other failures (unreachable, unauthenticated) raise ``AllocatorError``.
        """
        statuses: dict[str, str] = {}
        for service in services:
            request = health_pb2.HealthCheckRequest(service=service)
            try:
                response = self._call(self._health.Check, request, timeout)
            except AllocatorError as error:
                if error.code is not grpc.StatusCode.NOT_FOUND:
                    raise
                statuses[service] = "SERVICE_UNKNOWN"
                continue
            statuses[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
        return statuses

    def is_serving(self, *, timeout: float | None = None) -> bool:
        """Whether the server and the Allocator service both report SERVING."""
        return all(s == "SERVING" for s in self.health(timeout=timeout).values())


# --- the `allocator request` command -------------------------------------------------------

_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")


def _version_key(version: str) -> tuple[int, tuple[int, ...], str]:
    """Numeric versions sort numerically ("10" after "9") and after non-numeric ones."""
    if _VERSION_RE.match(version):
        return (1, tuple(int(p) for p in version.split(".")), "")
    return (0, (), version)


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
    return max(candidates, key=lambda m: _version_key(m.version))


def read_prices_csv(
    path: Path, rows: int, assets: Sequence[str] | None = None
) -> tuple[list[str], Float64Array]:
    """The last ``rows`` closes of a wide CSV (date first, one column per asset), per asset."""
    with path.open(newline="") as handle:
        table = list(csv.reader(handle))
    table = [row for row in table if any(cell.strip() for cell in row)]
    if len(table) < 2 or len(table[0]) < 2:
        raise click.ClickException(f"{path}: expected a header (date, assets...) and data rows")
    header = [cell.strip() for cell in table[0]]
    columns = header[1:]
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
    rng = np.random.default_rng(seed)
    log_returns = rng.normal(0.0003, 0.015, size=(n_assets, rows - 1))
    paths = 100.0 * np.exp(np.concatenate([np.zeros((n_assets, 1)), log_returns], axis=1).cumsum(1))
    return [f"SYN{i + 1}" for i in range(n_assets)], paths


def format_allocation(allocation: Allocation, current: Float64Array | None = None) -> str:
    """A table a person can read: one row per slot, then the model and the figures."""
    width = max(len("asset"), *(len(a) for a in allocation.asset_ids))
    head = f"{'asset':<{width}}  {'raw':>8}  {'smoothed':>8}"
    if current is not None:
        head += f"  {'current':>8}"
    lines = [head, "-" * len(head)]
    for i, asset in enumerate(allocation.asset_ids):
        line = (
            f"{asset:<{width}}  {allocation.raw_weights[i]:>8.4f}  "
            f"{allocation.smoothed_weights[i]:>8.4f}"
        )
        if current is not None:
            line += f"  {current[i]:>8.4f}"
        lines.append(line)
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


def _read_bytes(path: Path | None) -> bytes | None:
    return None if path is None else path.read_bytes()


def _parse_weights(text: str | None) -> Float64Array | None:
    if text is None:
        return None
    try:
        return np.array([float(x) for x in text.split(",")], dtype=np.float64)
    except ValueError:
        raise click.BadParameter(
            "comma-separated numbers, CASH first", param_hint="--current-weights"
        ) from None


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
    weights = _parse_weights(current_weights)
    options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
    client = AllocatorClient(
        target,
        token=token,
        root_certificates=_read_bytes(tls_ca),
        private_key=_read_bytes(tls_key),
        certificate_chain=_read_bytes(tls_cert),
        timeout=timeout,
        options=options,
    )
    try:
        with client:
            info = pick_model(client.list_models(), model, model_version)
            rows = info.window + 1
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
