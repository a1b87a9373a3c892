"""The coalescer batches whatever is waiting, never two steps of one portfolio in a batch,
never two models in a batch, and gives each caller its own outcome or error."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Sequence

import pytest

from allocator.serving.coalescer import Coalescer


class Recorder:
    """A decide function that logs its batches; the first batch blocks until released."""

    def __init__(self) -> None:
        self.batches: list[tuple[Hashable, list[str]]] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, group: Hashable, items: Sequence[str]) -> list[str | BaseException]:
        with self.lock:
            first = not self.batches
            self.batches.append((group, list(items)))
        if first:
            self.entered.set()
            self.release.wait(5)
        return [ValueError(item) if item.startswith("bad") else item.upper() for item in items]


def run_concurrently(
    coalescer: Coalescer[str, str], calls: Sequence[tuple[Hashable, str, str]], first_alone: bool
) -> dict[str, str | BaseException]:
    """Submit ``calls`` from threads; the first one enters alone, the rest queue behind it."""
    results: dict[str, str | BaseException] = {}

    def call(group: Hashable, portfolio: str, item: str) -> None:
        try:
            results[item] = coalescer.submit(group, portfolio, item)
        except BaseException as exc:
            results[item] = exc

    threads = [threading.Thread(target=call, args=c) for c in calls]
    threads[0].start()
    decide = coalescer._decide
    assert isinstance(decide, Recorder)
    if first_alone:
        assert decide.entered.wait(5)
    for t in threads[1:]:
        t.start()
        time.sleep(0.01)  # arrival order is the queue's order
    decide.release.set()
    for t in threads:
        t.join(10)
    return results


def test_waiting_calls_are_decided_in_one_batch_with_their_own_answers() -> None:
    decide = Recorder()
    coalescer: Coalescer[str, str] = Coalescer(decide)
    calls = [("m1", f"p{i}", f"x{i}") for i in range(6)]
    results = run_concurrently(coalescer, calls, first_alone=True)
    assert results == {f"x{i}": f"X{i}" for i in range(6)}
    assert [items for _, items in decide.batches] == [["x0"], ["x1", "x2", "x3", "x4", "x5"]]


def test_one_portfolio_steps_once_per_batch_in_arrival_order() -> None:
    decide = Recorder()
    coalescer: Coalescer[str, str] = Coalescer(decide)
    calls = [("m1", "p0", "a0"), ("m1", "p1", "b1"), ("m1", "p1", "b2"), ("m1", "p2", "c1")]
    calls += [("m1", "p1", "b3")]
    run_concurrently(coalescer, calls, first_alone=True)
    batches = [items for _, items in decide.batches]
    assert batches[0] == ["a0"]
    assert batches[1] == ["b1", "c1"]
    assert batches[2:] == [["b2"], ["b3"]]


def test_models_are_never_mixed_in_a_batch() -> None:
    decide = Recorder()
    coalescer: Coalescer[str, str] = Coalescer(decide)
    calls = [("m1", "p0", "a"), ("m2", "p1", "b"), ("m1", "p2", "c"), ("m2", "p3", "d")]
    results = run_concurrently(coalescer, calls, first_alone=True)
    assert results == {"a": "A", "b": "B", "c": "C", "d": "D"}
    assert decide.batches[1:] == [("m2", ["b", "d"]), ("m1", ["c"])]


def test_an_item_error_reaches_only_its_caller() -> None:
    decide = Recorder()
    coalescer: Coalescer[str, str] = Coalescer(decide)
    calls = [("m", "p0", "ok0"), ("m", "p1", "bad1"), ("m", "p2", "ok2")]
    results = run_concurrently(coalescer, calls, first_alone=True)
    assert results["ok0"] == "OK0"
    assert results["ok2"] == "OK2"
    assert isinstance(results["bad1"], ValueError)


def test_a_failed_batch_fails_its_callers_and_the_next_batch_still_runs() -> None:
    calls_seen: list[list[str]] = []

    def decide(group: Hashable, items: Sequence[str]) -> list[str]:
        calls_seen.append(list(items))
        if "boom" in items:
            raise RuntimeError("decide failed")
        return [i.upper() for i in items]

    coalescer: Coalescer[str, str] = Coalescer(decide)
    with pytest.raises(RuntimeError, match="decide failed"):
        coalescer.submit("m", "p", "boom")
    assert coalescer.submit("m", "p", "fine") == "FINE"
    assert calls_seen == [["boom"], ["fine"]]


def test_sequential_calls_are_decided_alone() -> None:
    sizes: list[int] = []

    def decide(group: Hashable, items: Sequence[str]) -> list[str]:
        sizes.append(len(items))
        return list(items)

    coalescer: Coalescer[str, str] = Coalescer(decide)
    assert [coalescer.submit("m", "p", str(i)) for i in range(5)] == ["0", "1", "2", "3", "4"]
    assert sizes == [1] * 5


def test_many_threads_all_get_their_answer() -> None:
    def decide(group: Hashable, items: Sequence[str]) -> list[str]:
        time.sleep(0.001)
        return [i.upper() for i in items]

    coalescer: Coalescer[str, str] = Coalescer(decide, max_batch=8)
    results: dict[str, str] = {}
    lock = threading.Lock()

    def worker(w: int) -> None:
        for k in range(50):
            item = f"w{w}k{k}"
            answer = coalescer.submit("m", f"p{w}", item)
            with lock:
                results[item] = answer

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 16 * 50
    assert all(v == k.upper() for k, v in results.items())
