"""Dynamic batching: concurrent calls decided together, per portfolio in arrival order, each
batch recorded by one durable commit.

The server tests go through real gRPC; the batcher tests drive ``DecisionBatcher`` on an event
loop of their own with a real recorder on SQLite, whose sink a test can hold (``GatedSink``) to
let calls pile up behind a batch that waits for its commit.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from allocator.recording.migrations import upgrade
from allocator.recording.recorder import Recorder
from allocator.recording.records import ModelRecord
from allocator.serving import LoadedModel
from allocator.serving.batcher import DecisionBatcher
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.state import MemoryStateStore
from allocator.serving.step import Answer, DecisionStep, Item, model_shape
from tests.recording.gated_sink import GatedSink, rows
from tests.serving.conftest import items_for
from tests.serving.requests import validate_one
from tests.serving.server.helpers import make_request, start_server

WAIT = 20.0


def decided_batches(registry: CollectorRegistry) -> tuple[float, float]:
    """(batches, decisions) the server's batch-size histogram has seen."""
    count = registry.get_sample_value("allocator_serving_decided_batch_size_count")
    total = registry.get_sample_value("allocator_serving_decided_batch_size_sum")
    return float(count or 0.0), float(total or 0.0)


def one_by_one(model: LoadedModel, requests: list[pb.AllocateRequest]) -> list[pb.AllocateResponse]:
    """Each request decided alone, in order, by the synchronous step on a fresh store."""
    step = DecisionStep(MemoryStateStore())
    return [step.allocate(r, lambda *_: model).response for r in requests]


def test_concurrent_unary_calls_are_decided_in_one_batch(
    tiny_registry: Path, tiny_model: LoadedModel, tmp_path: Path
) -> None:
    """Six unary calls arriving while another call is open (a stream that has sent nothing
    yet, so the window is waited): one batch of six (one onnxruntime call, closed at the size
    cap), answers equal to deciding each alone."""
    server = start_server(tmp_path, tiny_registry, batch_window_ms=100.0, batch_max_decisions=6)
    requests = [make_request(f"p{k}", seed=k) for k in range(6)]
    hold = threading.Event()

    def silent() -> Iterator[pb.AllocateStreamRequest]:
        hold.wait(WAIT)
        return
        yield  # a generator that ends without a message

    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.AllocatorStub(channel)
            stream = stub.AllocateStream(silent(), timeout=WAIT)
            deadline = time.monotonic() + WAIT
            while server.servicer.in_flight < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            calls = [stub.Allocate.future(r, timeout=WAIT) for r in requests]
            answers = [c.result() for c in calls]
            hold.set()
            assert list(stream) == []
        assert decided_batches(server.metrics_registry) == (1.0, 6.0)
    finally:
        hold.set()
        server.stop()
    for got, alone in zip(answers, one_by_one(tiny_model, requests), strict=True):
        assert got.portfolio_id == alone.portfolio_id
        np.testing.assert_allclose(got.raw_weights, alone.raw_weights, rtol=0, atol=1e-6)
        np.testing.assert_allclose(got.smoothed_weights, alone.smoothed_weights, rtol=0, atol=1e-6)


# --- the batcher on a loop of its own ---------------------------------------------------------


@pytest.fixture
def gated(tmp_path: Path, tiny_model: LoadedModel) -> Iterator[tuple[Recorder, GatedSink, str]]:
    url = f"sqlite:///{tmp_path / 'trade.db'}"
    upgrade(url)
    sink = GatedSink(url)
    recorder = Recorder(url, tmp_path / "spool", sink=sink, commit_window=0.0).start()
    m = tiny_model
    recorder.register_model(
        ModelRecord(
            m.name,
            m.version,
            m.manifest.algorithm,
            m.manifest.model_dump(mode="json"),
            dict(m.manifest.files),
        )
    )
    try:
        yield recorder, sink, url
    finally:
        sink.gate.set()
        recorder.close(10)


def items(model: LoadedModel, request: pb.AllocateRequest) -> list[Item]:
    return items_for(model, [validate_one(request, model_shape(model))])


async def decide_all(
    batcher: DecisionBatcher, model: LoadedModel, requests: list[pb.AllocateRequest]
) -> list[list[Answer]]:
    """Hand every request to the batcher in order, in the same loop turn; their answers."""
    batcher.start()
    try:
        calls = [batcher.decide(items(model, r), None) for r in requests]
        return list(await asyncio.gather(*calls))
    finally:
        await batcher.close()


def test_two_requests_for_one_portfolio_in_a_window_are_decided_in_arrival_order(
    tiny_model: LoadedModel, gated: tuple[Recorder, GatedSink, str]
) -> None:
    recorder, sink, _ = gated
    store = MemoryStateStore()
    sizes: list[int] = []
    batcher = DecisionBatcher(
        DecisionStep(store, recorder), window=0.05, max_size=64, observe=sizes.append
    )
    first = make_request("p", request_id="r1", seed=1)
    other = make_request("q", request_id="r2", seed=2)
    second = make_request("p", request_id="r3", seed=3)
    answers = asyncio.run(decide_all(batcher, tiny_model, [first, other, second]))
    assert sizes == [2, 1]  # p's second request waited for the batch after its first
    assert sink.writes == [2, 1]
    with store.locked(["p"]) as session:
        state = session.get()[0]
    assert state is not None
    assert state.steps == 2
    assert state.last is not None
    assert state.last.request_id == "r3"
    expected = one_by_one(tiny_model, [first, second])
    np.testing.assert_allclose(
        answers[2][0].response.smoothed_weights, expected[1].smoothed_weights, rtol=0, atol=1e-6
    )


def test_a_request_id_reused_for_another_portfolio_in_a_window_is_refused(
    tiny_model: LoadedModel, gated: tuple[Recorder, GatedSink, str]
) -> None:
    """Two calls in one window with one request id and two portfolios: the second waits for
    the next batch and is refused there, so no OK answer goes unrecorded."""
    recorder, _, url = gated
    batcher = DecisionBatcher(
        DecisionStep(MemoryStateStore(), recorder, recent_requests=100), window=0.05, max_size=64
    )
    first = make_request("p", request_id="r1", seed=1)
    reused = make_request("q", request_id="r1", seed=2)

    async def scenario() -> tuple[BaseException | list[Answer], ...]:
        batcher.start()
        calls = [batcher.decide(items(tiny_model, r), None) for r in (first, reused)]
        out = await asyncio.gather(*calls, return_exceptions=True)
        await batcher.close()
        return tuple(out)

    answered, refused = asyncio.run(scenario())
    assert isinstance(answered, list)
    assert isinstance(refused, Exception)
    assert "already used for another portfolio" in str(refused)
    assert rows(url) == 1


def test_a_retry_in_the_same_window_gets_the_stored_answer(
    tiny_model: LoadedModel, gated: tuple[Recorder, GatedSink, str]
) -> None:
    recorder, _, url = gated
    batcher = DecisionBatcher(DecisionStep(MemoryStateStore(), recorder), window=0.05, max_size=64)
    request = make_request("p", request_id="r1", seed=4)
    first, retry = asyncio.run(decide_all(batcher, tiny_model, [request, request]))
    assert retry[0].data == first[0].data
    assert retry[0].output is None  # answered from the state, not decided again
    assert rows(url) == 1


def test_a_lone_call_is_not_kept_waiting_for_the_window(
    tiny_model: LoadedModel, gated: tuple[Recorder, GatedSink, str]
) -> None:
    """With no other call in flight the window is not waited (a 30 s window would fail the
    test's 10 s bound); with one more in flight, the first call waits for it and both are
    decided in one batch."""
    recorder, _, _ = gated
    sizes: list[int] = []
    in_flight = [1]
    batcher = DecisionBatcher(
        DecisionStep(MemoryStateStore(), recorder),
        window=30.0,
        max_size=64,
        observe=sizes.append,
        in_flight=lambda: in_flight[0],
    )

    async def scenario() -> None:
        batcher.start()
        lone = batcher.decide(items(tiny_model, make_request("p0", seed=0)), None)
        await asyncio.wait_for(lone, 10.0)
        in_flight[0] = 2  # a second call is being read: the first waits for it
        first = asyncio.ensure_future(
            batcher.decide(items(tiny_model, make_request("p1", seed=1)), None)
        )
        await asyncio.sleep(0.1)
        assert not first.done()
        second = batcher.decide(items(tiny_model, make_request("p2", seed=2)), None)
        await asyncio.wait_for(asyncio.gather(first, second), 10.0)
        await batcher.close()

    asyncio.run(scenario())
    assert sizes == [1, 2]


def test_a_batch_is_one_durable_commit(
    tiny_model: LoadedModel, gated: tuple[Recorder, GatedSink, str]
) -> None:
    """Calls arriving while a batch waits for its commit form the next batch: one ticket, one
    commit of all of them."""
    recorder, sink, url = gated
    sizes: list[int] = []
    batcher = DecisionBatcher(
        DecisionStep(MemoryStateStore(), recorder), window=0.0, max_size=64, observe=sizes.append
    )

    async def scenario() -> list[list[Answer]]:
        batcher.start()
        sink.gate.clear()
        head = asyncio.ensure_future(
            batcher.decide(items(tiny_model, make_request("p0", seed=0)), None)
        )
        while recorder.stats().submitted < 1:  # the first batch waits for its commit
            await asyncio.sleep(0.005)
        rest = [
            asyncio.ensure_future(
                batcher.decide(items(tiny_model, make_request(f"p{k}", seed=k)), None)
            )
            for k in range(1, 6)
        ]
        deadline = time.monotonic() + WAIT
        while batcher.waiting < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.get_running_loop().run_in_executor(None, sink.gate.set)
        answers = await asyncio.gather(head, *rest)
        await batcher.close()
        return list(answers)

    answers = asyncio.run(scenario())
    assert len(answers) == 6
    assert sizes == [1, 5]
    assert sink.writes == [1, 5]  # one commit per batch
    assert rows(url) == 6


def test_a_refused_call_leaves_the_others_of_its_batch_alone(
    tiny_model: LoadedModel, gated: tuple[Recorder, GatedSink, str]
) -> None:
    """A call whose deadline passed before deciding fails alone; its batch is decided."""
    recorder, _, url = gated
    batcher = DecisionBatcher(DecisionStep(MemoryStateStore(), recorder), window=0.05, max_size=64)

    async def scenario() -> tuple[BaseException | list[Answer], ...]:
        batcher.start()
        late = batcher.decide(items(tiny_model, make_request("p1", seed=1)), time.monotonic())
        on_time = batcher.decide(items(tiny_model, make_request("p2", seed=2)), None)
        out = await asyncio.gather(late, on_time, return_exceptions=True)
        await batcher.close()
        return tuple(out)

    late, on_time = asyncio.run(scenario())
    assert isinstance(late, Exception)
    assert "before deciding" in str(late)
    assert isinstance(on_time, list)
    assert on_time[0].request.portfolio_id == "p2"
    assert rows(url) == 1


def test_a_blocking_store_runs_on_the_executor(
    tiny_model: LoadedModel, gated: tuple[Recorder, GatedSink, str]
) -> None:
    """With an executor (the Redis store's path), the locks are taken and released off the
    loop, and the answers are the same."""
    recorder, _, _ = gated
    with ThreadPoolExecutor(2) as executor:
        batcher = DecisionBatcher(
            DecisionStep(MemoryStateStore(), recorder),
            window=0.01,
            max_size=64,
            executor=executor,
        )
        requests = [make_request(f"p{k}", seed=k) for k in range(3)]
        answers = asyncio.run(decide_all(batcher, tiny_model, requests))
    for got, alone in zip(answers, one_by_one(tiny_model, requests), strict=True):
        np.testing.assert_allclose(
            got[0].response.smoothed_weights, alone.smoothed_weights, rtol=0, atol=1e-6
        )
