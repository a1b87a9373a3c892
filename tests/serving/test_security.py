"""Token files: several tokens let a rotation overlap; comments and blank lines are skipped;
a file without a token is refused at start. The ``Bearer`` scheme is matched in any case, the
token exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from allocator.recording.migrations import upgrade
from allocator.serving.client import AllocatorClient, AllocatorError
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.security import bearer_token, read_tokens
from allocator.serving.server import AllocationServer, ServerConfig, build_server


@pytest.fixture
def server(tiny_registry: Path, tmp_path: Path) -> Iterator[AllocationServer]:
    tokens = tmp_path / "tokens"
    tokens.write_text("# old token, remove after the rollout\nold-secret\n\nnew-secret\n")
    url = f"sqlite:///{tmp_path / 'trades.db'}"
    upgrade(url)
    built = build_server(
        ServerConfig(
            registry=tiny_registry,
            port=0,
            metrics_port=None,
            database_url=url,
            spool_dir=tmp_path / "spool",
            auth_token_file=tokens,
            prefer_cuda=False,
            default_model="tiny",
        )
    ).start()
    try:
        yield built
    finally:
        built.stop()


@pytest.mark.parametrize("token", ["old-secret", "new-secret"])
def test_every_listed_token_is_accepted(server: AllocationServer, token: str) -> None:
    with AllocatorClient(server.target, token=token) as client:
        assert client.list_models()


@pytest.mark.parametrize("token", ["# old token, remove after the rollout", "", "old-secre"])
def test_comments_and_near_misses_are_refused(server: AllocationServer, token: str) -> None:
    with (
        AllocatorClient(server.target, token=token or None) as client,
        pytest.raises(AllocatorError) as info,
    ):
        client.list_models()
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_a_file_without_a_token_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# nothing yet\n\n")
    with pytest.raises(ValueError, match="holds no token"):
        read_tokens(path)


def _list_models_with(server: AllocationServer, header: str) -> grpc.StatusCode:
    """The status of ListModels sent with ``authorization: header`` over a raw channel."""
    with grpc.insecure_channel(server.target) as channel:
        try:
            pb_grpc.AllocatorStub(channel).ListModels(
                pb.ListModelsRequest(), metadata=[("authorization", header)], timeout=10
            )
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    "header",
    ["Bearer new-secret", "bearer new-secret", "BEARER old-secret", "bEaReR  new-secret  "],
)
def test_the_bearer_scheme_is_case_insensitive(server: AllocationServer, header: str) -> None:
    """HTTP authentication schemes have no case (RFC 9110, 11.1); clients send either."""
    assert _list_models_with(server, header) is grpc.StatusCode.OK


@pytest.mark.parametrize(
    "header",
    [
        "new-secret",
        "Bearer",
        "Bearer ",
        "Basic new-secret",
        "Bearernew-secret",
        "Bearer NEW-SECRET",
        "Bearer new-secret x",
    ],
)
def test_anything_else_is_refused(server: AllocationServer, header: str) -> None:
    """Only the scheme has no case: the token itself is compared exactly."""
    assert _list_models_with(server, header) is grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER  a b ", "a b"),
        ("Bearer", None),
        ("Bearer   ", None),
        ("Token abc", None),
        (None, None),
        (b"Bearer abc", None),
    ],
)
def test_bearer_token_parsing(header: object, token: str | None) -> None:
    assert bearer_token(header) == token


def test_the_token_is_checked_before_the_bytes_are_read(server: AllocationServer) -> None:
    """A call without a valid token is refused whatever it carries, even bytes that are not a
    message; with one, those bytes are INVALID_ARGUMENT like anywhere else."""
    method = "/allocator.v1.Allocator/Allocate"
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_unary(method)  # raw bytes in and out
        for metadata, code in [
            ((), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", "Bearer wrong"),), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", "bearer new-secret"),), grpc.StatusCode.INVALID_ARGUMENT),
        ]:
            with pytest.raises(grpc.RpcError) as info:
                call(b"\xff", metadata=metadata, timeout=10)
            assert info.value.code() is code, info.value.details()
