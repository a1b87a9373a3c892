"""Token files: several tokens let a rotation overlap; comments and blank lines are skipped;
a file without a token is refused at start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from allocator.recording.migrations import upgrade
from allocator.serving.client import AllocatorClient, AllocatorError
from allocator.serving.security import read_tokens
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
