"""The client against a tiny real gRPC server (``tests.serving.echo``)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2

from allocator.serving.client import (
    Allocation,
    AllocationRequest,
    AllocatorClient,
    AllocatorError,
    ModelInfo,
)
from allocator.serving.proto import SERVICE_NAME
from tests.serving.echo import (
    TOKEN,
    EchoServicer,
    Server,
    echo_prices,
    raw_weights,
    serving_echo,
    start_echo,
)


@pytest.fixture
def server() -> Iterator[Server]:
    with serving_echo() as info:
        yield info


@pytest.fixture
def client(server: Server) -> Iterator[AllocatorClient]:
    with AllocatorClient(server.target, token=TOKEN, timeout=5.0) as c:
        yield c


# --- calls --------------------------------------------------------------------------------------


def test_allocate_round_trip(client: AllocatorClient, server: Server) -> None:
    prices = echo_prices(3)
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
        "fund-1", ["AAPL", "MSFT", "JPM"], echo_prices(3, seed=1), request_id="r-2"
    )
    assert second.request_id == "r-2"
    assert second.icm_reward == 0.25
    expected = 0.5 * (raw_weights(echo_prices(3, seed=1)) + allocation.smoothed_weights)
    np.testing.assert_allclose(second.smoothed_weights, expected, rtol=0, atol=1e-15)
    assert second.turnover > 0.0


def test_allocate_sends_current_weights_and_pin(client: AllocatorClient) -> None:
    current = np.array([0.4, 0.3, 0.3])
    allocation = client.allocate(
        "fund-2", ["X", "Y"], echo_prices(2, window=9), current, model="wide", version="10"
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
        c.allocate("fund-1", ["A"], echo_prices(1))
    assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert "bearer token" in info.value.details
    sent = server.servicer.metadata_seen[-1].get("authorization")
    assert sent == (None if token is None else f"Bearer {token}")


def test_invalid_argument_carries_the_field(client: AllocatorClient) -> None:
    prices = echo_prices(2)
    prices[1, 3] = np.nan
    with pytest.raises(AllocatorError) as info:
        client.allocate("fund-1", ["A", "B"], prices)
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("prices: ")
    assert "'B'" in info.value.details
    assert str(info.value).startswith("INVALID_ARGUMENT: prices: ")


def test_unknown_model_is_not_found(client: AllocatorClient) -> None:
    with pytest.raises(AllocatorError) as info:
        client.allocate("fund-1", ["A"], echo_prices(1), model="ghost")
    assert info.value.code is grpc.StatusCode.NOT_FOUND
    assert "ghost" in info.value.details


def test_prices_must_be_one_row_per_asset(client: AllocatorClient) -> None:
    with pytest.raises(ValueError, match=r"shape \(len\(asset_ids\), window \+ 1\)"):
        client.allocate("fund-1", ["A", "B"], echo_prices(2).ravel())
    with pytest.raises(ValueError, match="got \\(3, 5\\)"):
        client.allocate("fund-1", ["A", "B"], echo_prices(3))


def test_deadline_is_honoured(server: Server) -> None:
    server.servicer.delay = 0.5
    with AllocatorClient(server.target, token=TOKEN, timeout=0.05) as c:
        started = time.perf_counter()
        with pytest.raises(AllocatorError) as info:
            c.allocate("fund-1", ["A"], echo_prices(1))
        assert time.perf_counter() - started < 0.4
        assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        server.servicer.delay = 0.0
        assert c.allocate("fund-1", ["A"], echo_prices(1), timeout=5.0).asset_ids == ("CASH", "A")


def test_unreachable_server_is_unavailable() -> None:
    with AllocatorClient("127.0.0.1:1", timeout=1.0) as c, pytest.raises(AllocatorError) as info:
        c.list_models()
    assert info.value.code is grpc.StatusCode.UNAVAILABLE


def test_allocate_batch_in_order_with_dicts_and_requests(client: AllocatorClient) -> None:
    requests = [
        AllocationRequest("p0", ["A", "B"], echo_prices(2, seed=0), request_id="b0"),
        {"portfolio_id": "p1", "asset_ids": ["C"], "prices": echo_prices(1, seed=1)},
        {
            "portfolio_id": "p2",
            "asset_ids": ["X", "Y", "Z"],
            "prices": echo_prices(3, window=9, seed=2),
            "model": "wide",
        },
    ]
    allocations = client.allocate_batch(requests)
    assert [a.portfolio_id for a in allocations] == ["p0", "p1", "p2"]
    assert allocations[0].request_id == "b0"
    assert allocations[2].asset_ids == ("CASH", "X", "Y", "Z")
    assert allocations[2].model_name == "wide"
    np.testing.assert_array_equal(allocations[1].raw_weights, raw_weights(echo_prices(1, seed=1)))


def test_batch_is_all_or_nothing(client: AllocatorClient, server: Server) -> None:
    bad = echo_prices(1)
    bad[0, 0] = -1.0
    with pytest.raises(AllocatorError) as info:
        client.allocate_batch(
            [
                AllocationRequest("p0", ["A"], echo_prices(1)),
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
    client.allocate("fund-9", ["A"], echo_prices(1))
    assert client.reset_portfolio("fund-9") is True
    assert client.reset_portfolio("fund-9") is False
    assert client.allocate("fund-9", ["A"], echo_prices(1)).icm_reward is None


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
    grpc_server, info = start_echo(EchoServicer(), credentials)
    try:
        with AllocatorClient(
            info.target,
            token=TOKEN,
            root_certificates=read("ca.pem"),
            private_key=read("client.key"),
            certificate_chain=read("client.pem"),
        ) as c:
            assert c.allocate("fund-1", ["A"], echo_prices(1)).asset_ids == ("CASH", "A")
        # TLS without a client certificate: the server demands one, so the handshake fails.
        with (
            AllocatorClient(info.target, token=TOKEN, root_certificates=read("ca.pem")) as c,
            pytest.raises(AllocatorError) as failure,
        ):
            c.list_models()
        assert failure.value.code is grpc.StatusCode.UNAVAILABLE
    finally:
        grpc_server.stop(grace=None)


def test_threads_share_one_client(client: AllocatorClient) -> None:
    """gRPC channels are thread-safe; the client adds no state that would break that."""
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(10):
                client.allocate(f"t{i}", ["A", "B"], echo_prices(2, seed=j))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
