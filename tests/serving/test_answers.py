"""Answers encoded as bytes from the arrays are protobuf's own encoding, byte for byte."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from google.protobuf.internal.encoder import _VarintBytes  # protobuf's own varint

from allocator.serving import LoadedModel
from allocator.serving.answers import AnswerEncoder, framed, varint, weight_bytes
from allocator.serving.decision import decide_many
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.state import MemoryStateStore
from allocator.serving.step import (
    Answer,
    DecisionStep,
    batch_response,
    decision_gaps,
    model_shape,
    stream_response,
)
from tests.serving.conftest import allocate_request
from tests.serving.requests import validate_one


def _message(
    rid: str,
    pid: str,
    ids: tuple[str, ...],
    raw: np.ndarray,
    smoothed: np.ndarray,
    turnover: float,
    icm: float | None,
    model: tuple[str, str] = ("m", "1"),
) -> pb.AllocateResponse:
    """The answer as the server built it before: a message from Python values."""
    message = pb.AllocateResponse(
        request_id=rid,
        portfolio_id=pid,
        asset_ids=ids,
        raw_weights=raw.tolist(),
        smoothed_weights=smoothed.tolist(),
        model=pb.ModelRef(name=model[0], version=model[1]),
        turnover=turnover,
    )
    if icm is not None:
        message.icm_reward = icm
    return message


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16_383, 16_384, 2**31, 2**63])
def test_varint_is_protobufs(n: int) -> None:
    assert varint(n) == _VarintBytes(n)


def test_encoded_answers_equal_serialize_to_string() -> None:
    rng = np.random.default_rng(3)
    encoder = AnswerEncoder("modèle-ü", "2024.1")
    turnovers = [0.0, -0.0, 0.37, 1e-300, 2.0]
    rewards = [None, 0.0, -0.0, 1.25, -3e10]
    for t in range(300):
        n = int(rng.integers(1, 90))
        ids = ("CASH", *(f"Ä{i}" * int(rng.integers(1, 4)) for i in range(n)))
        weights = rng.dirichlet(np.ones(n + 1), size=2)
        data, stride = weight_bytes(weights)
        rid, pid = "r" * int(rng.integers(1, 200)), "pé" * int(rng.integers(1, 100))
        turnover, icm = turnovers[t % 5], rewards[t % 5 - t % 2]
        values = SimpleNamespace(turnover=turnover, icm_reward=icm)
        got = encoder.encode(
            rid, pid, ids, data[: 8 * (n + 1)], data[stride : stride + 8 * (n + 1)], values
        )
        want = _message(
            rid, pid, ids, weights[0], weights[1], turnover, icm, ("modèle-ü", "2024.1")
        )
        assert got == want.SerializeToString()
        assert pb.AllocateResponse.FromString(got) == want


def test_weight_bytes_of_a_row_prefix() -> None:
    matrix = np.arange(12, dtype=np.float64).reshape(3, 4)
    data, stride = weight_bytes(matrix[:, ::-1])  # not contiguous: converted first
    assert stride == 32
    assert np.frombuffer(data[stride : stride + 16], "<f8").tolist() == [7.0, 6.0]


def test_batch_and_stream_responses_from_the_answers_bytes() -> None:
    rng = np.random.default_rng(0)
    messages = [
        _message(
            f"r{i}", f"p{i}", ("CASH", "A"), *rng.dirichlet([1, 1], 2), 0.5, [None, 1.0][i % 2]
        )
        for i in range(5)
    ]
    answers = [Answer(None, m.SerializeToString(), None) for m in messages]  # type: ignore[arg-type]
    assert batch_response(answers) == pb.AllocateBatchResponse(responses=messages)
    assert stream_response(7, answers) == pb.AllocateStreamResponse(sequence=7, responses=messages)
    assert answers[1].response == messages[1]
    assert framed(1, []) == b""


def test_no_reward_no_field() -> None:
    encoder = AnswerEncoder("m", "1")
    data, _ = weight_bytes(np.array([[1.0]]))
    values = SimpleNamespace(turnover=0.0, icm_reward=None)
    answer = pb.AllocateResponse.FromString(encoder.encode("r", "p", ("CASH",), data, data, values))
    assert not answer.HasField("icm_reward")
    assert answer.turnover == 0.0


def test_the_steps_answers_are_the_messages_built_from_its_decisions(
    tiny_model: LoadedModel,
) -> None:
    """Through ``DecisionStep``: every answer's bytes are the message the old code built from
    the decision (rewards present from the second step on), and a retry gets the same bytes."""
    step = DecisionStep(MemoryStateStore())
    rng = np.random.default_rng(5)

    def batch(round_: int) -> pb.AllocateBatchRequest:
        return pb.AllocateBatchRequest(
            requests=[
                allocate_request(
                    [f"A{j}" for j in range(1 + i % 4)],
                    100.0 + rng.random((1 + i % 4, tiny_model.prices_per_asset)),
                    rng.dirichlet(np.ones(2 + i % 4)) if i % 2 else None,
                    portfolio_id=f"p{i}",
                    request_id=f"r{round_}-{i}",
                )
                for i in range(6)
            ]
        )

    for round_ in range(2):
        request = batch(round_)
        answers = step.allocate_batch(request, lambda name, version: tiny_model)
        for answer in answers:
            out = answer.output
            assert out is not None
            want = _message(
                answer.request.request_id,
                answer.request.portfolio_id,
                out.asset_ids,
                out.raw_weights,
                out.smoothed_weights,
                out.turnover,
                out.icm_reward,
                (tiny_model.name, tiny_model.version),
            )
            assert answer.data == want.SerializeToString()
        assert (answers[1].output.icm_reward is not None) == (round_ == 1)  # type: ignore[union-attr]
        retried = step.allocate_batch(request, lambda name, version: tiny_model)
        assert [a.data for a in retried] == [a.data for a in answers]
        assert all(a.output is None for a in retried)


def test_decision_gaps_leave_out_a_narrower_rows_padding(tiny_model: LoadedModel) -> None:
    """``decision_gaps`` per batch equals the L1 gap of each decision's own vectors."""
    rng = np.random.default_rng(9)
    requests = [
        validate_one(
            allocate_request(
                [f"A{j}" for j in range(n)],
                100.0 + rng.random((n, tiny_model.prices_per_asset)),
                portfolio_id=f"p{n}",
                request_id=f"r{n}",
            ),
            model_shape(tiny_model),
        )
        for n in (1, 4, 2)
    ]
    decided = decide_many(tiny_model, requests, [None, None, None])
    want = [float(np.abs(o.raw_weights - o.smoothed_weights).sum()) for o in decided.outputs]
    assert decision_gaps(decided) == pytest.approx(want, abs=1e-15)
