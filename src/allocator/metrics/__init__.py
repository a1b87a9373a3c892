"""Prometheus metric definitions of the allocation server, the recorder and the batch jobs.

One module per metric set: ``serving`` (the allocation server), ``recorder`` (the decision
recorder), ``jobs`` (walk-forward and retraining runs), with their buckets in ``buckets``, the
info-metric collector in ``info``, the Pushgateway client in ``pushgateway`` and the
supervisor's reader of its workers' files in ``multiprocess``.

Names follow ``allocator_<subsystem>_<name>_<unit>`` with base units (``_seconds``, ``_bytes``)
and counters ending in ``_total``. Nothing here is a module-level global: each class creates its
metrics on the ``CollectorRegistry`` it is given, so the server passes the registry it exposes,
a batch job passes a fresh one it pushes, and tests pass an isolated ``CollectorRegistry()``.

One instance per registry: a second instance of the same class on the same registry raises
``ValueError`` ("Duplicated timeseries in CollectorRegistry"), which prometheus_client raises on
any name clash. Two instances on two registries never collide.

Label values must stay a small fixed vocabulary (method names, gRPC status code names, failure
reasons): never a portfolio id, request id or exception message.
"""
