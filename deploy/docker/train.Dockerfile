# syntax=docker/dockerfile:1
# The trainer: `allocator train`, `export`, `retrain` (the CronJob), `walk-forward` (also a Ray
# head/worker image), `db upgrade`. torch is the CPU build, pinned as in pyproject's train extra.
#
# Build from the repository root:
#   docker build -f deploy/docker/train.Dockerfile -t allocator-train:0.1.0 .
# EXTRAS: the extras installed; by default every job's (Ray executors, `allocator tune`,
# TensorBoard logs), e.g. --build-arg EXTRAS=train for a smaller image of local jobs only.
FROM python:3.11-slim

ARG EXTRAS=train,ray,tune,tensorboard

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    MPLBACKEND=Agg \
    MPLCONFIGDIR=/tmp/matplotlib

RUN groupadd --system --gid 10001 allocator \
    && useradd --system --uid 10001 --gid allocator --no-create-home \
        --home-dir /app --shell /usr/sbin/nologin allocator

WORKDIR /app
# torch first, from the PyTorch CPU index: PyPI's wheel for Linux pulls GBs of CUDA libraries.
# The train extra's `torch==2.13.0` is then already satisfied by 2.13.0+cpu and left alone.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"

# A plain install held to requirements.lock, as in the serving image (the lock's torch is this
# same 2.13.0+cpu, so it stays).
COPY pyproject.toml README.md requirements.lock ./
COPY src ./src
COPY configs ./configs
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --constraint requirements.lock ".[${EXTRAS}]" \
    && python -c "import sys, torch; sys.exit(torch.version.cuda is not None)"

# Run directories and the default registry are written by the jobs: owned by their user.
RUN mkdir -p /app/runs /models \
    && chown allocator:allocator /app/runs /models
USER 10001:10001
# Anything that caches under $HOME writes to /tmp: Kubernetes runs this with a read-only root.
ENV HOME=/tmp

# Relative paths in configs/*.yaml (trainer configs, runs/) resolve from /app.
ENTRYPOINT []
CMD ["allocator", "--help"]
