"""Fuzzing the running server with 10,000 generated requests over every unary method, raw
bytes included, a few hundred over health's Watch and reflection, and streams of generated
AllocateStream messages, where every message gets its own reply and the stream goes on.

Whatever a client sends, the answer is a status it can act on: never UNKNOWN or INTERNAL.
Every call of the allocation service is counted in the request metrics, nothing is logged with
a traceback, the server stays SERVING, and a valid request is still answered afterwards.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable

import grpc
import pytest

from allocator.serving.proto import SERVICE_NAME
from allocator.serving.proto.v1 import allocator_pb2 as pb
from tests.serving.server.fuzz import (
    HEALTH_CHECK,
    HEALTH_WATCH,
    REFLECTION,
    STREAM,
    UNARY,
    Case,
    Fuzzer,
)
from tests.serving.server.helpers import INVALID, NOT_FOUND, OK, Conn, make_request, weights

N_UNARY = 10_000
N_STREAM = 150
"""Cases per streaming method."""
N_STREAMS = 60
"""AllocateStream calls, each of 1 to 12 generated messages."""
IN_FLIGHT = 16
"""Calls kept in flight, well below the server's concurrency limit (64): none is refused."""
NEVER = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}

Result = tuple[Case, grpc.StatusCode, str]

# Prices at the far ends of the double range are valid input whose log returns overflow;
# numpy warns, the graph's clip and the cash fallback turn them into a well-formed answer.
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


def _run_unary(conn: Conn, cases: Iterable[Case]) -> list[Result]:
    """Every case sent as raw bytes, ``IN_FLIGHT`` at a time; (case, code, details) each."""
    calls = {method: conn.channel.unary_unary(method) for method in UNARY}
    results: list[Result] = []
    pending: deque[tuple[Case, grpc.Future]] = deque()

    def collect(case: Case, future: grpc.Future) -> None:
        try:
            future.result()
            results.append((case, OK, ""))
        except grpc.RpcError as error:
            results.append((case, error.code(), error.details() or ""))

    for case in cases:
        pending.append((case, calls[case.method].future(case.data, timeout=30)))
        if len(pending) >= IN_FLIGHT:
            collect(*pending.popleft())
    while pending:
        collect(*pending.popleft())
    return results


def _run_stream(conn: Conn, case: Case) -> Result:
    """Watch: the first update, then cancel (a valid Watch never ends); reflection: one
    request, then the stream is closed."""
    try:
        if case.method == HEALTH_WATCH:
            call = conn.channel.unary_stream(case.method)(case.data, timeout=30)
            next(call)
            call.cancel()
        else:
            list(conn.channel.stream_stream(case.method)(iter([case.data]), timeout=30))
    except grpc.RpcError as error:
        return case, error.code(), error.details() or ""
    return case, OK, ""


def _calls_counted(conn: Conn) -> Counter[str]:
    """``allocator_serving_requests_total`` by method, over every code."""
    counted: Counter[str] = Counter()
    for family in conn.server.metrics_registry.collect():
        for sample in family.samples:
            if sample.name == "allocator_serving_requests_total":
                counted[sample.labels["grpc_method"]] += int(sample.value)
    return counted


def _explain(results: list[Result]) -> str:
    return "; ".join(
        f"{case.method} {case.how} {case.data[:40].hex()}: {code.name} {details}"
        for case, code, details in results[:5]
    )


def _assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    logged = [r for r in caplog.records if r.exc_info is not None or r.levelno >= logging.ERROR]
    assert not logged, [f"{r.name}: {r.getMessage()}" for r in logged[:5]]


def _assert_still_serving(conn: Conn) -> None:
    assert conn.serving()
    answer = conn.allocate(make_request("after-fuzz", ("A", "B", "C")))
    assert tuple(answer.asset_ids) == ("CASH", "A", "B", "C")
    assert weights(answer).sum() == pytest.approx(1.0, abs=1e-12)


def test_ten_thousand_generated_requests_on_every_unary_method(
    shared: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    before = _calls_counted(shared)
    with caplog.at_level(logging.WARNING):
        results = _run_unary(shared, Fuzzer(seed=20_241_119).cases(N_UNARY))
    assert len(results) == N_UNARY

    never = [r for r in results if r[1] in NEVER]
    assert not never, f"{len(never)} calls got UNKNOWN or INTERNAL: {_explain(never)}"
    other = [r for r in results if r[1] not in {OK, INVALID, NOT_FOUND}]
    assert not other, _explain(other)
    silent = [
        r for r in results if r[1] is not OK and not r[2] and r[0].method != HEALTH_CHECK
    ]  # health answers an unknown service NOT_FOUND without details, as grpc_health does
    assert not silent, f"a refusal must say why: {_explain(silent)}"

    # The generator reached every layer: answers, refusals naming a field, undecodable bytes.
    codes = Counter(code for _, code, _ in results)
    undecodable = sum(details.startswith("request: the ") for _, _, details in results)
    assert codes[OK] > 1000, codes
    assert codes[INVALID] - undecodable > 300, codes
    assert undecodable > 1000, undecodable
    assert {case.method for case, code, _ in results if code is OK} == set(UNARY)

    # Every call of the allocation service is counted, none with a server-side error code.
    after = _calls_counted(shared)
    sent = Counter(case.method.rsplit("/", 1)[1] for case, _, _ in results)
    for method in ("Allocate", "AllocateBatch", "ListModels", "ResetPortfolio"):
        assert after[method] - before[method] == sent[method], method
        for code in ("INTERNAL", "UNKNOWN"):
            labels = {"grpc_method": method, "grpc_code": code}
            assert shared.counter("allocator_serving_requests_total", **labels) == 0
    assert sent[HEALTH_CHECK.rsplit("/", 1)[1]] > 0

    _assert_no_traceback(caplog)
    _assert_still_serving(shared)


def test_generated_requests_on_the_streaming_methods(
    shared: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    fuzzer = Fuzzer(seed=7)
    with caplog.at_level(logging.WARNING):
        results = [
            _run_stream(shared, case)
            for method in (HEALTH_WATCH, REFLECTION)
            for case in fuzzer.cases(N_STREAM, (method,))
        ]
    never = [r for r in results if r[1] in NEVER]
    assert not never, _explain(never)
    assert not [r for r in results if r[1] not in {OK, INVALID}], _explain(results)
    for method in (HEALTH_WATCH, REFLECTION):
        codes = Counter(code for case, code, _ in results if case.method == method)
        assert codes[OK] > 0, (method, codes)
        assert codes[INVALID] > 0, (method, codes)
    _assert_no_traceback(caplog)
    _assert_still_serving(shared)
    assert shared.health_status(SERVICE_NAME) == "SERVING"


def _sequence(data: bytes) -> int:
    """The sequence a reply to ``data`` must carry: its own, or 0 when it does not decode."""
    try:
        return pb.AllocateStreamRequest.FromString(data).sequence
    except Exception:  # the decoding guard's rule: whatever the parser raises
        return 0


def test_generated_messages_on_allocate_stream(
    shared: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    fuzzer = Fuzzer(seed=19)
    call = shared.channel.stream_stream(
        STREAM, response_deserializer=pb.AllocateStreamResponse.FromString
    )
    before = _calls_counted(shared)["AllocateStream"]
    sent = 0
    replies: list[tuple[Case, pb.AllocateStreamResponse]] = []
    with caplog.at_level(logging.WARNING):
        for _ in range(N_STREAMS):
            cases = list(fuzzer.cases(fuzzer.rng.randint(1, 12), (STREAM,)))
            sent += len(cases)
            answered = list(call(iter([c.data for c in cases]), timeout=60))  # ends OK
            assert len(answered) == len(cases)
            replies.extend(zip(cases, answered, strict=True))
    for case, reply in replies:
        assert reply.sequence == _sequence(case.data), case.how
        if reply.HasField("error"):
            assert not reply.responses
            assert reply.error.code in {INVALID.value[0], NOT_FOUND.value[0]}, reply.error
            assert reply.error.message, case.how
        else:
            assert reply.responses, case.how
    errors = [reply.error.message for _, reply in replies if reply.HasField("error")]
    undecodable = sum(m.startswith("request: the ") for m in errors)
    assert undecodable > 20, undecodable
    assert len(errors) - undecodable > 20, errors[:5]
    assert len(replies) - len(errors) > 50
    assert _calls_counted(shared)["AllocateStream"] - before == sent
    for code in ("INTERNAL", "UNKNOWN"):
        labels = {"grpc_method": "AllocateStream", "grpc_code": code}
        assert shared.counter("allocator_serving_requests_total", **labels) == 0
    _assert_no_traceback(caplog)
    _assert_still_serving(shared)
