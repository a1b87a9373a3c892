"""The server's event loop: uvloop by default, asyncio when configured, the same answers on both;
a missing uvloop is a clear error at start."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.server import EventLoopThread, ServerConfig
from tests.serving.server.helpers import batch_of, make_request, start_server


def answers(tmp_path: Path, registry: Path, kind: str) -> tuple[str, list[pb.AllocateResponse]]:
    """The loop's module and the answers to a fixed sequence of unary and batch calls."""
    server = start_server(tmp_path / kind, registry, event_loop=kind)
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.AllocatorStub(channel)
            out = [stub.Allocate(make_request("p", seed=k, request_id=f"p-{k}")) for k in range(3)]
            batch = batch_of(*(make_request(f"q{k}", seed=k, request_id=f"q{k}") for k in range(4)))
            out += list(stub.AllocateBatch(batch).responses)
        return type(server.loop.loop).__module__, out
    finally:
        server.stop()


def test_uvloop_by_default_and_asyncio_on_request_answer_alike(
    tiny_registry: Path, tmp_path: Path
) -> None:
    assert ServerConfig(registry=tiny_registry).event_loop == "uvloop"
    uv_module, uv = answers(tmp_path, tiny_registry, "uvloop")
    aio_module, aio = answers(tmp_path, tiny_registry, "asyncio")
    assert uv_module.startswith("uvloop")
    assert aio_module.startswith("asyncio")
    assert len(uv) == len(aio) == 7
    for a, b in zip(uv, aio, strict=True):
        assert (a.portfolio_id, a.request_id) == (b.portfolio_id, b.request_id)
        np.testing.assert_array_equal(a.raw_weights, b.raw_weights)
        np.testing.assert_array_equal(a.smoothed_weights, b.smoothed_weights)


def test_a_missing_uvloop_is_named_with_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what an install without it imports
    with pytest.raises(RuntimeError, match=r"uvloop is not installed.*event_loop: asyncio"):
        EventLoopThread("uvloop")
    thread = EventLoopThread("asyncio")
    try:
        assert isinstance(thread.loop, asyncio.AbstractEventLoop)
        assert thread.run(asyncio.sleep(0, result=7)) == 7
    finally:
        thread.close()
