"""The decision recorder's metrics. Every record is accounted for: written (``rows_written``),
spooled and later replayed (``spooled_records``, ``replayed``), or refused at the door
(``rejected``); a record that is none of these would be a decision lost without a trace."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from allocator.metrics.buckets import WRITE_LATENCY_BUCKETS_SECONDS


class RecorderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, documentation: str) -> Gauge:
            # livesum: under ``--workers N`` the server's figure is its workers' sum
            return Gauge(name, documentation, registry=registry, multiprocess_mode="livesum")

        def counter(name: str, documentation: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, documentation, labels, registry=registry)

        self.queue_depth = gauge(
            "allocator_recorder_queue_depth",
            "Records waiting in memory for the next batched write.",
        )
        self.spooled_records = gauge(
            "allocator_recorder_spooled_records",
            "Records currently in the local spool, waiting for the database to come back.",
        )
        self.spool_bytes = gauge(
            "allocator_recorder_spool_bytes", "Size of the local spool on disk."
        )
        self.rows_written = counter(
            "allocator_recorder_rows_written_total",
            "Decision rows committed to the database (replays included).",
        )
        self.failed_writes = counter(
            "allocator_recorder_failed_writes_total",
            "Batched writes that failed (their records were spooled), by short fixed reason.",
            ("reason",),
        )
        self.replayed = counter(
            "allocator_recorder_replayed_total",
            "Spooled records replayed into the database (idempotent on the request id).",
        )
        self.rejected = counter(
            "allocator_recorder_rejected_total",
            "Records refused at the door because the spool quota was reached; the caller is "
            "told, nothing is dropped silently.",
        )
        self.batch_write_latency = Histogram(
            "allocator_recorder_batch_write_latency_seconds",
            "Time of one batched write to the database, successful or not.",
            buckets=WRITE_LATENCY_BUCKETS_SECONDS,
            registry=registry,
        )

    def observe_write(self, rows: int, seconds: float) -> None:
        self.batch_write_latency.observe(seconds)
        self.rows_written.inc(rows)
