"""The decision step with durable acknowledgement: nothing advances before the record is durable.

A real recorder on a real SQLite database, whose sink a test holds (``GatedSink``) to look at
the step while a decision is decided but not yet committed; the callers' deadlines are the
batcher's (the server's path).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from allocator.recording.migrations import upgrade
from allocator.recording.recorder import Recorder
from allocator.recording.records import ModelRecord
from allocator.serving import LoadedModel
from allocator.serving import batcher as batcher_module
from allocator.serving.batcher import DeadlineExceededError, DecisionBatcher
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.state import MemoryStateStore
from allocator.serving.step import Answer, DecisionStep, model_shape
from tests.recording.gated_sink import GatedSink
from tests.serving.conftest import TINY, allocate_request, items_for
from tests.serving.requests import validate_one


@pytest.fixture
def gated(tmp_path: Path, tiny_model: LoadedModel) -> Iterator[tuple[Recorder, GatedSink, str]]:
    url = f"sqlite:///{tmp_path / 'trade.db'}"
    upgrade(url)
    sink = GatedSink(url)
    recorder = Recorder(url, tmp_path / "spool", sink=sink, flush_interval=0.005).start()
    m = tiny_model
    manifest = m.manifest.model_dump(mode="json")
    recorder.register_model(
        ModelRecord(m.name, m.version, m.manifest.algorithm, manifest, dict(m.manifest.files))
    )
    try:
        yield recorder, sink, url
    finally:
        sink.gate.set()
        recorder.close(10)


def request(request_id: str) -> pb.AllocateRequest:
    rng = np.random.default_rng(7)
    prices = 50.0 * np.exp(np.cumsum(rng.normal(0, 0.02, (3, TINY.window + 1)), axis=1))
    return allocate_request(("A", "B", "C"), prices, portfolio_id="p", request_id=request_id)


def steps(store: MemoryStateStore) -> int:
    with store.locked(["p"]) as session:
        state = session.get()[0]
    return 0 if state is None else state.steps


def recorded_weights(url: str, request_id: str) -> list[float]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        (weights,) = db.execute(
            "SELECT smoothed_weights FROM decisions WHERE request_id = ?", (request_id,)
        ).fetchone()
    return list(json.loads(weights))


async def decide_late(
    batcher: DecisionBatcher, model: LoadedModel, request_id: str
) -> tuple[asyncio.Future[list[Answer]], float]:
    """A call whose deadline is 0.1 s away, handed to a started batcher; its answer to come."""
    batcher.start()
    items = items_for(model, [validate_one(request(request_id), model_shape(model))])
    deadline = time.monotonic() + 0.1
    return asyncio.ensure_future(batcher.decide(items, deadline)), deadline


def test_a_decision_durable_after_the_deadline_is_kept_and_fetched_by_its_request_id(
    gated: tuple[Recorder, GatedSink, str], tiny_model: LoadedModel
) -> None:
    """The record and the state never part: a decision recorded after the deadline advances
    the portfolio, and a retry of its request id gets exactly what was recorded."""
    recorder, sink, url = gated
    store = MemoryStateStore()
    step = DecisionStep(store, recorder, recent_requests=100)
    batcher = DecisionBatcher(step, window=0.0, max_size=64)
    sink.gate.clear()

    async def scenario() -> BaseException | None:
        late, _ = await decide_late(batcher, tiny_model, "r1")
        await asyncio.sleep(0.4)
        assert not late.done(), "the batcher gave up on a decision the recorder still holds"
        # Nothing advances before the record is durable (peeked at: the batch holds the lock).
        assert "p" not in store._states
        sink.gate.set()
        (exc,) = await asyncio.gather(late, return_exceptions=True)
        await batcher.close()
        return exc if isinstance(exc, BaseException) else None

    exc = asyncio.run(scenario())
    assert isinstance(exc, DeadlineExceededError)
    assert exc.late
    assert "retry the request_id" in str(exc)
    assert steps(store) == 1
    retry = step.allocate(request("r1"), lambda *_: tiny_model)
    assert retry.output is None, "answered from the portfolio's state, not decided again"
    np.testing.assert_allclose(retry.response.smoothed_weights, recorded_weights(url, "r1"))
    after = step.allocate(request("r2"), lambda *_: tiny_model)
    assert after.output is not None
    assert steps(store) == 2  # the next decision smooths from the recorded one


def test_a_decision_still_not_durable_well_after_the_deadline_advances_nothing(
    gated: tuple[Recorder, GatedSink, str],
    tiny_model: LoadedModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder, sink, url = gated
    monkeypatch.setattr(batcher_module, "LATE_DURABLE_SECONDS", 0.2)
    store = MemoryStateStore()
    step = DecisionStep(store, recorder, recent_requests=100)
    batcher = DecisionBatcher(step, window=0.0, max_size=64)
    sink.gate.clear()

    async def scenario() -> None:
        late, _ = await decide_late(batcher, tiny_model, "r1")
        try:
            with pytest.raises(DeadlineExceededError, match="recording") as raised:
                await late
            assert not raised.value.late
            assert steps(store) == 0
            sink.gate.set()
            # The record lands after all (the call was not answered OK), while the loop the
            # recorder settles its futures on still runs.
            flushed = asyncio.get_running_loop().run_in_executor(None, recorder.flush, 10)
            assert await flushed
        finally:
            await batcher.close()

    asyncio.run(scenario())
    retry = step.allocate(request("r1"), lambda *_: tiny_model)
    assert retry.output is not None, "decided again, not served from a cache"
    assert steps(store) == 1
    # Same state and inputs: the retry answers what the database kept for that request id.
    np.testing.assert_allclose(retry.response.smoothed_weights, recorded_weights(url, "r1"))


def test_a_retry_in_flight_waits_for_the_first_call_to_be_durable(
    gated: tuple[Recorder, GatedSink, str], tiny_model: LoadedModel
) -> None:
    recorder, sink, _ = gated
    store = MemoryStateStore()
    step = DecisionStep(store, recorder, recent_requests=100)
    sink.gate.clear()
    answers: dict[str, Answer] = {}

    def call(name: str) -> None:
        answers[name] = step.allocate(request("r2"), lambda *_: tiny_model)

    first = threading.Thread(target=call, args=("first",))
    first.start()
    first.join(0.2)
    retry = threading.Thread(target=call, args=("retry",))
    retry.start()
    retry.join(0.3)
    assert not answers, "an answer was given before its decision was committed"
    sink.gate.set()
    first.join(10)
    retry.join(10)
    assert answers["first"].output is not None
    assert answers["retry"].output is None  # the first call's answer, from the portfolio's state
    assert answers["retry"].response == answers["first"].response
    assert steps(store) == 1
