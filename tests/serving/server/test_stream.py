"""AllocateStream on a real server: the answers of Allocate, in order, idempotent within and
across streams, a bad message answered with its own error while the stream goes on, every
decision recorded, the token required, and a drain that answers what arrived before ending.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from allocator.serving.aio_client import AsyncAllocatorClient
from allocator.serving.client import AllocationRequest, AllocatorClient
from allocator.serving.proto import SERVICE_NAME
from allocator.serving.proto.v1 import allocator_pb2 as pb
from tests.serving.server.helpers import (
    INVALID,
    NOT_FOUND,
    WAIT,
    Conn,
    connect,
    make_request,
    price_window,
    start_server,
    wait_for,
    weights,
)
from tests.serving.server.wire import BAD_UTF8, length_delimited

STREAM = f"/{SERVICE_NAME}/AllocateStream"


def _message(sequence: int, *requests: pb.AllocateRequest) -> pb.AllocateStreamRequest:
    batch = pb.AllocateBatchRequest(requests=list(requests))
    return pb.AllocateStreamRequest(sequence=sequence, batch=batch)


def _stream(conn: Conn, messages: list[pb.AllocateStreamRequest], **kwargs: object) -> list:
    kwargs.setdefault("timeout", 30.0)
    return list(conn.stub.AllocateStream(iter(messages), **kwargs))


def _raw_stream(conn: Conn, frames: list[bytes]) -> list[pb.AllocateStreamResponse]:
    """``frames`` sent as they are (bytes that need not decode); the responses decoded."""
    call = conn.channel.stream_stream(
        STREAM, response_deserializer=pb.AllocateStreamResponse.FromString
    )
    return list(call(iter(frames), timeout=30.0))


def _same_decision(a: pb.AllocateResponse, b: pb.AllocateResponse) -> None:
    assert tuple(a.asset_ids) == tuple(b.asset_ids)
    np.testing.assert_array_equal(weights(a, "raw"), weights(b, "raw"))
    np.testing.assert_array_equal(weights(a), weights(b))
    assert a.turnover == b.turnover
    assert a.HasField("icm_reward") == b.HasField("icm_reward")
    assert a.icm_reward == b.icm_reward
    assert (a.model.name, a.model.version) == (b.model.name, b.model.version)


def test_the_answers_of_allocate_in_request_order(shared: Conn) -> None:
    """Three bars of two portfolios through the stream step exactly as through Allocate."""
    tag = uuid.uuid4().hex[:6]
    unary, streamed = [], []
    messages = []
    for bar in range(3):
        requests = []
        for j, assets in enumerate((("A", "B", "C"), ("X", "Y"))):
            current = [0.1, 0.2, 0.3, 0.4] if (bar, j) == (1, 0) else None
            kwargs = {"seed": 10 * bar + j, "current": current, "model": "plain" if j else None}
            unary.append(shared.allocate(make_request(f"u{j}-{tag}", assets, **kwargs)))
            requests.append(make_request(f"s{j}-{tag}", assets, **kwargs))
        messages.append(_message(100 - bar, *requests))
    replies = _stream(shared, messages)
    assert [r.sequence for r in replies] == [100, 99, 98]  # echoed, in request order
    for reply, message in zip(replies, messages, strict=True):
        assert not reply.HasField("error")
        assert [r.request_id for r in reply.responses] == [
            r.request_id for r in message.batch.requests
        ]
        streamed.extend(reply.responses)
    for a, b in zip(unary, streamed, strict=True):
        _same_decision(a, b)
    assert shared.state(f"s0-{tag}").steps == 3


def test_retries_within_and_across_streams_step_once(shared: Conn) -> None:
    pid = f"retry-{uuid.uuid4().hex[:6]}"
    first = make_request(pid, seed=1, request_id=f"{pid}-1")
    second = make_request(pid, seed=2, request_id=f"{pid}-2")
    replies = _stream(shared, [_message(1, first), _message(2, first), _message(3, second)])
    assert [len(r.responses) for r in replies] == [1, 1, 1]
    assert replies[1].responses[0] == replies[0].responses[0]  # the same answer again
    assert shared.state(pid).steps == 2
    # A new stream: the portfolio's latest request is answered again; the first one, superseded
    # by the second, can no longer be (only the latest answer is kept): its own error reply.
    again = _stream(shared, [_message(1, second), _message(2, first), _message(3, second)])
    assert again[0].responses[0] == replies[2].responses[0]
    assert again[1].error.code == INVALID.value[0]
    assert "request_id" in again[1].error.message
    assert again[2].responses[0] == replies[2].responses[0]  # the stream went on
    assert shared.allocate(second) == replies[2].responses[0]  # and through Allocate
    assert shared.state(pid).steps == 2


def test_a_bad_message_gets_its_own_error_and_the_stream_goes_on(shared: Conn) -> None:
    pid = f"mid-{uuid.uuid4().hex[:6]}"
    bad_price = make_request(f"{pid}-b", prices=np.full((3, price_window(1).shape[1]), -1.0))
    frames = [
        _message(1, make_request(pid, seed=1)).SerializeToString(),
        _message(2, make_request(f"{pid}-x"), bad_price).SerializeToString(),
        b"\xff\xff\xff",  # not a message at all
        length_delimited(2, length_delimited(1, length_delimited(1, BAD_UTF8[0]))),  # an id
        _message(5, make_request(f"{pid}-p", model="nosuch")).SerializeToString(),
        _message(6).SerializeToString(),  # no request
        _message(7, make_request(pid, seed=7)).SerializeToString(),
    ]
    replies = _raw_stream(shared, frames)
    assert [r.sequence for r in replies] == [1, 2, 0, 0, 5, 6, 7]
    errors = [(r.error.code, r.error.message) for r in replies if r.HasField("error")]
    assert [code for code, _ in errors] == [
        INVALID.value[0],
        INVALID.value[0],
        INVALID.value[0],
        NOT_FOUND.value[0],
        INVALID.value[0],
    ]
    assert errors[0][1].startswith("requests[1].prices")
    assert errors[1][1].startswith(f"request: the 3 bytes sent to {STREAM} are not a valid ")
    assert "UTF-8" in errors[2][1]
    assert errors[3][1].startswith("requests[0].model")
    assert errors[4][1].startswith("requests:")
    assert all(not r.responses for r in replies if r.HasField("error"))
    assert len(replies[0].responses) == len(replies[6].responses) == 1
    assert shared.state(pid).steps == 2  # the bad messages decided nothing
    assert shared.state(f"{pid}-x") is None  # all or nothing within a message
    assert shared.serving()


def test_every_streamed_decision_is_recorded_and_counted(
    tiny_registry: Path, tmp_path: Path
) -> None:
    server = start_server(tmp_path, tiny_registry)
    conn = connect(server)
    try:
        bars = [
            _message(
                k, *(make_request(f"rec{j}", seed=k + j, request_id=f"r{k}-{j}") for j in range(5))
            )
            for k in range(1, 7)
        ]
        retry = _message(99, make_request("rec0", seed=3, request_id="r3-0"))  # answered again
        broken = _message(100, make_request("rec9", model="nosuch"))
        replies = _stream(conn, [*bars[:3], retry, broken, *bars[3:]])
        ok = sum(len(r.responses) for r in replies if not r.HasField("error"))
        assert ok == 6 * 5 + 1
        count = conn.counter
        labels = {"grpc_method": "AllocateStream"}
        assert count("allocator_serving_requests_total", grpc_code="OK", **labels) == 7
        assert count("allocator_serving_requests_total", grpc_code="NOT_FOUND", **labels) == 1
        call = {**labels, "grpc_type": "bidi_stream", "grpc_service": SERVICE_NAME}
        assert count("grpc_server_msg_received_total", **call) == 8
        assert count("grpc_server_msg_sent_total", **call) == 8
        assert count("grpc_server_started_total", **call) == 1
        handled = {**call, "grpc_code": "OK", "model": "", "version": ""}
        wait_for(lambda: count("grpc_server_handled_total", **handled) == 1, "the stream's end")
    finally:
        conn.channel.close()
        server.stop()
    db = sqlite3.connect(tmp_path / "trades.db")
    try:
        ids = [r[0] for r in db.execute("SELECT request_id FROM decisions")]
    finally:
        db.close()
    assert sorted(ids) == sorted(f"r{k}-{j}" for k in range(1, 7) for j in range(5))


def test_streams_need_the_token(tiny_registry: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    server = start_server(tmp_path, tiny_registry, auth_token_file=token_file, record=False)
    conn = connect(server)
    try:
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            for messages in ([], [_message(1, make_request("tok"))]):  # refused before a message
                with pytest.raises(grpc.RpcError) as info:
                    _stream(conn, messages, metadata=metadata)
                assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert conn.state("tok") is None
        with AllocatorClient(server.target, token="s3cret") as client:
            request = AllocationRequest("tok", ["A", "B"], price_window(2))
            (answer,) = client.allocate_stream([[request]])
        assert answer.error is None
        assert answer.sequence == 1
        assert answer.allocations[0].portfolio_id == "tok"
    finally:
        conn.channel.close()
        server.stop()


def test_clients_number_batches_and_surface_errors(shared: Conn) -> None:
    tag = uuid.uuid4().hex[:6]
    good = [AllocationRequest(f"c{j}-{tag}", ["A", "B"], price_window(2, j)) for j in range(3)]
    bad = [AllocationRequest(f"cb-{tag}", ["A", "cash"], price_window(2))]
    with AllocatorClient(shared.server.target) as client:
        answers = list(client.allocate_stream([good, bad, good[:1]]))
    assert [a.sequence for a in answers] == [1, 2, 3]
    assert [len(a.allocations) for a in answers] == [3, 0, 1]
    assert answers[1].error is not None
    assert answers[1].error.code is INVALID
    assert answers[1].error.details.startswith("requests[0].asset_ids[1]")

    async def run() -> list:
        async def batches() -> AsyncIterator[list[AllocationRequest]]:
            for batch in ([good[0]], bad):
                yield batch

        async with AsyncAllocatorClient(shared.server.target) as client:
            return [a async for a in client.allocate_stream(batches())]

    streamed = asyncio.run(run())
    assert [a.sequence for a in streamed] == [1, 2]
    assert streamed[0].error is None
    assert streamed[1].error is not None
    assert shared.state(f"c0-{tag}").steps == 3


def test_a_drain_answers_what_arrived_then_ends_open_streams(
    tiny_registry: Path, tmp_path: Path
) -> None:
    """SIGTERM's drain: a stream whose client is quiet ends with UNAVAILABLE at once, its
    answered messages answered, instead of being cut off when the grace period ends."""
    server = start_server(tmp_path, tiny_registry, record=False, drain_seconds=5.0)
    conn = connect(server)
    outbox: queue.Queue[pb.AllocateStreamRequest | None] = queue.Queue()
    stream = conn.stub.AllocateStream(iter(outbox.get, None), timeout=30)
    outbox.put(_message(1, make_request("drain", seed=1)))
    assert next(stream).sequence == 1  # answered; the client now stays quiet
    wait_for(lambda: server.servicer.in_flight == 1, "the stream to be open")
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    try:
        with pytest.raises(grpc.RpcError) as info:
            next(stream)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "new stream" in (info.value.details() or "")
    finally:
        outbox.put(None)
        stopper.join(WAIT)
        conn.channel.close()
    assert not stopper.is_alive()
    assert server.servicer.in_flight == 0


def test_a_drain_mid_stream_leaves_no_decision_unanswered(
    tiny_registry: Path, tmp_path: Path
) -> None:
    """Stopped while messages wait: what was decided was answered (and recorded), in order;
    the rest decided nothing and can be resent on a new stream."""
    server = start_server(tmp_path, tiny_registry, drain_seconds=5.0)
    conn = connect(server)
    outbox: queue.Queue[pb.AllocateStreamRequest | None] = queue.Queue()
    for k in range(1, 41):
        outbox.put(_message(k, make_request(f"busy{k}", seed=k, request_id=f"busy-{k}")))
    stream = conn.stub.AllocateStream(iter(outbox.get, None), timeout=60)
    answered = [next(stream)]  # under way
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    try:
        with pytest.raises(grpc.RpcError) as info:
            answered.extend(stream)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        outbox.put(None)
        stopper.join(WAIT)
        conn.channel.close()
    assert not stopper.is_alive()
    assert [r.sequence for r in answered] == list(range(1, len(answered) + 1))
    assert all(len(r.responses) == 1 for r in answered)
    db = sqlite3.connect(tmp_path / "trades.db")
    try:
        recorded = sorted(r[0] for r in db.execute("SELECT request_id FROM decisions"))
    finally:
        db.close()
    assert recorded == sorted(f"busy-{r.sequence}" for r in answered)
