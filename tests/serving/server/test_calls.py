"""How calls behave: deadlines, the concurrency limit, idempotent retries, reset and listing."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from allocator.serving.proto.v1 import allocator_pb2 as pb
from tests.serving.server.helpers import (
    INVALID,
    MAX_ASSETS,
    OK,
    WAIT,
    WINDOW,
    Conn,
    batch_of,
    connect,
    make_request,
    start_server,
    wait_for,
    weights,
)


def test_tiny_deadlines_then_retries_step_once(shared: Conn) -> None:
    """With a microsecond deadline the client mostly gives up before the answer (gRPC's timers
    are coarse, so an answer may still win the race). Either way a retry with the same request
    id is safe: the portfolio steps exactly once per request id."""
    pid = "deadline-tiny"
    codes = []
    for k in range(20):
        request = make_request(pid, seed=k, request_id=f"{pid}-{k}")
        code, details, _ = shared.call("Allocate", request, timeout=1e-6)
        codes.append(code)
        assert code in {OK, grpc.StatusCode.DEADLINE_EXCEEDED}, details
        retried = shared.allocate(request)
        assert retried.request_id == request.request_id
    assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
    assert shared.state(pid).steps == 20
    assert shared.serving()


def test_expired_call_decides_nothing(shared: Conn) -> None:
    """A call whose deadline passes while it waits for the portfolio's lock is not decided:
    the client has given up, so the portfolio's state must not move on its behalf."""
    pid = "deadline-held"
    before = shared.counter(
        "allocator_serving_requests_total", grpc_method="Allocate", grpc_code="DEADLINE_EXCEEDED"
    )
    with shared.server.store.locked([pid]):
        code, _, _ = shared.call("Allocate", make_request(pid), timeout=0.3)
        assert code is grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(
        lambda: (
            shared.counter(
                "allocator_serving_requests_total",
                grpc_method="Allocate",
                grpc_code="DEADLINE_EXCEEDED",
            )
            > before
        ),
        "the handler to give up on the expired call",
    )
    assert shared.state(pid) is None
    assert shared.serving()
    assert shared.allocate(make_request(pid)).portfolio_id == pid


def test_over_the_concurrency_limit_is_resource_exhausted(
    tiny_registry: Path, tmp_path: Path
) -> None:
    server = start_server(tmp_path, tiny_registry, max_concurrent_rpcs=1, threads=4, record=False)
    conn = connect(server)
    stripes = 4096  # MemoryStateStore's default: the probe must not wait on the held stripe
    held = "held"
    free = next(
        f"free-{k}" for k in range(10) if hash(f"free-{k}") % stripes != hash(held) % stripes
    )
    try:
        with server.store.locked([held]):
            blocked = conn.stub.Allocate.future(make_request(held), timeout=30)
            # Once the held call is inside the handler it has the one slot, and a probe is
            # refused at the door. Until then a probe is answered, or it takes the slot first
            # and the held call is the one refused: then send that again.
            deadline = time.monotonic() + WAIT
            while True:
                assert time.monotonic() < deadline, "no call was refused"
                code, details, _ = conn.call("Allocate", make_request(free), timeout=10)
                if code is not OK:
                    break
                if blocked.done():
                    assert blocked.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                    blocked = conn.stub.Allocate.future(make_request(held), timeout=30)
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert not blocked.done()
        assert blocked.result().portfolio_id == held  # released: the held call completes
        assert conn.allocate(make_request(free)).portfolio_id == free
        assert conn.serving()
    finally:
        conn.channel.close()
        server.stop()


def test_retried_request_is_answered_once(shared: Conn) -> None:
    first = make_request("retry", seed=1, request_id="retry-1")
    again = shared.allocate(first)
    assert shared.allocate(first) == again
    assert shared.allocate(first) == again
    steps = shared.state("retry").steps
    assert steps == 1
    # A twin portfolio that saw the first step once: the next step smooths identically.
    shared.allocate(make_request("twin", seed=1, request_id="twin-1"))
    nxt = shared.allocate(make_request("retry", seed=2, request_id="retry-2"))
    twin = shared.allocate(make_request("twin", seed=2, request_id="twin-2"))
    np.testing.assert_array_equal(weights(nxt), weights(twin))
    np.testing.assert_array_equal(weights(nxt, "raw"), weights(twin, "raw"))
    assert nxt.icm_reward == twin.icm_reward
    assert shared.state("retry").steps == 2
    # The same id for another portfolio is a client bug, not a retry.
    code, details, _ = shared.call("Allocate", make_request("other", request_id="retry-1"))
    assert code is INVALID
    assert details.startswith("request_id: ")
    assert "another portfolio" in details
    assert shared.state("other") is None
    # So is the same id with other inputs: its answer would be for other assets or prices.
    for changed in (
        make_request("retry", ("A", "B"), seed=1, request_id="retry-1"),
        make_request("retry", seed=3, request_id="retry-1"),
        make_request("retry", seed=1, request_id="retry-1", current=[1, 0, 0, 0]),
        make_request("retry", seed=1, request_id="retry-1", model="plain"),
    ):
        code, details, _ = shared.call("Allocate", changed)
        assert code is INVALID
        assert details.startswith("request_id: ")
        assert "other inputs" in details
    # The first request again, unchanged, after a later one: its answer is no longer kept (only
    # the latest is), and deciding it again would step twice, so it is refused.
    code, details, _ = shared.call("Allocate", first)
    assert code is INVALID
    assert "no longer the latest" in details
    assert shared.allocate(make_request("retry", seed=2, request_id="retry-2")) == nxt
    assert shared.state("retry").steps == 2
    assert shared.state("retry").last.request_id == "retry-2"


def test_batch_retry_and_mixed_batch(shared: Conn) -> None:
    a = make_request("batch-a", seed=3, request_id="ba-1")
    b = make_request("batch-b", seed=4, request_id="bb-1")
    batch = shared.call("AllocateBatch", batch_of(a, b))[2]
    assert [r.portfolio_id for r in batch.responses] == ["batch-a", "batch-b"]
    # Retrying the batch answers the same, without a second step.
    assert shared.call("AllocateBatch", batch_of(a, b))[2] == batch
    assert shared.allocate(a) == batch.responses[0]
    # A batch that mixes a retried item with a new one decides only the new one.
    b2 = make_request("batch-b", seed=5, request_id="bb-2")
    mixed = shared.call("AllocateBatch", batch_of(a, b2))[2]
    assert mixed.responses[0] == batch.responses[0]
    assert shared.state("batch-a").steps == 1
    assert shared.state("batch-b").steps == 2
    assert mixed.responses[1].request_id == "bb-2"
    assert mixed.responses[1].HasField("icm_reward")  # batch-b's second step


def test_concurrent_duplicates_step_once(shared: Conn) -> None:
    """Two copies of one request in flight at once (a hedging client): one step, one answer."""
    pid = "dup-in-flight"
    shared.allocate(make_request(pid, seed=6))
    request = make_request(pid, seed=7, request_id="dup-1")
    with shared.server.store.locked([pid]):
        calls = [shared.stub.Allocate.future(request, timeout=30) for _ in range(2)]
        time.sleep(0.3)  # let both reach the lock (a shorter wait can only hide the bug)
    answers = [c.result() for c in calls]
    assert answers[0] == answers[1]
    assert shared.state(pid).steps == 2


def test_reset_portfolio(shared: Conn) -> None:
    pid = "to-reset"
    reset = pb.ResetPortfolioRequest(portfolio_id=pid)
    assert shared.call("ResetPortfolio", reset)[2].existed is False
    first = shared.allocate(make_request(pid, seed=8))
    np.testing.assert_array_equal(weights(first), weights(first, "raw"))
    assert not first.HasField("icm_reward")
    second = shared.allocate(make_request(pid, seed=9))
    assert not np.array_equal(weights(second), weights(second, "raw"))  # smoothing is on
    assert second.HasField("icm_reward")
    assert shared.call("ResetPortfolio", reset)[2].existed is True
    assert shared.state(pid) is None
    assert shared.call("ResetPortfolio", reset)[2].existed is False
    restarted = shared.allocate(make_request(pid, seed=9))
    np.testing.assert_array_equal(weights(restarted), weights(restarted, "raw"))
    assert not restarted.HasField("icm_reward")
    assert shared.state(pid).steps == 1


def test_turnover_is_measured_from_cash_then_from_the_last_smoothed_weights(shared: Conn) -> None:
    """What the proto promises: a portfolio without state (new, or reset) is taken to hold
    cash, so its first turnover is the risky share bought; later ones start from the previous
    smoothed weights unless the request sends its own."""
    pid = "turnover"

    def turnover_from(base: np.ndarray, response: pb.AllocateResponse) -> float:
        return float(np.abs(weights(response)[1:] - base[1:]).sum())

    cash = np.array([1.0, 0.0, 0.0, 0.0])
    first = shared.allocate(make_request(pid, seed=10))
    assert first.turnover == pytest.approx(1.0 - weights(first)[0], abs=1e-12)
    assert first.turnover == pytest.approx(turnover_from(cash, first), abs=1e-12)
    second = shared.allocate(make_request(pid, seed=11))
    assert second.turnover == pytest.approx(turnover_from(weights(first), second), abs=1e-12)
    sent = np.array([0.1, 0.2, 0.3, 0.4])
    third = shared.allocate(make_request(pid, seed=12, current=sent))
    assert third.turnover == pytest.approx(turnover_from(sent, third), abs=1e-12)
    shared.call("ResetPortfolio", pb.ResetPortfolioRequest(portfolio_id=pid))
    again = shared.allocate(make_request(pid, seed=13))
    assert again.turnover == pytest.approx(1.0 - weights(again)[0], abs=1e-12)


def test_list_models(shared: Conn) -> None:
    models = shared.call("ListModels", pb.ListModelsRequest())[2].models
    by_name = {m.name: m for m in models}
    assert set(by_name) == {"tiny", "plain"}
    assert by_name["tiny"].is_default
    assert not by_name["plain"].is_default
    assert by_name["tiny"].has_icm
    assert not by_name["plain"].has_icm
    assert (by_name["tiny"].max_assets, by_name["tiny"].window) == (MAX_ASSETS, WINDOW)
    assert by_name["tiny"].provider == "CPUExecutionProvider"
