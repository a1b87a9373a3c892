"""Container health check: the standard gRPC health service, as Kubernetes' gRPC probe asks it.

Docker's HEALTHCHECK and compose run this inside the serving image; Kubernetes uses its
native ``grpc`` probes instead, except over TLS (kubelet's probe speaks plaintext only), where
``deploy/k8s/components/tls`` runs this script with the CA (and, for mTLS, a client pair).

Exit 0 when the service answers SERVING, 1 otherwise (NOT_SERVING, unknown service,
unreachable, timeout), which is what HEALTHCHECK and an exec probe expect. Settings come from
the flags or, for a HEALTHCHECK baked into the image, from ``ALLOCATOR_HEALTH_*`` variables.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "allocator.v1.Allocator"
"""The server sets this one and "" alike; naming ours also proves the right server answers."""


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def check(
    target: str,
    service: str = SERVICE,
    timeout: float = 3.0,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    server_name: str | None = None,
) -> tuple[bool, str]:
    """(serving?, what was seen) for one Health/Check call to ``target``."""
    if ca or cert:
        credentials = grpc.ssl_channel_credentials(_read(ca), _read(key), _read(cert))
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: list[str] | None = None) -> int:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=env("ALLOCATOR_HEALTH_TARGET", "127.0.0.1:50051"))
    parser.add_argument("--service", default=env("ALLOCATOR_HEALTH_SERVICE", SERVICE))
    timeout = float(env("ALLOCATOR_HEALTH_TIMEOUT", "3"))
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds")
    parser.add_argument("--ca", default=env("ALLOCATOR_HEALTH_CA"), help="trust this CA (TLS)")
    parser.add_argument("--cert", default=env("ALLOCATOR_HEALTH_CERT"), help="client cert (mTLS)")
    parser.add_argument("--key", default=env("ALLOCATOR_HEALTH_KEY"), help="client key (mTLS)")
    parser.add_argument(
        "--server-name",
        default=env("ALLOCATOR_HEALTH_SERVER_NAME"),
        help="name the server certificate is checked against (default: the target's host)",
    )
    args = parser.parse_args(argv)
    if bool(args.cert) != bool(args.key):
        parser.error("--cert and --key go together")
    try:
        ok, seen = check(
            args.target, args.service, args.timeout, args.ca, args.cert, args.key, args.server_name
        )
    except OSError as exc:  # an unreadable certificate file
        ok, seen = False, str(exc)
    print(f"{args.target} {args.service or '(server)'}: {seen}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
