"""The decision step: the one path from a request to its recorded, stored answer.

validate (all or nothing) -> lock the portfolios -> ``prepare`` (retries get their stored
answers) -> ``decide`` (one onnxruntime call per model, one recorder ticket) -> wait until
durable -> ``settle`` (the new states, carrying their answers) -> ``observe``. The batcher runs
these steps per batch of concurrent calls, and owns the callers' deadlines; ``DecisionStep.run``
runs them for one call without a deadline (the serving-path replay, so a backtest is what the
server would answer).

The recorder accepts the records before any state advances (a refusal advances nothing), and
with durable acknowledgement the wait happens under the locks, so no retry sees a state whose
record a crash could lose.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from allocator.metrics.serving import ServingMetrics
from allocator.recording.recorder import Recorder
from allocator.recording.records import DECISION_FIELDS, DecisionRecord
from allocator.serving.answers import AnswerEncoder, framed, weight_bytes
from allocator.serving.decision import DecisionOutput, Decisions, decide_many
from allocator.serving.idempotency import (
    RecentRequests,
    check_last,
    request_fingerprints,
)
from allocator.serving.loader import LoadedModel
from allocator.serving.portfolio_state import LastAnswer, PortfolioState
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.state import StateStore
from allocator.serving.validation import (
    ModelShape,
    ValidRequest,
    validate_batch,
    validate_call,
)

__all__ = [
    "Answer",
    "Decided",
    "DecisionStep",
    "Item",
    "ModelResolver",
    "batch_response",
    "decision_gaps",
    "model_shape",
    "stream_response",
]

ModelResolver = Callable[[str | None, str | None], LoadedModel]
"""A model pin (name, version; ``None`` = default / newest) -> the loaded model answering it."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A validated request and its answer's bytes (the same stored for a retry and sent);
    ``output`` is ``None`` when a retry got its stored answer."""

    request: ValidRequest
    data: bytes
    output: DecisionOutput | None

    @property
    def response(self) -> pb.AllocateResponse:
        return pb.AllocateResponse.FromString(self.data)


@dataclass(frozen=True, slots=True)
class Item:
    """One request to decide, validated against its model; ``started`` is when its call arrived
    (``time.perf_counter()``, for the recorded latency)."""

    model: LoadedModel
    request: ValidRequest
    fingerprint: bytes
    started: float


@dataclass(frozen=True, slots=True)
class Decided:
    """Decided items, not stored yet: per model, the items' indices and decisions, and the
    recorder's ticket for all their records (``None``: nothing recorded)."""

    items: list[Item]
    groups: list[tuple[LoadedModel, list[int], Decisions]]
    ticket: int | None


def batch_response(answers: Sequence[Answer]) -> pb.AllocateBatchResponse:
    """Parsed from the answers' bytes in one C call."""
    return pb.AllocateBatchResponse.FromString(framed(1, [a.data for a in answers]))


def stream_response(sequence: int, answers: Sequence[Answer]) -> pb.AllocateStreamResponse:
    response = pb.AllocateStreamResponse(sequence=sequence)
    response.MergeFromString(framed(2, [a.data for a in answers]))
    return response


def model_shape(model: LoadedModel) -> ModelShape:
    limit = "max_assets" if model.set_policy is None else "max_served_assets"
    return ModelShape(model.max_request_assets, model.prices_per_asset - 1, limit)


class DecisionStep:
    """Decide, record (``recorder`` None: nothing) and store; ``recent_requests``: ids remembered
    to refuse a reused or superseded one (0: none)."""

    def __init__(
        self,
        store: StateStore,
        recorder: Recorder | None = None,
        metrics: ServingMetrics | None = None,
        recent_requests: int = 0,
    ) -> None:
        self.store = store
        self.recorder = recorder
        self.metrics = metrics
        self.recent = RecentRequests(recent_requests)
        self._encoders: dict[tuple[str, str], AnswerEncoder] = {}

    def allocate(self, request: pb.AllocateRequest, resolve: ModelResolver) -> Answer:
        (answer,) = self.allocate_batch(request, resolve)
        return answer

    def allocate_batch(
        self, call: pb.AllocateRequest | pb.AllocateBatchRequest, resolve: ModelResolver
    ) -> list[Answer]:
        return self.run(self.items(call, resolve, time.perf_counter()))

    def items(
        self,
        call: pb.AllocateRequest | pb.AllocateBatchRequest,
        resolve: ModelResolver,
        started: float,
    ) -> list[Item]:
        """A call's requests, all validated, each against its own model, before any is decided."""
        models: dict[tuple[str | None, str | None], LoadedModel] = {}

        def shape_for(name: str | None, version: str | None) -> ModelShape:
            model = models[(name, version)] = resolve(name, version)
            return model_shape(model)

        if isinstance(call, pb.AllocateRequest):
            valid = [validate_call(call, shape_for)]
        else:
            valid = validate_batch(call, shape_for)
            if self.metrics is not None:
                self.metrics.batch_size.observe(len(valid))
        return [
            Item(models[(r.model_name, r.model_version)], r, f, started)
            for r, f in zip(valid, request_fingerprints(valid), strict=True)
        ]

    def run(self, items: Sequence[Item]) -> list[Answer]:
        """Decide for distinct portfolios under their locks; record; then store the states."""
        with self.store.locked([item.request.portfolio_id for item in items]) as session:
            states = session.get()
            answers = self.prepare(items, states)
            todo = [i for i, answer in enumerate(answers) if answer is None]
            if not todo:
                return answers  # type: ignore[return-value]  # all retries, nothing to store
            decided = self.decide([items[i] for i in todo], [states[i] for i in todo])
            if self.recorder is not None and decided.ticket is not None:
                self.recorder.wait_durable(decided.ticket)
            for i, (state, answer) in zip(todo, self.settle(decided), strict=True):
                states[i] = state
                answers[i] = answer
            session.put(states)
        self.observe(decided)
        return answers  # type: ignore[return-value]  # every None was decided above

    def prepare(
        self, items: Sequence[Item], states: Sequence[PortfolioState | None]
    ) -> list[Answer | None]:
        """Per item, the stored answer of a retry, else None (to decide); a reused or superseded
        id raises ``InvalidRequest``."""
        answers: list[Answer | None] = []
        for item, state in zip(items, states, strict=True):
            r = item.request
            stored = check_last(r, item.fingerprint, None if state is None else state.last)
            if stored is None:
                self.recent.check(r, item.fingerprint)
            answers.append(None if stored is None else Answer(r, stored, None))
        return answers

    def decide(self, items: Sequence[Item], states: Sequence[PortfolioState | None]) -> Decided:
        """One onnxruntime call per model, all records as one ticket (one durable commit);
        raises ``RecorderRefusedError`` when the recorder refuses them."""
        groups: dict[tuple[str, str], list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault((item.model.name, item.model.version), []).append(i)
        decided_at = dt.datetime.now(dt.UTC)
        done: list[tuple[LoadedModel, list[int], Decisions]] = []
        records: list[DecisionRecord] = []
        for members in groups.values():
            model = items[members[0]].model
            group = [items[i] for i in members]
            decisions = decide_many(model, [g.request for g in group], [states[i] for i in members])
            done.append((model, members, decisions))
            if self.recorder is not None:
                records += _records(model, group, decisions, decided_at, time.perf_counter())
        ticket = None if self.recorder is None else self.recorder.submit_many(records)
        return Decided(list(items), done, ticket)

    def settle(self, decided: Decided) -> list[tuple[PortfolioState, Answer]]:
        """Each item's new state (carrying its answer) and answer, in item order."""
        out: list[tuple[PortfolioState, Answer] | None] = [None] * len(decided.items)
        for model, members, decisions in decided.groups:
            data = self._encode(model, [decided.items[i].request for i in members], decisions)
            for k, i in enumerate(members):
                item = decided.items[i]
                last = LastAnswer(item.request.request_id, item.fingerprint, data[k])
                out[i] = (
                    decisions.states[k].with_last(last),
                    Answer(item.request, data[k], decisions.outputs[k]),
                )
        return out  # type: ignore[return-value]  # every member was settled above

    def observe(self, decided: Decided) -> None:
        for item in decided.items:
            self.recent.put(item.request, item.fingerprint)
        if self.metrics is not None:
            for _, _, decisions in decided.groups:
                self.metrics.observe_decisions(
                    decision_gaps(decisions),
                    [o.turnover for o in decisions.outputs],
                    [o.icm_reward for o in decisions.outputs],
                )

    def _encode(
        self, model: LoadedModel, requests: Sequence[ValidRequest], decided: Decisions
    ) -> list[bytes]:
        """Every answer's bytes; the weights converted once per batch."""
        key = (model.name, model.version)
        encoder = self._encoders.get(key)
        if encoder is None:
            encoder = self._encoders[key] = AnswerEncoder(*key)
        raw, stride = weight_bytes(decided.raw)
        smoothed, _ = weight_bytes(decided.smoothed)
        out: list[bytes] = []
        at = 0
        for r, o, n in zip(requests, decided.outputs, decided.sizes, strict=True):
            end = at + 8 * n
            ids, rid, pid = o.asset_ids, r.request_id, r.portfolio_id
            out.append(encoder.encode(rid, pid, ids, raw[at:end], smoothed[at:end], o))
            at += stride
        return out


_ARRAYS = {"raw_weights": "raw", "smoothed_weights": "smoothed", "current_weights": "current"}
"""Record fields taken from a ``Decisions`` array (the record's ``current_weights``: only sent)."""
_FROM_OUTPUT = [
    f.name for f in fields(DecisionOutput) if f.name in DECISION_FIELDS and f.name not in _ARRAYS
]
"""Record fields taken from each ``DecisionOutput`` by name."""


def _records(
    model: LoadedModel,
    items: Sequence[Item],
    decided: Decisions,
    decided_at: dt.datetime,
    now: float,
) -> list[DecisionRecord]:
    """The decisions' rows, with what ``serving.restore`` rebuilds states from."""
    outputs = decided.outputs
    return DecisionRecord.batch_from_validated(
        decided.sizes,
        {name: getattr(decided, array) for name, array in _ARRAYS.items()},
        [item.request.current_weights is not None for item in items],
        {
            "request_id": [item.request.request_id for item in items],
            "portfolio_id": [item.request.portfolio_id for item in items],
            **{name: [getattr(o, name) for o in outputs] for name in _FROM_OUTPUT},
            "latency_seconds": [now - item.started for item in items],
            "slots": [s.slots for s in decided.states],
            "fingerprint": [item.fingerprint.hex() for item in items],
        },
        decided_at=decided_at,
        model_name=model.name,
        model_version=model.version,
    )


def decision_gaps(decided: Decisions) -> list[float]:
    """Each decision's raw-vs-smoothed L1 gap (cash included)."""
    diff = np.abs(decided.raw - decided.smoothed)
    width = diff.shape[1]
    if min(decided.sizes) < width:  # rows narrower than the batch: their padding is not theirs
        diff[np.arange(width) >= np.asarray(decided.sizes)[:, None]] = 0.0
    return np.add.reduce(diff, axis=1).tolist()
