"""Which gRPC status a failed decision gets, and the message the client reads: one mapping for a
unary call's abort and a stream message's error reply alike.
"""

from __future__ import annotations

import logging

import grpc
import redis

from allocator.recording.recorder import RecorderRefusedError
from allocator.recording.records import RecordError
from allocator.registry.errors import ModelNotFoundError
from allocator.serving.batcher import DeadlineExceededError
from allocator.serving.state import StateLockLostError, StateLockTimeoutError
from allocator.serving.validation import InvalidRequest

__all__ = ["error_status"]

log = logging.getLogger("allocator.serving")


def error_status(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """``(code, message)`` for what a call of ``method`` raised; ``INTERNAL`` means a bug in the
    server (logged here with its traceback), never something a client sent."""
    if isinstance(exc, InvalidRequest | RecordError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, DeadlineExceededError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)
    if isinstance(exc, ModelNotFoundError):  # a validator's note names the field: the bad pin
        notes = getattr(exc, "__notes__", None)
        return grpc.StatusCode.NOT_FOUND, f"{notes[-1]}: {exc}" if notes else str(exc)
    if isinstance(exc, RecorderRefusedError):
        return grpc.StatusCode.UNAVAILABLE, f"decision not recorded, retry: {exc}"
    if isinstance(exc, StateLockTimeoutError | StateLockLostError):
        return grpc.StatusCode.UNAVAILABLE, f"portfolio busy, retry: {exc}"
    if isinstance(exc, redis.RedisError):
        return grpc.StatusCode.UNAVAILABLE, f"state store unavailable: {exc}"
    log.error("%s failed", method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})"
