"""The decision step: the one path from a request to its recorded, stored answer.

resolve the model -> validate the request against its shape -> lock the portfolios -> read their
states -> ``decide_batch`` -> hand the records to the recorder -> write the new states -> answer.

The gRPC server runs this for every call, and the serving-path replay (and through it the
walk-forward and retraining evaluations) runs the very same code, with a ``MemoryStateStore``
and no recorder: a backtest of an exported model is what the server would have answered.

What the order guarantees:

* Validation comes first and is all or nothing: one bad item of a batch decides nothing.
* The recorder accepts the records before the states advance. If it refuses them (its spool is
  full) the states stay as they were and ``RecorderRefusedError`` reaches the caller: no
  decision is acted on that was not recorded.
* With durable acknowledgement (the recorder's default) the step then waits, still under the
  locks and before the states (with their last answers) are written, until the records are
  committed or fsync'd (``Recorder.wait_durable``, bounded by the caller's deadline). Waiting
  here, not after the locks, is the point: no retry or later request can see an advanced state
  or a stored answer whose record a crash could still lose.
* A decision that becomes durable after the caller's deadline is kept, not dropped: the step
  goes on waiting (up to ``LATE_DURABLE_SECONDS`` more, still under the locks), then advances
  the states with the stored answers as for any decision, and raises ``DeadlineExceededError``
  (``late=True``). The recorded history and the states therefore never part: the client whose
  call ended DEADLINE_EXCEEDED fetches that very decision by retrying its request id, and the
  portfolio's next decision smooths from it. Only when the record is still not durable after
  that wait, or the writer can keep nothing (``NotDurableError``), does nothing advance; a
  record that lands even later is then the first row of its request id, which a retry decides
  again from the same state and inputs (so answers alike unless another request advanced the
  portfolio in between).
* A retried request (same ``request_id`` and inputs) gets its first answer back, with no second
  step and no second record: a portfolio's state carries the answer to its latest request
  (``PortfolioState.last``), read under the portfolio's lock, so a duplicate that was in flight
  while this call waited, or a retry on another replica or after a restart, gets that answer.
  Only the latest answer is kept; see ``serving.idempotency`` for older ids.
* A call whose deadline passed while it waited for the locks decides nothing
  (``DeadlineExceededError``).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from allocator.metrics.serving import ServingMetrics
from allocator.recording.recorder import Recorder
from allocator.recording.records import DecisionRecord
from allocator.recording.tickets import NotDurableError
from allocator.registry.errors import ModelNotFoundError
from allocator.serving.answers import AnswerEncoder, framed, weight_bytes
from allocator.serving.decision import DecisionOutput, Decisions, decide_many
from allocator.serving.idempotency import RecentRequests, check_last, request_fingerprints
from allocator.serving.loader import LoadedModel
from allocator.serving.portfolio_state import LastAnswer, PortfolioState
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.state import StateStore
from allocator.serving.validation import (
    ModelShape,
    ValidRequest,
    model_pin,
    validate_batch,
    validate_request,
)

__all__ = [
    "LATE_DURABLE_SECONDS",
    "Answer",
    "DeadlineExceededError",
    "DecisionStep",
    "ModelResolver",
    "TimeRemaining",
    "batch_response",
    "model_shape",
    "stream_response",
]

ModelResolver = Callable[[str | None, str | None], LoadedModel]
"""A model pin (name, version; ``None`` = default / newest) -> the loaded model answering it."""
TimeRemaining = Callable[[], float | None]
"""Seconds left before the caller's deadline (``None``: no deadline)."""


LATE_DURABLE_SECONDS = 30.0
"""How much longer than the caller's deadline a decision's record may take to become durable
and still advance its portfolio (the writer's own database timeouts, then its spool, normally
settle it within seconds)."""


class DeadlineExceededError(Exception):
    """The caller's deadline passed: before deciding (``late`` False: nothing decided, nothing
    stored), or before the decision was durable (``late`` True: it was recorded and stored
    anyway, and a retry of its request id gets it)."""

    def __init__(self, message: str, *, late: bool = False) -> None:
        super().__init__(message)
        self.late = late


@dataclass(frozen=True, slots=True)
class Answer:
    """One request, as validated, and its answer: ``data`` is the serialized
    ``AllocateResponse`` (encoded once, ``serving.answers``: the bytes stored for a retry are
    the bytes sent); ``output`` (the decision with the current weights it used) is ``None``
    when a retry got its stored answer."""

    request: ValidRequest
    data: bytes
    output: DecisionOutput | None

    @property
    def response(self) -> pb.AllocateResponse:
        """The answer as a message (parsed from ``data`` on each access)."""
        return pb.AllocateResponse.FromString(self.data)


def batch_response(answers: Sequence[Answer]) -> pb.AllocateBatchResponse:
    """The batch call's response, parsed from the answers' bytes in one call."""
    return pb.AllocateBatchResponse.FromString(framed(1, [a.data for a in answers]))


def stream_response(sequence: int, answers: Sequence[Answer]) -> pb.AllocateStreamResponse:
    """A stream message's response, parsed from the answers' bytes in one call."""
    response = pb.AllocateStreamResponse(sequence=sequence)
    response.MergeFromString(framed(2, [a.data for a in answers]))
    return response


def model_shape(model: LoadedModel) -> ModelShape:
    """What ``model`` accepts, for validation: its asset limit and the closes per asset its
    features (and, for a shared policy, its anchor) need."""
    if model.set_policy is None:
        return ModelShape(model.max_assets, model.prices_per_asset - 1)
    return ModelShape(model.max_request_assets, model.prices_per_asset - 1, "max_served_assets")


class DecisionStep:
    """Decide, record and store, for one state store and recorder.

    ``recorder`` ``None`` records nothing (replays, experiments); ``metrics`` ``None`` observes
    nothing; ``recent_requests`` is how many request ids this process remembers to refuse a
    reused or superseded id (``serving.idempotency.RecentRequests``; 0: none). Retries of a
    portfolio's latest request are answered from its state whatever this is.
    """

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

    def allocate(
        self,
        request: pb.AllocateRequest,
        resolve: ModelResolver,
        *,
        started: float | None = None,
        time_remaining: TimeRemaining | None = None,
    ) -> Answer:
        """One request, from the wire to its answer. ``started`` (``time.perf_counter()``
        when the call arrived) dates the recorded latency."""
        pin = model_pin(request)
        try:
            model = resolve(*pin)
        except ModelNotFoundError as exc:
            exc.add_note("model")
            raise
        valid = validate_request(request, model_shape(model), pin=pin)
        (answer,) = self.decide_and_record(
            model, [valid], started=started, time_remaining=time_remaining
        )
        return answer

    def allocate_batch(
        self,
        batch: pb.AllocateBatchRequest,
        resolve: ModelResolver,
        *,
        started: float | None = None,
        time_remaining: TimeRemaining | None = None,
    ) -> list[Answer]:
        """A batch, all validated before any is decided; one locked step per model."""
        models: dict[tuple[str | None, str | None], LoadedModel] = {}

        def shape_for(name: str | None, version: str | None) -> ModelShape:
            model = models[(name, version)] = resolve(name, version)
            return model_shape(model)

        valid = validate_batch(batch, shape_for)
        if self.metrics is not None:
            self.metrics.observe_batch(len(valid))
        answers: list[Answer | None] = [None] * len(valid)
        groups: dict[tuple[str, str], list[int]] = {}
        by_key: dict[tuple[str, str], LoadedModel] = {}
        for i, r in enumerate(valid):
            model = models[(r.model_name, r.model_version)]
            key = (model.name, model.version)
            by_key[key] = model
            groups.setdefault(key, []).append(i)
        for key, members in groups.items():
            decided = self.decide_and_record(
                by_key[key],
                [valid[i] for i in members],
                started=started,
                time_remaining=time_remaining,
            )
            for i, answer in zip(members, decided, strict=True):
                answers[i] = answer
        return answers  # type: ignore[return-value]  # every None was answered above

    def decide_and_record(
        self,
        model: LoadedModel,
        requests: Sequence[ValidRequest],
        *,
        started: float | None = None,
        time_remaining: TimeRemaining | None = None,
    ) -> list[Answer]:
        """Decide for distinct portfolios under their locks; record; then store the states.

        ``requests`` were validated against ``model``'s shape and name each portfolio once
        (``validate_batch`` refuses repeats: two steps of one portfolio in one call would have
        no defined order). A retry of a portfolio's latest request gets the stored answer.
        """
        started = time.perf_counter() if started is None else started
        late = False
        ids = [r.portfolio_id for r in requests]
        fingerprints = request_fingerprints(requests)
        with self.store.locked(ids) as session:
            if time_remaining is not None:
                remaining = time_remaining()
                if remaining is not None and remaining <= 0:
                    raise DeadlineExceededError("deadline exceeded before deciding")
            states = session.get()
            answers = self._stored_answers(requests, fingerprints, states)
            todo = [i for i, answer in enumerate(answers) if answer is None]
            if not todo:
                return answers  # type: ignore[return-value]  # all retries, nothing to store
            if len(todo) < len(requests):
                requests = [requests[i] for i in todo]
                fingerprints = [fingerprints[i] for i in todo]
            decided = decide_many(model, requests, [states[i] for i in todo])
            decided_at = dt.datetime.now(dt.UTC)
            latency = time.perf_counter() - started
            if self.recorder is not None:
                ticket = self.recorder.submit_many(
                    _records(model, requests, decided, fingerprints, decided_at, latency)
                )
                late = self._wait_durable(ticket, time_remaining)
            data = self._encode(model, requests, decided)
            for k, i in enumerate(todo):
                r = requests[k]
                last = LastAnswer(r.request_id, fingerprints[k], data[k])
                states[i] = decided.states[k].with_last(last)
                answers[i] = Answer(r, data[k], decided.outputs[k])
            session.put(states)
        for r, fingerprint in zip(requests, fingerprints, strict=True):
            self.recent.put(r, fingerprint)
        if self.metrics is not None:
            self.metrics.observe_decisions(
                _gaps(decided),
                [o.turnover for o in decided.outputs],
                [o.icm_reward for o in decided.outputs],
            )
        if late:
            raise DeadlineExceededError(
                "deadline exceeded before the decision was durable; it was recorded since: "
                "retry the request_id to get it",
                late=True,
            )
        return answers  # type: ignore[return-value]  # every None was decided above

    def _wait_durable(self, ticket: int, time_remaining: TimeRemaining | None) -> bool:
        """Wait until the records up to ``ticket`` are durable; True when that came after the
        caller's deadline (within ``LATE_DURABLE_SECONDS`` more). ``DeadlineExceededError``
        when not even then, ``NotDurableError`` when the writer can keep nothing."""
        assert self.recorder is not None
        try:
            self.recorder.wait_durable(ticket, _seconds_left(time_remaining))
            return False
        except NotDurableError as exc:
            if not exc.timed_out:
                raise
        try:
            self.recorder.wait_durable(ticket, LATE_DURABLE_SECONDS)
        except NotDurableError as exc:
            if exc.timed_out:
                raise DeadlineExceededError("deadline exceeded before recording") from exc
            raise
        return True

    def _encode(
        self, model: LoadedModel, requests: Sequence[ValidRequest], decided: Decisions
    ) -> list[bytes]:
        """Every answer's bytes: the weights' bytes taken once per batch, the model reference
        and the asset lists encoded once per model and universe."""
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
            icm = o.icm_reward
            out.append(
                encoder.encode(
                    r.request_id,
                    r.portfolio_id,
                    o.asset_ids,
                    raw[at:end],
                    smoothed[at:end],
                    o.turnover,
                    icm if icm is not None and math.isfinite(icm) else None,
                )
            )
            at += stride
        return out

    def _stored_answers(
        self,
        requests: Sequence[ValidRequest],
        fingerprints: Sequence[bytes],
        states: Sequence[PortfolioState | None],
    ) -> list[Answer | None]:
        """Per request, the stored answer when it retries its portfolio's latest request, else
        None (to decide); a reused or superseded id raises ``InvalidRequest``."""
        answers: list[Answer | None] = []
        for r, fingerprint, state in zip(requests, fingerprints, states, strict=True):
            stored = check_last(r, fingerprint, None if state is None else state.last)
            if stored is None:
                self.recent.check(r, fingerprint)
                answers.append(None)
            else:
                answers.append(Answer(r, stored, None))
        return answers


def _seconds_left(time_remaining: TimeRemaining | None) -> float | None:
    """How long the recorder may take to acknowledge: the caller's deadline, if any."""
    return None if time_remaining is None else time_remaining()


def _records(
    model: LoadedModel,
    requests: Sequence[ValidRequest],
    decided: Decisions,
    fingerprints: Sequence[bytes],
    decided_at: dt.datetime,
    latency: float,
) -> list[DecisionRecord]:
    """The decisions' rows; with the new slot layouts and the requests' fingerprints, so a
    restarted server can rebuild each portfolio's state and last answer from its row
    (``serving.restore``). The recorded current weights are the ones the request sent."""
    return DecisionRecord.batch_from_validated(
        request_ids=[r.request_id for r in requests],
        portfolio_ids=[r.portfolio_id for r in requests],
        decided_at=decided_at,
        model_name=model.name,
        model_version=model.version,
        asset_ids=[o.asset_ids for o in decided.outputs],
        raw_weights=decided.raw,
        smoothed_weights=decided.smoothed,
        current_weights=decided.current,
        sent=[r.current_weights is not None for r in requests],
        sizes=decided.sizes,
        turnovers=[o.turnover for o in decided.outputs],
        icm_rewards=[o.icm_reward for o in decided.outputs],
        latency_seconds=latency,
        slots=[s.slots for s in decided.states],
        fingerprints=[f.hex() for f in fingerprints],
    )


def _gaps(decided: Decisions) -> list[float]:
    """Each decision's raw-vs-smoothed L1 gap (cash included), on the batch's arrays at once."""
    diff = np.abs(decided.raw - decided.smoothed)
    width = diff.shape[1]
    if min(decided.sizes) < width:  # rows narrower than the batch: their padding is not theirs
        diff[np.arange(width) >= np.asarray(decided.sizes)[:, None]] = 0.0
    return np.add.reduce(diff, axis=1).tolist()
