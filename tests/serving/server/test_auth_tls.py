"""Bearer tokens, TLS and mTLS on a real server."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from allocator.serving.client import AllocatorClient, AllocatorError
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from tests.serving.certs import Pki, have_openssl, make_pki
from tests.serving.server.helpers import (
    make_request,
    price_window,
    start_server,
)


def test_bearer_token(tiny_registry: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  correct horse battery staple\n")
    server = start_server(tmp_path, tiny_registry, auth_token_file=token_file, record=False)
    try:
        good = make_request("auth")
        for token in (
            None,
            "wrong",
            "correct horse battery stapl",
            "correct horse battery staple!",
        ):
            with AllocatorClient(server.target, token=token) as client:
                with pytest.raises(AllocatorError) as info:
                    client.allocate("auth", ["A"], price_window(1))
                assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
                assert "bearer token" in info.value.details
                # Health (and so Kubernetes probes) needs no token.
                assert client.is_serving()
        # A header that is not "Bearer ..." counts as missing.
        channel = grpc.insecure_channel(server.target)
        stub = pb_grpc.AllocatorStub(channel)
        with pytest.raises(grpc.RpcError) as raw:
            stub.ListModels(
                pb.ListModelsRequest(),
                metadata=[("authorization", "correct horse battery staple")],
                timeout=10,
            )
        assert raw.value.code() is grpc.StatusCode.UNAUTHENTICATED
        channel.close()
        with AllocatorClient(server.target, token="correct horse battery staple") as client:
            answer = client.allocate(
                "auth", ["A", "B", "C"], np.asarray(good.prices).reshape(3, -1)
            )
            assert answer.smoothed_weights.sum() == pytest.approx(1.0)
            assert {m.name for m in client.list_models()} == {"tiny", "plain"}
        denied = server.metrics_registry.get_sample_value(
            "allocator_serving_requests_total",
            {"grpc_method": "Allocate", "grpc_code": "UNAUTHENTICATED"},
        )
        assert denied == 4.0
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if not have_openssl():
        pytest.skip("openssl is not installed")
    return make_pki(tmp_path_factory.mktemp("pki"))


def _ok(client: AllocatorClient) -> bool:
    return client.allocate("tls", ["A", "B"], price_window(2)).asset_ids == ("CASH", "A", "B")


def _refused(client: AllocatorClient) -> grpc.StatusCode:
    with pytest.raises(AllocatorError) as info:
        client.list_models(timeout=10)
    return info.value.code


def test_tls(tiny_registry: Path, tmp_path: Path, pki: Pki) -> None:
    server = start_server(
        tmp_path,
        tiny_registry,
        tls_cert=pki.path("server.pem"),
        tls_key=pki.path("server.key"),
        record=False,
    )
    try:
        with AllocatorClient(server.target, root_certificates=pki.read("ca.pem")) as client:
            assert _ok(client)
            assert client.is_serving()
        with AllocatorClient(server.target, timeout=5) as plaintext:
            assert _refused(plaintext) is grpc.StatusCode.UNAVAILABLE
        # A client that trusts another CA does not accept the server's certificate.
        with AllocatorClient(server.target, root_certificates=pki.read("client-ca.pem")) as other:
            assert _refused(other) is grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()


def test_mtls(tiny_registry: Path, tmp_path: Path, pki: Pki) -> None:
    server = start_server(
        tmp_path,
        tiny_registry,
        tls_cert=pki.path("server.pem"),
        tls_key=pki.path("server.key"),
        tls_client_ca=pki.path("client-ca.pem"),
        record=False,
    )
    ca = pki.read("ca.pem")
    try:
        with AllocatorClient(
            server.target,
            root_certificates=ca,
            private_key=pki.read("client.key"),
            certificate_chain=pki.read("client.pem"),
        ) as client:
            assert _ok(client)
        with AllocatorClient(server.target, root_certificates=ca) as no_cert:
            assert _refused(no_cert) is grpc.StatusCode.UNAVAILABLE
        # Signed by a CA the server knows, but not by the client CA: refused.
        with AllocatorClient(
            server.target,
            root_certificates=ca,
            private_key=pki.read("rogue.key"),
            certificate_chain=pki.read("rogue.pem"),
        ) as rogue:
            assert _refused(rogue) is grpc.StatusCode.UNAVAILABLE
        with AllocatorClient(server.target, timeout=5) as plaintext:
            assert _refused(plaintext) is grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()
