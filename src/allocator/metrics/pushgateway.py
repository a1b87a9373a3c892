"""Pushing a batch job's metrics to a Prometheus Pushgateway: a dead gateway neither hangs the
job (``timeout``) nor loses its results (a ``PushError`` the caller reports)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import push_to_gateway, pushadd_to_gateway


class PushError(RuntimeError):
    """The Pushgateway could not be reached or refused the push."""


def push(
    registry: CollectorRegistry,
    gateway_url: str,
    job: str,
    *,
    grouping_key: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    replace: bool = True,
) -> None:
    """Push ``registry`` under ``job``: ``replace`` (PUT) replaces the whole group, else (POST)
    only the metrics pushed."""
    if not job:
        raise ValueError("job must be a non-empty name")
    send = push_to_gateway if replace else pushadd_to_gateway
    try:
        group = None if grouping_key is None else dict(grouping_key)  # the client wants a dict
        send(gateway_url, job=job, registry=registry, grouping_key=group, timeout=timeout)
    except OSError as exc:  # URLError, connection refused, timeouts, non-2xx responses
        raise PushError(
            f"could not push metrics of job {job!r} to the Pushgateway at {gateway_url}: {exc}"
        ) from exc


def push_reporting(
    registry: CollectorRegistry,
    gateway_url: str | None,
    job: str,
    grouping_key: Mapping[str, str],
    *,
    replace: bool = True,
) -> str | None:
    """``push`` to the gateway when one is configured; the error text, None when it went out
    (or there is no gateway). A failed push never undoes the work it reports."""
    if not gateway_url:
        return None
    try:
        push(registry, gateway_url, job, grouping_key=grouping_key, replace=replace)
    except PushError as exc:
        return str(exc)
    return None
