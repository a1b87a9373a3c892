"""Prometheus metric definitions, one module per metric set.

Names follow ``allocator_<subsystem>_<name>_<unit>`` in base units, counters ending ``_total``.
Each class creates its metrics on the ``CollectorRegistry`` it is given (one instance per
registry: a second raises ``ValueError``). Label values stay a small fixed vocabulary: never a
portfolio id, request id or exception message.
"""
