"""Prometheus metric definitions: names, budget bucket, convenience methods, exposition."""

from __future__ import annotations

import math
import re
import shutil
import socket
import subprocess
import time
from enum import Enum

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from allocator.metrics.buckets import LATENCY_BUCKETS_SECONDS, latency_buckets
from allocator.metrics.jobs import JobMetrics, JobPush, PromotionDecision
from allocator.metrics.pushgateway import push_reporting
from allocator.metrics.recorder import RecorderMetrics
from allocator.metrics.serving import ServingMetrics
from allocator.registry.errors import REFUSAL_REASONS
from allocator.serving.server import SERVICE

NAME_RE = re.compile(r"^(allocator_(serving|recorder|jobs)|grpc_server)_[a-z0-9_]+$")
BUDGET = 2e-3

EXPECTED_FAMILIES = {
    # family name as prometheus_client reports it (counters without _total, info without _info)
    "allocator_serving_request_latency_seconds": "histogram",
    "allocator_serving_requests": "counter",
    "allocator_serving_over_budget": "counter",
    "allocator_serving_latency_budget_seconds": "gauge",
    "allocator_serving_smoothing_gap": "histogram",
    "allocator_serving_turnover_ratio": "histogram",
    "allocator_serving_icm_reward": "histogram",
    "allocator_serving_batch_size": "histogram",
    "allocator_serving_decided_batch_size": "histogram",
    "allocator_serving_model": "info",
    "allocator_serving_provider": "info",
    "allocator_serving_model_refused": "counter",
    "allocator_serving_models_refused": "gauge",
    "grpc_server_started": "counter",
    "grpc_server_handled": "counter",
    "grpc_server_handling_seconds": "histogram",
    "grpc_server_msg_received": "counter",
    "grpc_server_msg_sent": "counter",
    "allocator_recorder_queue_depth": "gauge",
    "allocator_recorder_spooled_records": "gauge",
    "allocator_recorder_spool_bytes": "gauge",
    "allocator_recorder_rows_written": "counter",
    "allocator_recorder_failed_writes": "counter",
    "allocator_recorder_replayed": "counter",
    "allocator_recorder_rejected": "counter",
    "allocator_recorder_batch_write_latency_seconds": "histogram",
    "allocator_jobs_last_success_timestamp_seconds": "gauge",
    "allocator_jobs_windows": "counter",
    "allocator_jobs_window_sharpe": "gauge",
    "allocator_jobs_window_action_near_bound_ratio": "gauge",
    "allocator_jobs_window_actor_collapsed": "gauge",
    "allocator_jobs_promotions": "counter",
    "allocator_jobs_duration_seconds": "histogram",
}


class StatusCode(Enum):
    """Shaped like ``grpc.StatusCode`` (an Enum whose names are the code names)."""

    OK = (0, "ok")
    UNAVAILABLE = (14, "unavailable")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def populated(registry: CollectorRegistry) -> tuple[ServingMetrics, RecorderMetrics, JobMetrics]:
    """All three metric sets on ``registry``, every labelled metric with at least one child."""
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    serving.observe_request("Allocate", "OK", 0.8e-3)
    serving.observe_request("Allocate", StatusCode.UNAVAILABLE, 5e-3)
    serving.observe_decisions([0.1], [0.05], [-1.5])
    serving.batch_size.observe(16)
    serving.model_info.set(name="us-equities", version="3", algorithm="td3", holds_anchor="false")
    serving.provider_info.set(provider="CPUExecutionProvider")
    recorder = RecorderMetrics(registry)
    recorder.queue_depth.set(12)
    recorder.spooled_records.set(3)
    recorder.spool_bytes.set(4096)
    recorder.observe_write(64, 0.012)
    recorder.batch_write_latency.observe(1.5)  # a failed write, as the recorder records it
    recorder.failed_writes.labels("unavailable").inc()
    recorder.replayed.inc(3)
    recorder.rejected.inc()
    jobs = JobMetrics(registry)
    jobs.record_window("2019-01-02", 0.9)
    jobs.record_promotion(PromotionDecision.PROMOTED)
    jobs.duration.observe(3600.0)
    jobs.mark_success(1_700_000_000.0)
    return serving, recorder, jobs


def test_names_follow_the_convention(registry):
    populated(registry)
    families = {f.name: f for f in registry.collect()}
    assert {name: f.type for name, f in families.items()} == EXPECTED_FAMILIES
    for name, family in families.items():
        assert NAME_RE.match(name), name
        assert "milli" not in name, f"{name}: use base units"
        assert not name.endswith("_ms"), f"{name}: use base units"
        if family.type == "counter":
            assert not name.endswith("_total")  # prometheus_client strips it from the family
            assert family.samples, name
            assert {s.name for s in family.samples} <= {f"{name}_total", f"{name}_created"}
        if any(word in name for word in ("latency", "duration", "timestamp")):
            assert name.endswith("_seconds"), name


def test_exposed_counter_names_end_in_total(registry):
    populated(registry)
    text = generate_latest(registry).decode()
    counters = re.findall(r"^# TYPE (\S+) counter$", text, flags=re.MULTILINE)
    assert counters
    assert all(name.endswith("_total") for name in counters), counters


@pytest.mark.parametrize("budget", [1.2e-3, 1e-3, 20e-6, 0.25])
def test_latency_buckets_have_one_exactly_at_the_budget(registry, budget):
    serving = ServingMetrics(registry, budget, SERVICE)
    serving.observe_request("Allocate", "OK", budget)
    buckets = latency_buckets(budget)
    assert list(buckets) == sorted(set(buckets))
    assert set(LATENCY_BUCKETS_SECONDS) <= set(buckets)
    assert len(buckets) == len(LATENCY_BUCKETS_SECONDS) + (budget not in LATENCY_BUCKETS_SECONDS)
    assert min(LATENCY_BUCKETS_SECONDS) == 50e-6
    assert max(LATENCY_BUCKETS_SECONDS) == 100e-3

    le = [
        s.labels["le"]
        for f in registry.collect()
        if f.name == "allocator_serving_request_latency_seconds"
        for s in f.samples
        if s.name.endswith("_bucket")
    ]
    assert le.count(floatToGoString(budget)) == 1
    assert [float(v) for v in le] == [*buckets, math.inf]
    at_budget = {"grpc_method": "Allocate", "grpc_code": "OK", "le": floatToGoString(budget)}
    value = registry.get_sample_value("allocator_serving_request_latency_seconds_bucket", at_budget)
    assert value == 1.0  # le is inclusive: a request exactly at the budget is within it


@pytest.mark.parametrize("budget", [0.0, -1e-3, math.nan, math.inf])
def test_budget_must_be_positive_and_finite(registry, budget):
    with pytest.raises(ValueError, match="latency_budget_seconds"):
        ServingMetrics(registry, budget, SERVICE)


def test_over_budget_counts_only_requests_above_the_budget(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    for seconds in (0.1e-3, 1e-3, BUDGET, 2.5e-3, 50e-3):
        serving.observe_request("Allocate", StatusCode.OK, seconds)
    serving.observe_request("ListModels", "OK", 0.2e-3)

    get = registry.get_sample_value
    assert get("allocator_serving_over_budget_total", {"grpc_method": "Allocate"}) == 2.0
    assert get("allocator_serving_over_budget_total", {"grpc_method": "ListModels"}) is None
    assert (
        get("allocator_serving_requests_total", {"grpc_method": "Allocate", "grpc_code": "OK"})
        == 5.0
    )
    labels = {"grpc_method": "Allocate", "grpc_code": "OK"}
    count = get("allocator_serving_request_latency_seconds_count", labels)
    within = get(
        "allocator_serving_request_latency_seconds_bucket",
        {**labels, "le": floatToGoString(BUDGET)},
    )
    assert count - within == 2.0  # the documented identity: over_budget = count - bucket{budget}
    assert get("allocator_serving_latency_budget_seconds") == BUDGET


def test_a_batch_is_held_to_the_budget_per_decision(registry):
    """The budget is a decision's: a batch of n decisions is within it up to n budgets."""
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    serving.observe_request("AllocateBatch", "OK", 90 * BUDGET, decisions=100)  # 0.9 each
    serving.observe_request("AllocateBatch", "OK", 3 * BUDGET, decisions=2)  # 1.5 each: over
    serving.observe_request("AllocateBatch", "INVALID_ARGUMENT", 0.5 * BUDGET, decisions=0)
    serving.observe_request("Allocate", "OK", 3 * BUDGET)  # one decision: over

    get = registry.get_sample_value
    assert get("allocator_serving_over_budget_total", {"grpc_method": "AllocateBatch"}) == 1.0
    assert get("allocator_serving_over_budget_total", {"grpc_method": "Allocate"}) == 1.0
    ok = {"grpc_method": "AllocateBatch", "grpc_code": "OK"}
    assert get("allocator_serving_requests_total", ok) == 2.0  # calls, not decisions
    assert get("allocator_serving_request_latency_seconds_sum", ok) == pytest.approx(2.4 * BUDGET)
    within = get(
        "allocator_serving_request_latency_seconds_bucket", {**ok, "le": floatToGoString(BUDGET)}
    )
    assert within == 1.0  # the identity over_budget = count - bucket{budget} holds for batches
    refused = {"grpc_method": "AllocateBatch", "grpc_code": "INVALID_ARGUMENT"}
    assert get("allocator_serving_request_latency_seconds_sum", refused) == 0.5 * BUDGET


def test_status_codes_are_recorded_by_name(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    serving.observe_request("Allocate", StatusCode.UNAVAILABLE, 1e-3)
    get = registry.get_sample_value
    assert get(
        "allocator_serving_requests_total", {"grpc_method": "Allocate", "grpc_code": "UNAVAILABLE"}
    )
    assert get(
        "allocator_serving_request_latency_seconds_count",
        {"grpc_method": "Allocate", "grpc_code": "UNAVAILABLE"},
    )


def test_observe_decisions_records_the_l1_gap_turnover_and_icm_reward(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    serving.observe_decisions([0.2, 2.0], [0.3, 2.0], [1.5, None])

    get = registry.get_sample_value
    assert get("allocator_serving_smoothing_gap_count") == 2.0
    assert get("allocator_serving_smoothing_gap_sum") == pytest.approx(0.2 + 2.0)
    assert get("allocator_serving_smoothing_gap_bucket", {"le": "0.25"}) == 1.0
    assert get("allocator_serving_smoothing_gap_bucket", {"le": "2.0"}) == 2.0
    assert get("allocator_serving_turnover_ratio_count") == 2.0
    assert get("allocator_serving_turnover_ratio_sum") == pytest.approx(2.3)
    assert get("allocator_serving_icm_reward_count") == 1.0  # None: no ICM, nothing observed
    assert get("allocator_serving_icm_reward_bucket", {"le": "1.0"}) == 0.0
    assert get("allocator_serving_icm_reward_bucket", {"le": "2.0"}) == 1.0
    # Negative buckets: prometheus_client (following OpenMetrics) exposes no _sum.
    assert get("allocator_serving_icm_reward_sum") is None


def test_observe_decisions_skips_only_the_non_finite_values(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    serving.observe_decisions([math.nan, 0.2], [0.3, math.nan], [math.inf, 1.5])
    serving.observe_decisions([math.nan], [math.inf], [math.nan])
    get = registry.get_sample_value
    for name, total in (("smoothing_gap", 0.2), ("turnover_ratio", 0.3)):
        assert get(f"allocator_serving_{name}_count") == 1.0
        assert get(f"allocator_serving_{name}_sum") == pytest.approx(total)
    assert get("allocator_serving_icm_reward_count") == 1.0


def series(registry: CollectorRegistry, sample_name: str) -> list[dict[str, str]]:
    return [s.labels for f in registry.collect() for s in f.samples if s.name == sample_name]


def test_set_model_replaces_the_previous_version(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    assert series(registry, "allocator_serving_model_info") == []  # absent until a model loads
    serving.model_info.set(name="us-equities", version="3", algorithm="td3", holds_anchor="false")
    serving.model_info.set(name="us-equities", version="4", algorithm="sac", holds_anchor="true")

    old = {"name": "us-equities", "version": "3", "algorithm": "td3", "holds_anchor": "false"}
    new = {"name": "us-equities", "version": "4", "algorithm": "sac", "holds_anchor": "true"}
    assert registry.get_sample_value("allocator_serving_model_info", old) is None
    assert registry.get_sample_value("allocator_serving_model_info", new) == 1.0
    assert series(registry, "allocator_serving_model_info") == [new]


def test_refusal_series_exist_at_zero_for_every_reason_from_the_start(registry):
    """A counter whose series appears at 1 is invisible to rate(): the first refusal would be."""
    ServingMetrics(registry, BUDGET, SERVICE)
    for reason in REFUSAL_REASONS:
        labels = {"reason": reason}
        assert registry.get_sample_value("allocator_serving_model_refused_total", labels) == 0.0
        assert registry.get_sample_value("allocator_serving_models_refused", labels) == 0.0


def test_refusals_are_counted_and_refused_versions_gauged_by_reason(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    serving.observe_refusal("missing_file")
    serving.observe_refusal("checksum_mismatch")
    serving.observe_refusal("checksum_mismatch")
    serving.set_refused_versions(["checksum_mismatch", "checksum_mismatch", "bad_graph"])
    serving.set_refused_versions(["checksum_mismatch"])  # replaces, never adds up

    def value(name: str, reason: str) -> float | None:
        return registry.get_sample_value(name, {"reason": reason})

    assert value("allocator_serving_model_refused_total", "missing_file") == 1.0
    assert value("allocator_serving_model_refused_total", "checksum_mismatch") == 2.0
    assert value("allocator_serving_models_refused", "checksum_mismatch") == 1.0
    assert value("allocator_serving_models_refused", "bad_graph") == 0.0
    with pytest.raises(ValueError, match="'typo' is not one of missing_file"):
        serving.observe_refusal("typo")
    with pytest.raises(ValueError, match="'typo' is not one of"):
        serving.set_refused_versions(["typo"])


def test_set_provider_keeps_one_series(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    serving.provider_info.set(provider="CUDAExecutionProvider")
    serving.provider_info.set(provider="CPUExecutionProvider")
    assert series(registry, "allocator_serving_provider_info") == [
        {"provider": "CPUExecutionProvider"}
    ]
    assert (
        registry.get_sample_value(
            "allocator_serving_provider_info", {"provider": "CPUExecutionProvider"}
        )
        == 1.0
    )


def test_batch_size_histogram(registry):
    serving = ServingMetrics(registry, BUDGET, SERVICE)
    serving.batch_size.observe(3)
    assert registry.get_sample_value("allocator_serving_batch_size_bucket", {"le": "4.0"}) == 1.0
    assert registry.get_sample_value("allocator_serving_batch_size_bucket", {"le": "2.0"}) == 0.0


def test_recorder_metrics(registry):
    _, recorder, _ = populated(registry)
    recorder.observe_write(10, 0.003)
    get = registry.get_sample_value
    assert get("allocator_recorder_queue_depth") == 12.0
    assert get("allocator_recorder_spooled_records") == 3.0
    assert get("allocator_recorder_spool_bytes") == 4096.0
    assert get("allocator_recorder_rows_written_total") == 74.0
    assert get("allocator_recorder_failed_writes_total", {"reason": "unavailable"}) == 1.0
    assert get("allocator_recorder_replayed_total") == 3.0
    assert get("allocator_recorder_rejected_total") == 1.0
    assert get("allocator_recorder_batch_write_latency_seconds_count") == 3.0  # failures too


def test_job_metrics(registry):
    _, _, jobs = populated(registry)
    collapsed = {"collapsed": True, "last": {"near_bound_ratio": 0.97}}
    jobs.record_window("2020-01-02", -0.4, collapsed)
    jobs.record_promotion("rejected")
    get = registry.get_sample_value
    window = {"window": "2020-01-02"}
    assert get("allocator_jobs_window_action_near_bound_ratio", window) == 0.97
    assert get("allocator_jobs_window_actor_collapsed", window) == 1.0
    # a window without a watch (a run from before it, or a flat policy) sets neither
    assert get("allocator_jobs_window_actor_collapsed", {"window": "2019-01-02"}) is None
    assert get("allocator_jobs_windows_total") == 2.0
    assert get("allocator_jobs_window_sharpe", {"window": "2019-01-02"}) == 0.9
    assert get("allocator_jobs_window_sharpe", {"window": "2020-01-02"}) == -0.4
    assert get("allocator_jobs_promotions_total", {"decision": "promoted"}) == 1.0
    assert get("allocator_jobs_promotions_total", {"decision": "rejected"}) == 1.0
    assert get("allocator_jobs_last_success_timestamp_seconds") == 1_700_000_000.0
    assert get("allocator_jobs_duration_seconds_count") == 1.0
    with pytest.raises(ValueError, match="maybe"):
        jobs.record_promotion("maybe")
    before = time.time()
    jobs.mark_success()
    assert get("allocator_jobs_last_success_timestamp_seconds") >= before


def test_both_promotion_decisions_are_exposed_before_any_verdict(registry):
    JobMetrics(registry)
    for decision in ("promoted", "rejected"):
        value = registry.get_sample_value("allocator_jobs_promotions_total", {"decision": decision})
        assert value == 0.0


def test_instances_on_two_registries_do_not_collide():
    first, second = CollectorRegistry(), CollectorRegistry()
    a, b = ServingMetrics(first, BUDGET, SERVICE), ServingMetrics(second, 5e-3, SERVICE)
    a.observe_request("Allocate", "OK", 10e-3)
    b.model_info.set(name="m", version="1", algorithm="td3", holds_anchor="false")
    RecorderMetrics(first), RecorderMetrics(second)
    JobMetrics(first), JobMetrics(second)
    labels = {"grpc_method": "Allocate", "grpc_code": "OK"}
    assert first.get_sample_value("allocator_serving_requests_total", labels) == 1.0
    assert second.get_sample_value("allocator_serving_requests_total", labels) is None
    assert series(first, "allocator_serving_model_info") == []
    assert second.get_sample_value("allocator_serving_latency_budget_seconds") == 5e-3


@pytest.mark.parametrize(
    "make",
    [lambda r: ServingMetrics(r, BUDGET, SERVICE), RecorderMetrics, JobMetrics],
    ids=["serving", "recorder", "jobs"],
)
def test_a_second_instance_on_the_same_registry_raises(registry, make):
    make(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        make(registry)


def test_exposition_parses(registry):
    populated(registry)
    text = generate_latest(registry).decode()
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    # The text format has no info type: the parser sees info metrics as gauges named *_info.
    expected = {
        name + ("_info" if kind == "info" else "") for name, kind in EXPECTED_FAMILIES.items()
    }
    assert expected <= set(parsed)
    budget_bucket = [
        s
        for s in parsed["allocator_serving_request_latency_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["le"] == floatToGoString(BUDGET)
    ]
    assert [s.labels["grpc_code"] for s in budget_bucket] == ["OK", "UNAVAILABLE"]
    assert [s.value for s in budget_bucket] == [1.0, 0.0]
    assert float(budget_bucket[0].labels["le"]) == BUDGET


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not installed (Debian package `prometheus`; CI installs it)",
)
def test_promtool_check_metrics_passes(registry):
    populated(registry)
    result = subprocess.run(
        ["promtool", "check", "metrics"],
        input=generate_latest(registry),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("replace", [True, False], ids=["put", "post"])
def test_push_to_an_unreachable_gateway_reports_a_clear_error(registry, replace):
    jobs = JobMetrics(registry)
    jobs.mark_success()
    url = f"http://127.0.0.1:{unused_port()}"
    start = time.monotonic()
    error = push_reporting(registry, url, "walk_forward", {}, timeout=2.0, replace=replace)
    assert re.search(r"walk_forward.*Pushgateway at http://127\.0\.0\.1:", error or "")
    assert time.monotonic() - start < 10.0


def test_push_needs_a_job_name(registry):
    with pytest.raises(ValueError, match="job"):
        push_reporting(registry, "http://127.0.0.1:9", "", {})


def test_a_failed_run_exports_no_last_success_time():
    """A failed run pushes with POST; a 0 here would overwrite the last good run's time."""
    registry = CollectorRegistry()
    jobs = JobMetrics(registry)
    jobs.record_window("2020-01-02", 0.1)
    assert registry.get_sample_value("allocator_jobs_last_success_timestamp_seconds") is None
    jobs.mark_success(5.0)
    assert registry.get_sample_value("allocator_jobs_last_success_timestamp_seconds") == 5.0


def test_job_push_without_a_gateway_pushes_nothing():
    pusher = JobPush(None, "allocator_retrain", {"model": "m"})
    assert pusher.succeeded(3.0) is None
    pusher.failed(3.0)
    get = pusher.registry.get_sample_value
    assert get("allocator_jobs_duration_seconds_count") == 0.0
    assert get("allocator_jobs_last_success_timestamp_seconds") is None


def test_job_push_reports_a_dead_gateway_instead_of_raising():
    url = f"http://127.0.0.1:{unused_port()}"
    failed = JobPush(url, "allocator_walk_forward", {"model": "m"})
    failed.failed(1.0)  # the run's own error is the one to report: nothing raised here
    assert failed.registry.get_sample_value("allocator_jobs_last_success_timestamp_seconds") is None
    done = JobPush(url, "allocator_walk_forward", {"model": "m"})
    error = done.succeeded(2.0)
    assert error is not None
    assert f"Pushgateway at {url}" in error
    assert done.registry.get_sample_value("allocator_jobs_duration_seconds_count") == 1.0
    assert done.registry.get_sample_value("allocator_jobs_last_success_timestamp_seconds") > 0
