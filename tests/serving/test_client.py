"""The client against a tiny real gRPC server defined here (echoing deterministic weights).

The server validates with the real ``validation`` module and checks the bearer token, so the
client's encoding, metadata and error mapping are exercised end to end over a real channel.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import click
import grpc
import numpy as np
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from allocator.serving.client import (
    Allocation,
    AllocationRequest,
    AllocatorClient,
    AllocatorError,
    ModelInfo,
)
from allocator.serving.proto import SERVICE_NAME, allocator_pb2, allocator_pb2_grpc
from allocator.serving.request_cli import pick_model, read_prices_csv, request_command
from allocator.serving.validation import (
    InvalidRequest,
    ModelShape,
    validate_batch,
)
from tests.serving.requests import validate_one

TOKEN = "s3cret-token"
MODELS = {
    ("alpha", "1"): ModelShape(max_assets=5, window=4),
    ("alpha", "2"): ModelShape(max_assets=5, window=4),
    ("wide", "10"): ModelShape(max_assets=3, window=9),
}
DEFAULT = "alpha"


def _newest(name: str) -> str:
    return max((v for n, v in MODELS if n == name), key=int)


def raw_weights(prices: np.ndarray) -> np.ndarray:
    """Deterministic stand-in for a policy: cash 0.1, the rest by last price."""
    last = prices[:, -1]
    return np.concatenate([[0.1], 0.9 * last / last.sum()])


@dataclass
class EchoServicer(allocator_pb2_grpc.AllocatorServicer):
    token: str | None = TOKEN
    delay: float = 0.0
    state: dict[str, np.ndarray] = field(default_factory=dict)
    metadata_seen: list[dict[str, str]] = field(default_factory=list)

    def _auth(self, context: grpc.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata())
        self.metadata_seen.append(metadata)
        if self.token is not None and metadata.get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    def _resolve(self, name: str | None, version: str | None) -> tuple[str, str]:
        name = name or DEFAULT
        version = version or (_newest(name) if any(n == name for n, _ in MODELS) else "")
        if (name, version) not in MODELS:
            raise KeyError(f"model {name}/{version or '<newest>'} is not loaded")
        return name, version

    def _answer(self, request: allocator_pb2.AllocateRequest) -> allocator_pb2.AllocateResponse:
        name, version = self._resolve(request.model.name or None, request.model.version or None)
        valid = validate_one(request, MODELS[name, version])
        raw = raw_weights(valid.prices)
        previous = self.state.get(valid.portfolio_id)
        smoothed = (
            raw if previous is None or previous.shape != raw.shape else 0.5 * (raw + previous)
        )
        current = valid.current_weights if valid.current_weights is not None else previous
        turnover = 0.0 if current is None else float(np.abs(smoothed - current)[1:].sum())
        self.state[valid.portfolio_id] = smoothed
        response = allocator_pb2.AllocateResponse(
            request_id=valid.request_id,
            portfolio_id=valid.portfolio_id,
            asset_ids=["CASH", *valid.asset_ids],
            raw_weights=raw.tolist(),
            smoothed_weights=smoothed.tolist(),
            model=allocator_pb2.ModelRef(name=name, version=version),
            turnover=turnover,
        )
        if previous is not None:
            response.icm_reward = 0.25
        return response

    def Allocate(self, request, context):  # noqa: N802 - the generated base class's name
        self._auth(context)
        time.sleep(self.delay)
        try:
            return self._answer(request)
        except InvalidRequest as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except KeyError as error:
            context.abort(grpc.StatusCode.NOT_FOUND, error.args[0])

    def AllocateBatch(self, request, context):  # noqa: N802
        self._auth(context)
        try:
            validate_batch(request, lambda n, v: MODELS[self._resolve(n, v)])
            responses = [self._answer(r) for r in request.requests]
        except InvalidRequest as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except KeyError as error:
            context.abort(grpc.StatusCode.NOT_FOUND, error.args[0])
        return allocator_pb2.AllocateBatchResponse(responses=responses)

    def ListModels(self, request, context):  # noqa: N802
        self._auth(context)
        return allocator_pb2.ListModelsResponse(
            models=[
                allocator_pb2.ModelInfo(
                    name=name,
                    version=version,
                    algorithm="td3",
                    max_assets=shape.max_assets,
                    window=shape.window,
                    beta=0.5,
                    has_icm=name == "alpha",
                    provider="CPUExecutionProvider",
                    is_default=(name, version) == (DEFAULT, _newest(DEFAULT)),
                )
                for (name, version), shape in sorted(MODELS.items())
            ]
        )

    def ResetPortfolio(self, request, context):  # noqa: N802
        self._auth(context)
        return allocator_pb2.ResetPortfolioResponse(
            existed=self.state.pop(request.portfolio_id, None) is not None
        )


@dataclass
class Server:
    target: str
    servicer: EchoServicer
    health: health.HealthServicer


def _start(
    servicer: EchoServicer, credentials: grpc.ServerCredentials | None = None
) -> tuple[grpc.Server, Server]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    allocator_pb2_grpc.add_AllocatorServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    assert port > 0
    server.start()
    return server, Server(f"127.0.0.1:{port}", servicer, health_servicer)


@pytest.fixture
def server() -> Iterator[Server]:
    grpc_server, info = _start(EchoServicer())
    yield info
    grpc_server.stop(grace=None)


@pytest.fixture
def client(server: Server) -> Iterator[AllocatorClient]:
    with AllocatorClient(server.target, token=TOKEN, timeout=5.0) as c:
        yield c


def _prices(n: int, window: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 100.0 * np.exp(rng.normal(0.0, 0.01, size=(n, window + 1)).cumsum(axis=1))


# --- calls --------------------------------------------------------------------------------------


def test_allocate_round_trip(client: AllocatorClient, server: Server) -> None:
    prices = _prices(3)
    allocation = client.allocate("fund-1", ["AAPL", "MSFT", "JPM"], prices)
    assert isinstance(allocation, Allocation)
    assert allocation.asset_ids == ("CASH", "AAPL", "MSFT", "JPM")
    np.testing.assert_allclose(allocation.raw_weights, raw_weights(prices), rtol=0, atol=0)
    np.testing.assert_array_equal(allocation.smoothed_weights, allocation.raw_weights)
    assert allocation.raw_weights.dtype == np.float64
    assert (allocation.model_name, allocation.model_version) == ("alpha", "2")
    assert allocation.icm_reward is None  # first observation of the portfolio
    assert allocation.turnover == 0.0
    assert allocation.portfolio_id == "fund-1"
    assert len(allocation.request_id) == 36  # a uuid4 by default

    second = client.allocate(
        "fund-1", ["AAPL", "MSFT", "JPM"], _prices(3, seed=1), request_id="r-2"
    )
    assert second.request_id == "r-2"
    assert second.icm_reward == 0.25
    expected = 0.5 * (raw_weights(_prices(3, seed=1)) + allocation.smoothed_weights)
    np.testing.assert_allclose(second.smoothed_weights, expected, rtol=0, atol=1e-15)
    assert second.turnover > 0.0


def test_allocate_sends_current_weights_and_pin(client: AllocatorClient) -> None:
    current = np.array([0.4, 0.3, 0.3])
    allocation = client.allocate(
        "fund-2", ["X", "Y"], _prices(2, window=9), current, model="wide", version="10"
    )
    assert (allocation.model_name, allocation.model_version) == ("wide", "10")
    expected = float(np.abs(allocation.smoothed_weights - current)[1:].sum())
    assert allocation.turnover == pytest.approx(expected, abs=1e-15)


def test_token_is_sent_as_bearer_metadata(client: AllocatorClient, server: Server) -> None:
    client.list_models()
    assert server.servicer.metadata_seen[-1]["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize("token", [None, "wrong"])
def test_missing_or_wrong_token_is_unauthenticated(server: Server, token: str | None) -> None:
    with AllocatorClient(server.target, token=token) as c, pytest.raises(AllocatorError) as info:
        c.allocate("fund-1", ["A"], _prices(1))
    assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert "bearer token" in info.value.details
    sent = server.servicer.metadata_seen[-1].get("authorization")
    assert sent == (None if token is None else f"Bearer {token}")


def test_invalid_argument_carries_the_field(client: AllocatorClient) -> None:
    prices = _prices(2)
    prices[1, 3] = np.nan
    with pytest.raises(AllocatorError) as info:
        client.allocate("fund-1", ["A", "B"], prices)
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("prices: ")
    assert "'B'" in info.value.details
    assert str(info.value).startswith("INVALID_ARGUMENT: prices: ")


def test_unknown_model_is_not_found(client: AllocatorClient) -> None:
    with pytest.raises(AllocatorError) as info:
        client.allocate("fund-1", ["A"], _prices(1), model="ghost")
    assert info.value.code is grpc.StatusCode.NOT_FOUND
    assert "ghost" in info.value.details


def test_prices_must_be_one_row_per_asset(client: AllocatorClient) -> None:
    with pytest.raises(ValueError, match=r"shape \(len\(asset_ids\), window \+ 1\)"):
        client.allocate("fund-1", ["A", "B"], _prices(2).ravel())
    with pytest.raises(ValueError, match="got \\(3, 5\\)"):
        client.allocate("fund-1", ["A", "B"], _prices(3))


def test_deadline_is_honoured(server: Server) -> None:
    server.servicer.delay = 0.5
    with AllocatorClient(server.target, token=TOKEN, timeout=0.05) as c:
        started = time.perf_counter()
        with pytest.raises(AllocatorError) as info:
            c.allocate("fund-1", ["A"], _prices(1))
        assert time.perf_counter() - started < 0.4
        assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        server.servicer.delay = 0.0
        assert c.allocate("fund-1", ["A"], _prices(1), timeout=5.0).asset_ids == ("CASH", "A")


def test_unreachable_server_is_unavailable() -> None:
    with AllocatorClient("127.0.0.1:1", timeout=1.0) as c, pytest.raises(AllocatorError) as info:
        c.list_models()
    assert info.value.code is grpc.StatusCode.UNAVAILABLE


def test_allocate_batch_in_order_with_dicts_and_requests(client: AllocatorClient) -> None:
    requests = [
        AllocationRequest("p0", ["A", "B"], _prices(2, seed=0), request_id="b0"),
        {"portfolio_id": "p1", "asset_ids": ["C"], "prices": _prices(1, seed=1)},
        {
            "portfolio_id": "p2",
            "asset_ids": ["X", "Y", "Z"],
            "prices": _prices(3, window=9, seed=2),
            "model": "wide",
        },
    ]
    allocations = client.allocate_batch(requests)
    assert [a.portfolio_id for a in allocations] == ["p0", "p1", "p2"]
    assert allocations[0].request_id == "b0"
    assert allocations[2].asset_ids == ("CASH", "X", "Y", "Z")
    assert allocations[2].model_name == "wide"
    np.testing.assert_array_equal(allocations[1].raw_weights, raw_weights(_prices(1, seed=1)))


def test_batch_is_all_or_nothing(client: AllocatorClient, server: Server) -> None:
    bad = _prices(1)
    bad[0, 0] = -1.0
    with pytest.raises(AllocatorError) as info:
        client.allocate_batch(
            [
                AllocationRequest("p0", ["A"], _prices(1)),
                AllocationRequest("p1", ["A"], bad),
            ]
        )
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("requests[1].prices: ")
    assert "p0" not in server.servicer.state


def test_list_models(client: AllocatorClient) -> None:
    models = client.list_models()
    assert all(isinstance(m, ModelInfo) for m in models)
    assert [(m.name, m.version) for m in models] == [("alpha", "1"), ("alpha", "2"), ("wide", "10")]
    default = [m for m in models if m.is_default]
    assert [(m.name, m.version, m.window, m.max_assets) for m in default] == [("alpha", "2", 4, 5)]
    assert default[0].has_icm
    assert default[0].beta == 0.5
    assert default[0].provider == "CPUExecutionProvider"


def test_reset_portfolio(client: AllocatorClient) -> None:
    assert client.reset_portfolio("fund-9") is False
    client.allocate("fund-9", ["A"], _prices(1))
    assert client.reset_portfolio("fund-9") is True
    assert client.reset_portfolio("fund-9") is False
    assert client.allocate("fund-9", ["A"], _prices(1)).icm_reward is None


def test_health(client: AllocatorClient, server: Server) -> None:
    assert client.health() == {"": "SERVING", SERVICE_NAME: "SERVING"}
    assert client.is_serving()
    server.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert client.health()[SERVICE_NAME] == "NOT_SERVING"
    assert not client.is_serving()
    assert client.health(["no.such.Service"]) == {"no.such.Service": "SERVICE_UNKNOWN"}


def test_context_manager_closes_the_channel(server: Server) -> None:
    with AllocatorClient(server.target, token=TOKEN) as c:
        c.list_models()
    with pytest.raises(ValueError, match="closed channel"):
        c.list_models()


def test_mtls_needs_key_and_chain() -> None:
    with pytest.raises(ValueError, match="both private_key and certificate_chain"):
        AllocatorClient("127.0.0.1:1", private_key=b"key")


# --- TLS and mTLS, with certificates made here by openssl ---------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    ext = "subjectAltName=DNS:localhost,IP:127.0.0.1"
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.pem", cwd=d)  # fmt: skip
    return d


def test_tls_and_mtls(pki: Path) -> None:
    read = lambda name: (pki / name).read_bytes()  # noqa: E731
    credentials = grpc.ssl_server_credentials(
        [(read("server.key"), read("server.pem"))],
        root_certificates=read("ca.pem"),
        require_client_auth=True,
    )
    grpc_server, info = _start(EchoServicer(), credentials)
    try:
        with AllocatorClient(
            info.target,
            token=TOKEN,
            root_certificates=read("ca.pem"),
            private_key=read("client.key"),
            certificate_chain=read("client.pem"),
        ) as c:
            assert c.allocate("fund-1", ["A"], _prices(1)).asset_ids == ("CASH", "A")
        # TLS without a client certificate: the server demands one, so the handshake fails.
        with (
            AllocatorClient(info.target, token=TOKEN, root_certificates=read("ca.pem")) as c,
            pytest.raises(AllocatorError) as failure,
        ):
            c.list_models()
        assert failure.value.code is grpc.StatusCode.UNAVAILABLE
    finally:
        grpc_server.stop(grace=None)


# --- the `allocator request` command --------------------------------------------------------------


def _run(server: Server, tmp_path: Path, *args: str) -> tuple[int, str]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    result = CliRunner().invoke(
        request_command,
        ["--target", server.target, "--token-file", str(token_file), *args],
        catch_exceptions=False,
    )
    return result.exit_code, result.output


def test_request_command_synthetic_prints_a_table(server: Server, tmp_path: Path) -> None:
    code, out = _run(server, tmp_path, "--portfolio", "desk-1", "--synthetic", "3")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == ["asset", "raw", "smoothed"]
    assert [line.split()[0] for line in lines[2:6]] == ["CASH", "SYN1", "SYN2", "SYN3"]
    assert lines[2].split()[1] == "0.1000"
    assert "model       alpha version 2" in out
    assert "icm reward  -" in out
    assert "turnover    0.0000" in out
    assert "portfolio   desk-1" in out


def test_request_command_csv_json(server: Server, tmp_path: Path) -> None:
    window = 9  # the "wide" model's
    prices = _prices(3, window=window + 5, seed=3)
    csv_path = tmp_path / "prices.csv"
    rows = ["date,AAA,BBB,CCC"]
    rows += [f"2024-01-{d + 1:02d},{prices[0, d]},{prices[1, d]},{prices[2, d]}" for d in range(15)]
    csv_path.write_text("\n".join(rows) + "\n")
    code, out = _run(
        server, tmp_path, "--portfolio", "desk-2", "--prices-csv", str(csv_path),
        "--assets", "CCC,AAA", "--model", "wide", "--current-weights", "0.5,0.25,0.25",
        "--request-id", "cli-1", "--json",
    )  # fmt: skip
    assert code == 0, out
    data = json.loads(out)
    assert data["asset_ids"] == ["CASH", "CCC", "AAA"]
    assert data["request_id"] == "cli-1"
    assert (data["model_name"], data["model_version"]) == ("wide", "10")
    sent = np.stack([prices[2, -(window + 1) :], prices[0, -(window + 1) :]])
    np.testing.assert_allclose(data["raw_weights"], raw_weights(sent), rtol=1e-15)
    smoothed = np.array(data["smoothed_weights"])
    expected = np.abs(smoothed - [0.5, 0.25, 0.25])[1:].sum()
    assert data["turnover"] == pytest.approx(expected, abs=1e-12)


def test_request_command_reports_server_errors(server: Server, tmp_path: Path) -> None:
    code, out = _run(server, tmp_path, "--portfolio", "p", "--synthetic", "6")  # max_assets 5
    assert code == 1
    assert "INVALID_ARGUMENT: asset_ids: 6 assets" in out
    code, out = _run(server, tmp_path, "--portfolio", "p", "--synthetic", "2", "--model", "ghost")
    assert code == 1
    assert "model ghost is not loaded" in out


def test_request_command_wrong_token(server: Server, tmp_path: Path) -> None:
    token_file = tmp_path / "bad-token"
    token_file.write_text("nope")
    result = CliRunner().invoke(
        request_command,
        ["--target", server.target, "--portfolio", "p", "--synthetic", "1",
         "--token-file", str(token_file)],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "UNAUTHENTICATED" in result.output


def test_request_command_needs_one_price_source(server: Server, tmp_path: Path) -> None:
    code, out = _run(server, tmp_path, "--portfolio", "p")
    assert code == 2
    assert "exactly one of --prices-csv FILE and --synthetic N" in out


def test_read_prices_csv_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("date,A,B\n2024-01-01,1,2\n2024-01-02,x,3\n")
    with pytest.raises(click.ClickException, match=r"p.csv:3: A price 'x' is not a number"):
        read_prices_csv(path, 2)
    with pytest.raises(click.ClickException, match="2 data rows, the model needs the last 5"):
        read_prices_csv(path, 5)
    with pytest.raises(click.ClickException, match="no column for Q"):
        read_prices_csv(path, 1, ["Q"])
    assets, values = read_prices_csv(path, 1, ["B"])
    assert assets == ["B"]
    np.testing.assert_array_equal(values, [[3.0]])


def test_pick_model_follows_the_api_rules() -> None:
    def info(name: str, version: str, default: bool = False) -> ModelInfo:
        return ModelInfo(name, version, "td3", 5, 4, 0.5, False, "CPU", default)

    models = [info("a", "9"), info("a", "10"), info("b", "1", default=True)]
    assert pick_model(models, None, None).name == "b"
    assert pick_model(models, "a", None).version == "10"  # numeric, not lexicographic
    assert pick_model(models, "a", "9").version == "9"


def test_threads_share_one_client(client: AllocatorClient) -> None:
    """gRPC channels are thread-safe; the client adds no state that would break that."""
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(10):
                client.allocate(f"t{i}", ["A", "B"], _prices(2, seed=j))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
