"""The gRPC server metrics that stock gRPC dashboards and alerts read: go-grpc-prometheus's names
and labels, plus ``model`` and ``version`` (empty when no model was reached, and on streams, whose
messages may address several) so a rollout compares version against version. The handling time
is the whole call's."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from google.protobuf.descriptor import ServiceDescriptor
from prometheus_client import CollectorRegistry, Counter, Histogram

GRPC_TYPES = ("unary", "client_stream", "server_stream", "bidi_stream")
"""``grpc_type`` by (client streaming, server streaming), as go-grpc-prometheus names them."""


def code_name(code: str | Enum) -> str:
    """``grpc.StatusCode.OK`` and ``"OK"`` both give ``"OK"`` (no grpc import needed here)."""
    return code.name if isinstance(code, Enum) else str(code)


class GrpcServerMetrics:
    """Per-call counts and handling time for one gRPC service. A unary call is started,
    received, sent and handled once; a streaming call is started and handled once, and each
    message is counted as received and, when answered, as sent."""

    def __init__(
        self, registry: CollectorRegistry, service: ServiceDescriptor, buckets: Sequence[float]
    ) -> None:
        self.service = service.full_name
        self.method_types = {  # each method's grpc_type, as the proto declares it
            m.name: GRPC_TYPES[m.client_streaming + 2 * m.server_streaming] for m in service.methods
        }
        call = ["grpc_type", "grpc_service", "grpc_method"]
        self.started = Counter(
            "grpc_server_started_total", "RPCs started on the server.", call, registry=registry
        )
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, regardless of success or failure, by the model "
            "version that answered.",
            [*call, "grpc_code", "model", "version"],
            registry=registry,
        )
        self.handling_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Response latency of RPCs handled by the server (the whole call), by the model "
            "version that answered.",
            [*call, "model", "version"],
            buckets=buckets,
            registry=registry,
        )
        self.msg_received = Counter(
            "grpc_server_msg_received_total",
            "Messages received from clients.",
            call,
            registry=registry,
        )
        self.msg_sent = Counter(
            "grpc_server_msg_sent_total", "Messages sent to clients.", call, registry=registry
        )
        for method in self.method_types:  # every call series exists from the start for rate()
            for counter in (self.started, self.msg_received, self.msg_sent):
                counter.labels(*self._call(method))

    def _call(self, method: str) -> tuple[str, str, str]:
        kind = self.method_types.get(method)
        if kind is None:
            raise ValueError(
                f"gRPC method {method!r} is not one of {', '.join(sorted(self.method_types))}"
            )
        return kind, self.service, method

    def is_streaming(self, method: str) -> bool:
        """Whether ``method``'s messages are counted one by one instead of with its call."""
        return self._call(method)[0] != "unary"

    def observe_started(self, method: str) -> None:
        """A call of ``method`` arrived (``started - handled`` is the calls in flight)."""
        self.started.labels(*self._call(method)).inc()

    def observe_message(self, method: str) -> None:
        """One message of a streaming call, received and answered (an error too)."""
        call = self._call(method)
        self.msg_received.labels(*call).inc()
        self.msg_sent.labels(*call).inc()

    def observe_handled(
        self,
        method: str,
        code: str | Enum,
        seconds: float,
        *,
        model: str = "",
        version: str = "",
    ) -> None:
        """A finished call; a unary one also counts its request, and its response when OK."""
        call = self._call(method)
        name = code_name(code)
        self.handled.labels(*call, name, model, version).inc()
        self.handling_seconds.labels(*call, model, version).observe(seconds)
        if call[0] == "unary":
            self.msg_received.labels(*call).inc()
            if name == "OK":
                self.msg_sent.labels(*call).inc()
