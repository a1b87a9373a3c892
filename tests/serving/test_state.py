"""State stores: in memory and in a real Redis, under threads and across processes.

The cross-process tests start two spawned workers that each load the tiny model and talk to the
same Redis; the main process drives them, so "alternating" is exact, and "contention" really is
two interpreters racing for one portfolio.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from allocator.serving import LoadedModel, load_model
from allocator.serving.decision import DecisionOutput
from allocator.serving.portfolio_state import PortfolioState
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.state import (
    MemoryStateStore,
    RedisStateStore,
    StateLockLostError,
    StateLockTimeoutError,
    StateStore,
)
from allocator.serving.step import DecisionStep
from allocator.serving.validation import InvalidRequest, ModelShape, ValidRequest
from tests.serving.conftest import TINY, allocate_request, decide_one, items_for
from tests.serving.requests import validate_one

# --- a deterministic request history shared by the main process and the workers -----------------


def history_input(step: int, portfolio_id: str = "p") -> ValidRequest:
    """Step k of one portfolio's requests: the universe changes at steps 4 and 7."""
    ids = ("A", "B", "C") if step < 4 else ("A", "C", "D", "E") if step < 7 else ("E", "C")
    rng = np.random.default_rng(1000 + step)
    prices = 40.0 * np.exp(np.cumsum(rng.normal(0, 0.02, (len(ids), TINY.window + 1)), axis=1))
    current = None
    if step % 3 == 2:
        g = rng.gamma(1.0, size=len(ids) + 1)
        current = g / g.sum()
    message = allocate_request(
        ids, prices, current, portfolio_id=portfolio_id, request_id=f"{portfolio_id}-{step}"
    )
    return validate_one(message, ModelShape(TINY.max_assets, TINY.window))


def decide_in(
    store: StateStore, model: LoadedModel, requests: list[ValidRequest]
) -> list[DecisionOutput]:
    """The decision step for distinct portfolios, under ``store``'s locks, recording nothing."""
    answers = DecisionStep(store).run(items_for(model, requests))
    return [a.output for a in answers]  # type: ignore[misc]  # no cache: all decided


def redis_store(url: str, prefix: str, **kwargs: Any) -> RedisStateStore:
    return RedisStateStore(url, prefix=prefix, **kwargs)


def _worker(conn: Connection, model_dir: str, url: str, prefix: str) -> None:
    """Command loop of a spawned worker: ("decide", pid, step) or ("hammer", pid, n)."""
    model = load_model(model_dir, prefer_cuda=False)
    store = RedisStateStore(url, prefix=prefix, lock_wait_seconds=30.0)
    try:
        while True:
            command = conn.recv()
            if command is None:
                break
            kind, pid, arg = command
            if kind == "decide":
                (out,) = decide_in(store, model, [history_input(arg, pid)])
                conn.send((out.smoothed_weights.tolist(), out.raw_weights.tolist()))
            elif kind == "hammer":
                conn.send("ready")
                conn.recv()  # go
                for k in range(arg):
                    request = history_input(k % 3, pid)  # a fresh id: not a retry
                    request = dataclasses.replace(request, request_id=f"{pid}-{os.getpid()}-{k}")
                    decide_in(store, model, [request])
                conn.send("done")
    finally:
        store.close()
        conn.close()


@pytest.fixture(scope="module")
def workers(tiny_model_dir: Path, redis_url: str) -> Iterator[tuple[list[Connection], str]]:
    """Two spawned worker processes sharing one module-wide key prefix."""
    import secrets

    prefix = f"allocator-test:{secrets.token_hex(6)}:"
    ctx = mp.get_context("spawn")
    conns: list[Connection] = []
    procs = []
    for _ in range(2):
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_worker, args=(child, str(tiny_model_dir), redis_url, prefix), daemon=True
        )
        proc.start()
        child.close()
        conns.append(parent)
        procs.append(proc)
    try:
        yield conns, prefix
    finally:
        for conn in conns:
            conn.send(None)
        for proc in procs:
            proc.join(timeout=20)
            if proc.is_alive():
                proc.terminate()
        client = redis.Redis.from_url(redis_url)
        from tests.serving.conftest import delete_prefixed

        delete_prefixed(client, prefix, "lock:" + prefix)
        client.close()


# --- both stores ---------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[StateStore]:
    if request.param == "memory":
        s: StateStore = MemoryStateStore()
    else:
        url = request.getfixturevalue("redis_url")
        s = redis_store(url, request.getfixturevalue("redis_prefix"))
    yield s
    s.close()


def make_states(model: LoadedModel, n: int) -> list[PortfolioState]:
    out = []
    state = None
    for k in range(n):
        _, state = decide_one(model, history_input(k), state)
        out.append(state)
    return out


def test_states_round_trip_and_reset(store: StateStore, tiny_model: LoadedModel) -> None:
    s1, s2 = make_states(tiny_model, 2)
    with store.locked(["p1", "p2", "p3"]) as session:
        assert session.get() == [None, None, None]
        session.put([s1, s2, None])
    with store.locked(["p2", "p1"]) as session:
        assert session.get() == [s2, s1]
        with pytest.raises(ValueError, match="2 portfolios"):
            session.put([s1])
        session.put([s1, None])  # p2 <- s1, p1 deleted
    with store.locked(["p1", "p2"]) as session:
        assert session.get() == [None, s1]
        session.put([None, s1])
        with pytest.raises(RuntimeError, match="already"):
            session.put([None, s1])
    assert store.reset("p2") is True
    assert store.reset("p2") is False
    with store.locked(["p2"]) as session:
        assert session.get() == [None]


def test_leaving_a_session_without_put_writes_nothing_and_unlocks(
    store: StateStore, tiny_model: LoadedModel
) -> None:
    (s1,) = make_states(tiny_model, 1)
    with pytest.raises(KeyError), store.locked(["p"]) as session:
        raise KeyError("decision failed")
    with store.locked(["p"]) as session:  # not left locked
        assert session.get() == [None]
        session.put([s1])
    with store.locked(["p"]):
        pass
    with store.locked(["p"]) as session:
        assert session.get() == [s1]


def test_a_session_names_each_portfolio_once(store: StateStore) -> None:
    with pytest.raises(ValueError, match="once"), store.locked(["a", "a"]):
        pass
    with pytest.raises(ValueError, match="non-empty"), store.locked([""]):
        pass


def test_batches_equal_one_by_one_and_name_each_portfolio_once(
    store: StateStore, tiny_model: LoadedModel
) -> None:
    """Calls of distinct portfolios ([x, y], [x], [x, y]) decide as the same steps one at a
    time; a call naming a portfolio twice decides nothing (steps of one portfolio in one call
    would have no order: validation refuses such batches, the store refuses such sessions)."""
    ids = ["x", "y", "x", "x", "y"]
    inputs = [history_input(k, pid) for k, pid in enumerate(ids)]
    with pytest.raises(ValueError, match="once"):
        decide_in(store, tiny_model, inputs[:3])
    outs: list[DecisionOutput] = []
    for call in ([0, 1], [2], [3, 4]):
        outs.extend(decide_in(store, tiny_model, [inputs[i] for i in call]))
    # The same decisions one by one, in a fresh memory store.
    ref = MemoryStateStore()
    for i, inp in enumerate(inputs):
        (one,) = decide_in(ref, tiny_model, [inp])
        np.testing.assert_allclose(outs[i].smoothed_weights, one.smoothed_weights, atol=1e-7)
    with store.locked(["x", "y"]) as session:
        x, y = session.get()
    assert x is not None
    assert y is not None
    assert (x.steps, y.steps) == (3, 2)


def test_a_bad_item_refuses_the_batch_before_anything_is_decided(
    store: StateStore, tiny_model: LoadedModel
) -> None:
    """Validation first, all or nothing: the error names the item; no state is written."""
    good = allocate_request(("A", "B"), np.ones((2, TINY.window + 1)), portfolio_id="p")
    bad = allocate_request(
        ("A", "A"), np.ones((2, TINY.window + 1)), portfolio_id="q", request_id="r2"
    )
    batch = pb.AllocateBatchRequest(requests=[good, bad])
    with pytest.raises(InvalidRequest) as info:
        DecisionStep(store).allocate_batch(batch, lambda name, version: tiny_model)
    assert info.value.field == "requests[1].asset_ids[1]"
    with store.locked(["p", "q"]) as session:
        assert session.get() == [None, None]


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_threads_hammering_one_portfolio_never_lose_an_update(
    kind: str, tiny_model: LoadedModel, request: pytest.FixtureRequest
) -> None:
    if kind == "memory":
        stores: list[StateStore] = [MemoryStateStore()]
    else:
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        stores = [redis_store(url, prefix, lock_wait_seconds=30.0) for _ in range(2)]
    n_threads, per_thread = 4, 40
    errors: list[BaseException] = []

    def run(s: StateStore, thread: int) -> None:
        try:
            for k in range(per_thread):
                # Distinct request ids: the same id again would be a retry, answered unstepped.
                requests = [
                    dataclasses.replace(history_input(k % 3, pid), request_id=f"{pid}-{thread}-{k}")
                    for pid in ("hot", "cold")
                ]
                decide_in(s, tiny_model, requests)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(stores[i % len(stores)], i)) for i in range(n_threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with stores[0].locked(["hot", "cold"]) as session:
        hot, cold = session.get()
    assert hot is not None
    assert cold is not None
    assert hot.steps == cold.steps == n_threads * per_thread
    for s in stores:
        s.close()


# --- Redis specifics ---------------------------------------------------------------------------


def test_redis_keys_and_bytes(redis_url: str, redis_prefix: str, tiny_model: LoadedModel):
    (s1,) = make_states(tiny_model, 1)
    store = redis_store(redis_url, redis_prefix)
    with store.locked(["p"]) as session:
        session.put([s1])
    client = redis.Redis.from_url(redis_url)
    assert client.get(redis_prefix + "p") == s1.to_bytes()
    assert not client.exists("lock:" + redis_prefix + "p")  # released
    client.close()
    store.close()
    with pytest.raises(ValueError, match="overlap"):
        RedisStateStore(redis_url, prefix="")


def test_redis_lock_waits_then_times_out(redis_url: str, redis_prefix: str) -> None:
    holder = redis_store(redis_url, redis_prefix)
    waiter = redis_store(redis_url, redis_prefix, lock_wait_seconds=0.2)
    with holder.locked(["p", "q"]):
        t = time.monotonic()
        with pytest.raises(StateLockTimeoutError, match="locked"), waiter.locked(["q", "r"]):
            pass
        assert time.monotonic() - t >= 0.2
        with waiter.locked(["r"]) as session:  # others are free; all-or-nothing took none
            assert session.get() == [None]
    with waiter.locked(["p", "q", "r"]):
        pass
    holder.close()
    waiter.close()


def test_redis_expired_lock_writes_nothing(
    redis_url: str, redis_prefix: str, tiny_model: LoadedModel
) -> None:
    """The token check fences a replica whose lock expired (and was taken by another)."""
    s1, s2 = make_states(tiny_model, 2)
    slow = redis_store(redis_url, redis_prefix, lock_ttl_seconds=0.05)
    fast = redis_store(redis_url, redis_prefix)
    with slow.locked(["p"]) as session:
        time.sleep(0.15)  # the lock expires
        with fast.locked(["p"]) as other:
            other.put([s2])
        with pytest.raises(StateLockLostError, match="no state was written"):
            session.put([s1])
    with fast.locked(["p"]) as session:
        assert session.get() == [s2]
    slow.close()
    fast.close()


_HOLD_AND_WAIT = """
import sys, time
from allocator.serving.state import RedisStateStore
store = RedisStateStore(sys.argv[1], prefix=sys.argv[2])
with store.locked(["p", "q"]):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_killed_owners_locks_are_taken_within_its_liveness(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL mid-decision: the portfolios are free once the owner's liveness key lapses, well
    before the locks' own 10 s lifetime."""
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_AND_WAIT, redis_url, redis_prefix],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"
        holder.kill()
        holder.wait(10)
        killed = time.monotonic()
        store = redis_store(redis_url, redis_prefix, lock_wait_seconds=5.0)
        with caplog.at_level(logging.WARNING, logger="allocator.serving"):
            with store.locked(["q"]) as session:
                session.put([None])
            waited = time.monotonic() - killed
            with store.locked(["p"]):
                pass
        store.close()
    finally:
        holder.kill()
        holder.wait(10)
    assert waited < 1.0
    assert sum("took over 1 portfolio lock" in r.getMessage() for r in caplog.records) == 2


def test_a_live_owner_keeps_its_locks_past_its_liveness_ttl(
    redis_url: str, redis_prefix: str
) -> None:
    holder = redis_store(redis_url, redis_prefix, liveness_seconds=0.2)
    waiter = redis_store(redis_url, redis_prefix, lock_wait_seconds=0.8)
    with holder.locked(["p"]) as session:
        with pytest.raises(StateLockTimeoutError), waiter.locked(["p"]):
            pass  # the heartbeat kept the holder alive four liveness periods over
        session.put([None])  # and its lock still fences nothing out: the write goes through
    holder.close()
    client = redis.Redis.from_url(redis_url)
    assert not client.exists(holder.owner_key)  # close dropped the liveness key at once
    client.close()
    with waiter.locked(["p"]):
        pass
    waiter.close()


def test_a_closed_owners_locks_are_free_at_once(redis_url: str, redis_prefix: str) -> None:
    holder = redis_store(redis_url, redis_prefix)
    waiter = redis_store(redis_url, redis_prefix, lock_wait_seconds=0.0)
    with holder.locked(["p"]) as session:
        holder.close()
        with waiter.locked(["p"]):
            pass
        with pytest.raises(StateLockLostError):
            session.put([None])
    waiter.close()


def test_redis_unreadable_state_restarts_the_portfolio(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(redis_prefix + "p", b"not a state")
    store = redis_store(redis_url, redis_prefix)
    with caplog.at_level(logging.WARNING, logger="allocator.serving"), store.locked(["p"]) as s:
        assert s.get() == [None]
    assert any("unreadable portfolio state" in r.getMessage() for r in caplog.records)
    assert store.reset("p") is True
    assert not client.exists(redis_prefix + "p")
    client.close()
    store.close()


def test_two_processes_alternating_give_the_one_process_sequence(
    workers: tuple[list[Connection], str], tiny_model: LoadedModel
) -> None:
    conns, _ = workers
    steps = 10
    got = []
    for k in range(steps):
        conn = conns[k % 2]
        conn.send(("decide", "alternating", k))
        got.append(conn.recv())
    memory = MemoryStateStore()
    for k in range(steps):
        (want,) = decide_in(memory, tiny_model, [history_input(k, "alternating")])
        np.testing.assert_array_equal(got[k][0], want.smoothed_weights)
        np.testing.assert_array_equal(got[k][1], want.raw_weights)


def test_two_processes_contending_never_lose_an_update(
    workers: tuple[list[Connection], str], redis_url: str
) -> None:
    conns, prefix = workers
    per_process = 150
    for conn in conns:
        conn.send(("hammer", "contended", per_process))
    for conn in conns:
        assert conn.recv() == "ready"
    for conn in conns:
        conn.send("go")
    for conn in conns:
        assert conn.poll(120)
        assert conn.recv() == "done"
    store = redis_store(redis_url, prefix)
    with store.locked(["contended"]) as session:
        (state,) = session.get()
    store.close()
    assert state is not None
    assert state.steps == 2 * per_process
