"""The gRPC ecosystem's standard server metrics: names, labels, calls against messages."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import CollectorRegistry

from allocator.metrics.serving import ServingMetrics
from allocator.serving.server import SERVICE

BUDGET = 2e-3


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_standard_grpc_metrics_count_calls_by_model_version(registry):
    """The names and labels stock gRPC dashboards read, plus the version that answered."""
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    for _ in range(3):
        serving.grpc.observe_started("Allocate")
    serving.observe_request("Allocate", "OK", 1e-3, model="us", version="3")
    serving.observe_request("Allocate", "OK", 4e-3, model="us", version="4")
    serving.observe_request("Allocate", grpc.StatusCode.UNAVAILABLE, 2e-3, model="us", version="4")
    serving.observe_request("AllocateBatch", "OK", 30e-3, decisions=16, model="us", version="4")

    get = registry.get_sample_value
    call = {"grpc_type": "unary", "grpc_service": "allocator.v1.Allocator"}
    allocate = {**call, "grpc_method": "Allocate"}
    assert get("grpc_server_started_total", allocate) == 3.0
    v4 = {**allocate, "model": "us", "version": "4"}
    assert get("grpc_server_handled_total", {**v4, "grpc_code": "OK"}) == 1.0
    assert get("grpc_server_handled_total", {**v4, "grpc_code": "UNAVAILABLE"}) == 1.0
    v3 = {**allocate, "model": "us", "version": "3", "grpc_code": "OK"}
    assert get("grpc_server_handled_total", v3) == 1.0
    assert get("grpc_server_handling_seconds_count", v4) == 2.0
    assert get("grpc_server_handling_seconds_sum", v4) == pytest.approx(6e-3)
    assert get("grpc_server_msg_received_total", allocate) == 3.0
    assert get("grpc_server_msg_sent_total", allocate) == 2.0  # the UNAVAILABLE call sent none
    batch = {**call, "grpc_method": "AllocateBatch", "model": "us", "version": "4"}
    assert get("grpc_server_handling_seconds_sum", batch) == pytest.approx(30e-3)  # the call's


def test_a_stream_counts_messages_and_is_handled_once(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    serving.grpc.observe_started("AllocateStream")
    for _ in range(5):
        serving.observe_request("AllocateStream", "OK", 1e-3, decisions=4)
    serving.grpc.observe_handled("AllocateStream", "OK", 2.5)

    get = registry.get_sample_value
    stream = {
        "grpc_type": "bidi_stream",
        "grpc_service": "allocator.v1.Allocator",
        "grpc_method": "AllocateStream",
    }
    assert get("grpc_server_msg_received_total", stream) == 5.0
    assert get("grpc_server_msg_sent_total", stream) == 5.0
    unlabelled = {**stream, "model": "", "version": ""}
    assert get("grpc_server_handled_total", {**unlabelled, "grpc_code": "OK"}) == 1.0
    assert get("grpc_server_handling_seconds_sum", unlabelled) == 2.5
    assert (
        get(
            "allocator_serving_requests_total", {"grpc_method": "AllocateStream", "grpc_code": "OK"}
        )
        == 5.0
    )


def test_an_unknown_method_is_named(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    with pytest.raises(ValueError, match="'Alocate' is not one of Allocate, AllocateBatch"):
        serving.grpc.observe_started("Alocate")
