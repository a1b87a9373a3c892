"""Recording and metrics of a real server: every decision recorded, a refusing recorder makes
calls UNAVAILABLE with state intact, the /metrics endpoint, and the weights it sends.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from allocator.portfolio import renormalize
from allocator.serving.proto.v1 import allocator_pb2 as pb
from tests.serving.server.helpers import (
    BETA,
    OK,
    WAIT,
    Conn,
    batch_of,
    connect,
    make_request,
    start_server,
    wait_for,
    weights,
    with_price,
)


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_every_decision_is_recorded(tiny_registry: Path, tmp_path: Path) -> None:
    server = start_server(tmp_path, tiny_registry)
    conn = connect(server)
    answers: list[pb.AllocateResponse] = []
    try:
        for k in range(4):  # tiny (ICM) for one portfolio
            answers.append(conn.allocate(make_request("icm", seed=k, request_id=f"icm-{k}")))
        for k in range(3):  # plain (no ICM), pinned
            answers.append(
                conn.allocate(make_request("plain", seed=k, request_id=f"pl-{k}", model="plain"))
            )
        retried = make_request("icm", seed=9, request_id="icm-retried")
        answers.append(conn.allocate(retried))
        conn.allocate(retried)  # a retry: answered, not recorded twice
        batch = batch_of(
            make_request("b1", seed=1, current=[0.2, 0.3, 0.3, 0.2]),
            make_request("b2", ("X", "Y"), seed=2, model="plain"),
        )
        answers.extend(conn.call("AllocateBatch", batch)[2].responses)
        # Refused calls record nothing.
        conn.call("Allocate", with_price(0, math.nan)())
        conn.call("AllocateBatch", batch_of(make_request("b3"), pb.AllocateRequest()))
    finally:
        conn.channel.close()
        server.stop()

    db = tmp_path / "trades.db"
    rows = _rows(
        db,
        "SELECT d.request_id, d.portfolio_id, d.asset_ids, d.raw_weights, d.smoothed_weights, "
        "d.icm_reward, d.turnover, m.name, m.version FROM decisions d "
        "JOIN model_versions m ON m.id = d.model_version_id",
    )
    assert len(rows) == len(answers)
    by_id = {r[0]: r for r in rows}
    for a in answers:
        _, pid, assets, raw, smoothed, icm, turnover, name, version = by_id[a.request_id]
        assert pid == a.portfolio_id
        assert json.loads(assets) == list(a.asset_ids)
        assert json.loads(raw) == list(a.raw_weights)  # exactly: float64 round trips
        assert json.loads(smoothed) == list(a.smoothed_weights)
        assert turnover == a.turnover
        assert (name, version) == (a.model.name, a.model.version)
        assert icm == (a.icm_reward if a.HasField("icm_reward") else None)
    icm_rows = [by_id[f"icm-{k}"][5] for k in range(4)]
    assert icm_rows[0] is None
    assert all(r is not None for r in icm_rows[1:])
    assert all(by_id[f"pl-{k}"][5] is None for k in range(3))
    models = _rows(db, "SELECT name, version, algorithm FROM model_versions")
    assert sorted(models) == [("plain", "1", "td3"), ("tiny", "1", "td3")]


def test_refusing_recorder_is_unavailable_and_state_holds(
    tiny_registry: Path, tmp_path: Path
) -> None:
    """The database is down and the spool is over quota: no decision may be acted on."""
    server = start_server(
        tmp_path,
        tiny_registry,
        database_url="postgresql+psycopg://postgres@127.0.0.1:1/allocator",
        spool_quota_bytes=1,
        metrics_port=0,
    )
    conn = connect(server)
    try:
        assert server.recorder is not None
        # The model registrations go to the spool first, which closes the door.
        wait_for(lambda: server.recorder.stats().spool_bytes > 0, "the spool to fill")
        request = make_request("unrecorded", request_id="unrecorded-1")
        for _ in range(2):  # and a retry with the same id is refused again, not cached
            code, details, _ = conn.call("Allocate", request)
            assert code is grpc.StatusCode.UNAVAILABLE, details
            assert "not recorded" in details
        code, _, _ = conn.call("AllocateBatch", batch_of(make_request("u1"), make_request("u2")))
        assert code is grpc.StatusCode.UNAVAILABLE
        for pid in ("unrecorded", "u1", "u2"):
            assert conn.state(pid) is None
        assert conn.counter("allocator_recorder_rejected_total") == 4.0  # records, not calls
        assert (
            conn.counter(
                "allocator_serving_requests_total", grpc_method="Allocate", grpc_code="UNAVAILABLE"
            )
            == 2.0
        )
        assert conn.serving()  # a recording outage is the client's to retry, not a crash
    finally:
        conn.channel.close()
        server.stop()


def test_metrics_endpoint(shared: Conn) -> None:
    shared.allocate(make_request("metrics", seed=1))
    shared.allocate(make_request("metrics", seed=2))
    shared.call("Allocate", with_price(1, -1.0)())
    shared.call("AllocateBatch", batch_of(make_request("metrics-b", seed=3)))
    assert shared.server.recorder is not None
    assert shared.server.recorder.flush(WAIT)
    port = shared.server.metrics_port
    assert port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(metric: str, /, **labels: str) -> float:
        return samples.get((metric, tuple(sorted(labels.items()))), 0.0)

    assert 'allocator_serving_requests_total{grpc_code="OK",grpc_method="Allocate"}' in text
    assert value("allocator_serving_requests_total", grpc_method="Allocate", grpc_code="OK") >= 2
    assert (
        value(
            "allocator_serving_requests_total", grpc_method="Allocate", grpc_code="INVALID_ARGUMENT"
        )
        >= 1
    )
    assert (
        value("allocator_serving_requests_total", grpc_method="AllocateBatch", grpc_code="OK") >= 1
    )
    assert value("allocator_serving_provider_info", provider="CPUExecutionProvider") == 1.0
    model = {"name": "tiny", "version": "1", "algorithm": "td3", "holds_anchor": "false"}
    assert value("allocator_serving_model_info", **model) == 1.0
    assert value("allocator_serving_latency_budget_seconds") == pytest.approx(0.010)
    assert value("allocator_serving_request_latency_seconds_count", grpc_method="Allocate",
                 grpc_code="OK") >= 2  # fmt: skip
    assert value("allocator_serving_smoothing_gap_count") >= 3
    assert value("allocator_serving_icm_reward_count") >= 1
    assert value("allocator_serving_batch_size_count") >= 1
    assert value("allocator_recorder_rows_written_total") >= 3
    assert ("allocator_recorder_queue_depth", ()) in samples
    assert ("allocator_recorder_spool_bytes", ()) in samples
    assert (
        value("allocator_serving_requests_total", grpc_method="Allocate", grpc_code="INTERNAL")
        == 0.0
    )


def test_a_batch_is_timed_per_decision(shared: Conn) -> None:
    """The latency budget is a decision's, so a batch call is observed per decision: its
    server-side time over its size, at most the client's round trip over the size."""
    n = 40
    labels = {"grpc_method": "AllocateBatch", "grpc_code": "OK"}
    name = "allocator_serving_request_latency_seconds"
    before = shared.counter(f"{name}_sum", **labels), shared.counter(f"{name}_count", **labels)
    batch = batch_of(*(make_request(f"per-decision-{i}", seed=i) for i in range(n)))
    start = time.perf_counter()
    code, details, response = shared.call("AllocateBatch", batch)
    elapsed = time.perf_counter() - start
    assert code is OK, details
    assert len(response.responses) == n
    assert shared.counter(f"{name}_count", **labels) == before[1] + 1
    per_decision = shared.counter(f"{name}_sum", **labels) - before[0]
    assert 0.0 < per_decision * n <= elapsed


# --- the renormalization the server promises (a cheap cross-check of the weights it sends) ------


def test_smoothed_is_the_ema_of_raw(shared: Conn) -> None:
    pid = "ema"
    previous = None
    for k in range(5):
        answer = shared.allocate(make_request(pid, seed=20 + k))
        raw, smoothed = weights(answer, "raw"), weights(answer)
        expected = raw if previous is None else BETA * previous + (1 - BETA) * raw
        np.testing.assert_allclose(smoothed, renormalize(expected, np.ones(4, bool)), atol=1e-12)
        previous = smoothed


def test_pool_of_clients_in_parallel(shared: Conn) -> None:
    """Many portfolios from many threads: every answer is well formed, no state is lost."""

    def work(i: int) -> int:
        for k in range(10):
            shared.allocate(make_request(f"par-{i}", seed=k))
        return shared.state(f"par-{i}").steps

    with futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(work, range(8))) == [10] * 8
