"""Small valid requests and a model shape for the validation tests (one place for both files)."""

from __future__ import annotations

import numpy as np
import pytest

from allocator.serving.proto import allocator_pb2 as pb
from allocator.serving.validation import InvalidRequest, ModelShape, ValidRequest, validate_call

SHAPE = ModelShape(max_assets=4, window=5)


def price_rows(n: int, window: int = SHAPE.window, seed: int = 0) -> np.ndarray:
    """Closes for ``n`` assets, ``window + 1`` each (a seeded random walk around 100)."""
    rng = np.random.default_rng(seed)
    return 100.0 * np.exp(rng.normal(0.0, 0.01, size=(n, window + 1)).cumsum(axis=1))


def make_request(
    n: int = 3,
    *,
    portfolio_id: str = "fund-1",
    request_id: str = "req-1",
    weights: bool = True,
    seed: int = 0,
) -> pb.AllocateRequest:
    request = pb.AllocateRequest(
        portfolio_id=portfolio_id,
        request_id=request_id,
        asset_ids=[f"A{i}" for i in range(n)],
        prices=price_rows(n, seed=seed).ravel().tolist(),
    )
    if weights:
        request.current_weights.extend([1.0 / (n + 1)] * (n + 1))
    return request


def validate_one(request: pb.AllocateRequest, shape: ModelShape) -> ValidRequest:
    """One request checked as a call is, every model pin resolving to ``shape``."""
    return validate_call(request, lambda name, version: shape)


def refused(request: pb.AllocateRequest, shape: ModelShape = SHAPE) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate_one(request, shape)
    return info.value
