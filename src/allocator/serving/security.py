"""Bearer-token authentication and TLS/mTLS credentials of the allocation server.

The token check is a server interceptor, so no handler can forget it, and compares digests in
constant time. Health checks and reflection stay open: Kubernetes' gRPC probes send no
metadata, and neither service reveals or changes anything about portfolios.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import grpc

__all__ = [
    "OPEN_SERVICES",
    "Context",
    "Continuation",
    "TokenAuthInterceptor",
    "bearer_token",
    "method_kind",
    "read_tokens",
    "server_credentials",
]

OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
"""Method prefixes that need no token."""


def read_tokens(path: str | Path) -> tuple[str, ...]:
    """One token per line (several let a rotation overlap); blanks and ``#`` comments skipped."""
    lines = _read("--auth-token-file", path).decode().splitlines()
    tokens = tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))
    if not tokens:
        raise ValueError(f"--auth-token-file {path}: the file holds no token")
    return tokens


def _read(option: str, path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot read it ({exc.strerror})") from None


def bearer_token(header: object) -> str | None:
    """The token of ``Bearer <token>``, else ``None``; the scheme in any case (RFC 9110 11.1) and
    spaces around the token ignored, as clients differ in both."""
    if not isinstance(header, str):
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip(" ")
    return token if scheme.lower() == "bearer" and token else None


Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
"""What an aio handler is given besides its request."""
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]
"""The rest of an aio server's interceptor chain."""


def method_kind(handler: grpc.RpcMethodHandler) -> str:
    """``unary_unary`` .. ``stream_stream``: how grpc names the handler factory of its kind."""
    streaming = (handler.request_streaming, handler.response_streaming)
    return "_".join("stream" if s else "unary" for s in streaming)


def _deny(message: str, kind: str) -> grpc.RpcMethodHandler:
    """A handler refusing a call of ``kind``: a streaming call is refused without reading."""

    async def abort(request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    handler: grpc.RpcMethodHandler = getattr(grpc, f"{kind}_rpc_method_handler")(abort)
    return handler


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires ``authorization: Bearer <token>``, one of ``tokens`` (``read_tokens`` refuses
    none), except on ``OPEN_SERVICES``; ``on_denied`` is told the method of each refused call."""

    def __init__(self, tokens: Sequence[str], on_denied: Callable[[str], None]) -> None:
        self._expected = tuple(hashlib.sha256(t.encode()).digest() for t in tokens)
        self._on_denied = on_denied

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method.startswith(OPEN_SERVICES):
            return await continuation(handler_call_details)
        metadata = handler_call_details.invocation_metadata or ()
        token = bearer_token(next((v for k, v in metadata if k == "authorization"), None))
        message = "missing bearer token: send metadata 'authorization: Bearer <token>'"
        if token is not None:
            given = hashlib.sha256(token.encode()).digest()
            # Compare with every accepted token, no early exit: the time says nothing about which.
            if any([hmac.compare_digest(given, expected) for expected in self._expected]):
                return await continuation(handler_call_details)
            message = "invalid bearer token"
        self._on_denied(method.rsplit("/", 1)[-1])
        handler = await continuation(handler_call_details)
        return _deny(message, "unary_unary" if handler is None else method_kind(handler))


def server_credentials(
    cert: str | Path, key: str | Path, client_ca: str | Path | None = None
) -> grpc.ServerCredentials:
    """With ``client_ca`` the server requires and verifies client certificates."""
    chain, private_key = _read("--tls-cert", cert), _read("--tls-key", key)
    return grpc.ssl_server_credentials(
        [(private_key, chain)],
        root_certificates=None if client_ca is None else _read("--tls-client-ca", client_ca),
        require_client_auth=client_ca is not None,
    )
