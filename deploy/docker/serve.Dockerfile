# syntax=docker/dockerfile:1
# The allocation server: ONNX Runtime and gRPC from the `serve` extra, never torch.
# It also runs the schema migrations (`allocator db upgrade`): alembic is in the same extra.
#
# Build from the repository root (the context must be the checkout, see .dockerignore):
#   docker build -f deploy/docker/serve.Dockerfile -t allocator-serve:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# A fixed uid/gid, so Kubernetes' runAsUser/fsGroup and volume ownership can name it.
RUN groupadd --system --gid 10001 allocator \
    && useradd --system --uid 10001 --gid allocator --no-create-home \
        --home-dir /var/lib/allocator --shell /usr/sbin/nologin allocator

WORKDIR /app
# A plain (non-editable) install: the migrations ship inside the package (allocator:migrations).
# Every dependency at the version of requirements.lock, so a rebuild installs the same image.
COPY pyproject.toml README.md requirements.lock ./
COPY src ./src
COPY deploy/docker/healthcheck.py ./deploy/docker/healthcheck.py
# The cache mount keeps wheels between builds; the second command fails the build if anything
# pulled torch in (the serving contract: ONNX only).
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --constraint requirements.lock ".[serve]" \
    && ! pip show torch >/dev/null 2>&1

# Runtime data (recorder spool, the SQLite default) lives outside the read-only code. /models
# is owned by the runtime user too: a fresh named volume copies this ownership, and the trainer
# (same uid) writes the registry that the server reads.
RUN mkdir -p /var/lib/allocator/spool /models \
    && chown -R allocator:allocator /var/lib/allocator /models
WORKDIR /var/lib/allocator
USER 10001:10001

EXPOSE 50051 9464
# Docker and compose only: Kubernetes uses its native gRPC probes (deploy/k8s).
# ALLOCATOR_HEALTH_TARGET / _CA / _CERT / _KEY point it elsewhere or over TLS.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py"]

ENTRYPOINT ["allocator", "serve"]
CMD ["--registry", "/models", "--host", "0.0.0.0", "--spool-dir", "/var/lib/allocator/spool"]
