"""Pushing a batch job's metrics to a Prometheus Pushgateway: a dead gateway neither hangs the
job (``timeout``) nor loses its results (the error text, for the caller to report)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import push_to_gateway, pushadd_to_gateway


def push_reporting(
    registry: CollectorRegistry,
    gateway_url: str | None,
    job: str,
    grouping_key: Mapping[str, str],
    *,
    replace: bool = True,
    timeout: float = 10.0,
) -> str | None:
    """Push ``registry`` under ``job`` when a gateway is configured: ``replace`` (PUT) replaces
    the whole group, else (POST) only the metrics pushed. The error text, None when it went out
    (or there is no gateway): a failed push never undoes the work it reports."""
    if not gateway_url:
        return None
    if not job:
        raise ValueError("job must be a non-empty name")
    send = push_to_gateway if replace else pushadd_to_gateway
    try:
        group = dict(grouping_key)  # the client wants a dict
        send(gateway_url, job=job, registry=registry, grouping_key=group, timeout=timeout)
    except OSError as exc:  # URLError, connection refused, timeouts, non-2xx responses
        return f"could not push metrics of job {job!r} to the Pushgateway at {gateway_url}: {exc}"
    return None
