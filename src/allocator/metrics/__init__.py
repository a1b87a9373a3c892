"""Prometheus metric definitions, one module per metric set, on the ``CollectorRegistry`` each
class is given (a second instance per registry raises ``ValueError``). Names follow
``allocator_<subsystem>_<name>_<unit>`` in base units, counters ending ``_total``; label values
stay a small fixed vocabulary, never a portfolio id, request id or exception message."""
