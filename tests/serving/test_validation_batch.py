"""Batch validation: all or nothing, each refusal naming its item, each pin resolved once."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import pytest

from allocator.serving.proto import allocator_pb2 as pb
from allocator.serving.validation import (
    InvalidRequest,
    ModelShape,
    ValidRequest,
    validate_batch,
)
from tests.serving.requests import SHAPE, make_request, price_rows, validate_one

# --- batches ----------------------------------------------------------------------------------


def _batch(*requests: pb.AllocateRequest) -> pb.AllocateBatchRequest:
    return pb.AllocateBatchRequest(requests=list(requests))


def _fixed(shape: ModelShape = SHAPE) -> Callable[[str | None, str | None], ModelShape]:
    return lambda name, version: shape


def test_batch_validates_every_request_in_order() -> None:
    batch = _batch(
        *(make_request(1 + i % 4, portfolio_id=f"p{i}", request_id=f"r{i}") for i in range(6))
    )
    valid = validate_batch(batch, _fixed())
    assert [v.portfolio_id for v in valid] == [f"p{i}" for i in range(6)]
    assert [v.n_assets for v in valid] == [1, 2, 3, 4, 1, 2]


def test_empty_batch() -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_batch(pb.AllocateBatchRequest(), _fixed())
    assert info.value.field == "requests"
    assert "empty batch" in info.value.message


def test_batch_error_names_the_request() -> None:
    bad = make_request(portfolio_id="p2", request_id="r2")
    bad.prices[0] = math.nan
    batch = _batch(
        make_request(portfolio_id="p0", request_id="r0"),
        make_request(portfolio_id="p1", request_id="r1"),
        bad,
    )
    with pytest.raises(InvalidRequest) as info:
        validate_batch(batch, _fixed())
    assert info.value.field == "requests[2].prices"
    assert str(info.value).startswith("requests[2].prices: prices[0] = nan")


@pytest.mark.parametrize(
    ("field", "other"), [("request_id", "portfolio_id"), ("portfolio_id", "request_id")]
)
def test_batch_duplicates_are_named(field: str, other: str) -> None:
    requests = [make_request(portfolio_id=f"p{i}", request_id=f"r{i}") for i in range(3)]
    setattr(requests[2], field, getattr(requests[0], field))
    with pytest.raises(InvalidRequest) as info:
        validate_batch(_batch(*requests), _fixed())
    assert info.value.field == f"requests[2].{field}"
    assert f"duplicate {field}" in info.value.message
    assert f"requests[0].{field}" in info.value.message


def _prices_for(n: int, seed: int, window: int = SHAPE.window) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 50.0 * np.exp(np.cumsum(rng.normal(0.0, 0.02, (n, window + 1)), axis=1))


@pytest.mark.parametrize(
    ("ids", "prices", "current", "field", "match"),
    [
        ((), np.zeros((0, 6)), None, "asset_ids", "at least one"),
        (tuple("ABCDE"), _prices_for(5, 0), None, "asset_ids", "at most 4 \\(max_assets\\)"),
        (("A", "A"), _prices_for(2, 0), None, "asset_ids[1]", "duplicate asset id 'A'"),
        (("A", ""), _prices_for(2, 0), None, "asset_ids[1]", "required"),
        (("CASH",), _prices_for(1, 0), None, "asset_ids[0]", "reserved"),
        (("A",), _prices_for(1, 0, window=7), None, "prices", "expected 6 values"),
        (("A", "B"), _prices_for(1, 0), None, "prices", "expected 12 values"),
        (
            ("A", "B"),
            np.where(np.eye(2, 6) > 0, np.nan, 1.0),
            None,
            "prices",
            "asset 'A'.*must be finite and > 0",
        ),
        (
            ("A", "B"),
            np.r_[np.ones((1, 6)), -np.ones((1, 6))],
            None,
            "prices",
            "asset 'B'.*must be finite and > 0",
        ),
        (("A",), _prices_for(1, 0), [1.0], "current_weights", "expected 2 values"),
        (("A",), _prices_for(1, 0), [0.7, 0.7], "current_weights", "sum to"),
        (("A",), _prices_for(1, 0), [1.5, -0.5], "current_weights", ">= 0"),
        (("A",), _prices_for(1, 0), [math.nan, 1.0], "current_weights", "finite"),
        (("A",), _prices_for(1, 0), [1e308, 1e308], "current_weights", "sum to inf"),
    ],
)
def test_bad_arrays_are_refused_at_the_edge_naming_the_item_and_field(
    ids: tuple[str, ...], prices: np.ndarray, current: list[float] | None, field: str, match: str
) -> None:
    """What the decision step once re-checked is refused here, before anything is decided: the
    step trusts a ``ValidRequest``. In a batch the error names the item (``requests[1]``)."""
    good = pb.AllocateRequest(
        portfolio_id="good", request_id="g", asset_ids=["OK"], prices=_prices_for(1, 99).ravel()
    )
    bad = pb.AllocateRequest(
        portfolio_id="bad", request_id="b", asset_ids=list(ids), prices=prices.ravel().tolist()
    )
    if current is not None:
        bad.current_weights.extend(current)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # huge weights are refused, not overflowed on the way
        with pytest.raises(InvalidRequest, match=match) as info:
            validate_batch(_batch(good, bad), _fixed())
    assert info.value.field == f"requests[1].{field}"
    assert str(info.value).startswith(f"requests[1].{field}: ")


@pytest.mark.parametrize(
    "build",
    [
        lambda: pb.AllocateRequest(asset_ids=["A"], prices=["x"] * 6),
        lambda: pb.AllocateRequest(asset_ids=[1], prices=[1.0] * 6),
    ],
    ids=["prices-not-numbers", "asset-id-not-a-string"],
)
def test_values_of_the_wrong_type_cannot_be_sent(build: Callable[[], object]) -> None:
    """Non-numeric prices or non-string ids never reach validation: the message refuses them."""
    with pytest.raises(TypeError):
        build()


def test_batch_resolves_each_pin_once_with_its_own_shape() -> None:
    calls: list[tuple[str | None, str | None]] = []
    shapes = {None: ModelShape(4, 5), "wide": ModelShape(2, 9)}

    def shape_for(name: str | None, version: str | None) -> ModelShape:
        calls.append((name, version))
        return shapes[name]

    requests = []
    for i in range(5):
        if i % 2:
            request = pb.AllocateRequest(
                portfolio_id=f"p{i}",
                request_id=f"r{i}",
                asset_ids=["X", "Y"],
                prices=price_rows(2, window=9).ravel().tolist(),
            )
            request.model.name = "wide"
        else:
            request = make_request(3, portfolio_id=f"p{i}", request_id=f"r{i}")
        requests.append(request)
    valid = validate_batch(_batch(*requests), shape_for)
    assert calls == [(None, None), ("wide", None)]
    assert [v.prices.shape for v in valid] == [(3, 6), (2, 10), (3, 6), (2, 10), (3, 6)]


def test_batch_resolver_errors_propagate_with_the_index() -> None:
    class UnknownModelError(LookupError):
        pass

    def shape_for(name: str | None, version: str | None) -> ModelShape:
        if name == "ghost":
            raise UnknownModelError(f"no model {name}")
        return SHAPE

    second = make_request(portfolio_id="p1", request_id="r1")
    second.model.name = "ghost"
    with pytest.raises(UnknownModelError) as info:
        validate_batch(_batch(make_request(), second), shape_for)
    assert "requests[1].model" in getattr(info.value, "__notes__", [])


# --- the whole-batch check agrees with the request-by-request one ---------------------------


def _each(batch: pb.AllocateBatchRequest, shape: ModelShape = SHAPE) -> list[ValidRequest]:
    """What validating each request alone gives (the reference for the whole-batch check)."""
    return [validate_one(r, shape) for r in batch.requests]


def test_whole_batch_check_gives_what_each_request_alone_gives() -> None:
    requests = [
        make_request(1 + i % 4, portfolio_id=f"p{i}", request_id=f"r{i}", weights=i % 3 > 0, seed=i)
        for i in range(40)
    ]
    batch = _batch(*requests)
    valid = validate_batch(batch, _fixed())
    for got, want in zip(valid, _each(batch), strict=True):
        assert (got.portfolio_id, got.request_id, got.asset_ids) == (
            want.portfolio_id,
            want.request_id,
            want.asset_ids,
        )
        assert np.array_equal(got.prices, want.prices)
        assert got.prices.shape == want.prices.shape
        assert not got.prices.flags.writeable
        if want.current_weights is None:
            assert got.current_weights is None
        else:
            assert got.current_weights is not None
            assert not got.current_weights.flags.writeable
            assert np.array_equal(got.current_weights, want.current_weights)


def test_weights_at_the_tolerance_are_judged_as_alone() -> None:
    """Rows are summed as a single request's weights are, so a sum just inside (or outside) the
    tolerance gets the same verdict in a batch as alone."""
    rng = np.random.default_rng(1)
    for trial in range(200):
        requests = []
        for i in range(5):
            request = make_request(3, portfolio_id=f"p{i}", request_id=f"r{i}", weights=False)
            w = rng.dirichlet(np.ones(4)) * (
                1.0 + rng.choice([-1, 1]) * rng.uniform(0.9e-6, 1.1e-6)
            )
            request.current_weights.extend(w.tolist())
            requests.append(request)
        batch = _batch(*requests)
        try:
            alone: object = _each(batch)
        except InvalidRequest as exc:
            alone = exc.field
        try:
            together: object = validate_batch(batch, _fixed())
        except InvalidRequest as exc:
            together = exc.field.split(".", 1)[1]
        assert isinstance(alone, str) == isinstance(together, str), trial
        if isinstance(alone, str):
            assert alone == together


def test_the_first_bad_field_is_named_whatever_comes_after() -> None:
    """A bad price in requests[0] is named before a bad asset id in requests[1]."""
    bad_price = make_request(2, portfolio_id="p0", request_id="r0")
    bad_price.prices[3] = -1.0
    bad_id = make_request(2, portfolio_id="p1", request_id="r1")
    bad_id.asset_ids[1] = "cash"
    with pytest.raises(InvalidRequest) as info:
        validate_batch(_batch(bad_price, bad_id), _fixed())
    assert info.value.field == "requests[0].prices"
    assert "prices[3] = -1.0" in info.value.message


def test_mixed_widths_and_models_in_one_batch() -> None:
    small, large = ModelShape(max_assets=4, window=5), ModelShape(max_assets=6, window=2)

    def shape_for(name: str | None, version: str | None) -> ModelShape:
        return large if name == "large" else small

    requests = [make_request(1 + i % 4, portfolio_id=f"p{i}", request_id=f"r{i}") for i in range(4)]
    other = pb.AllocateRequest(
        portfolio_id="q", request_id="rq", asset_ids=["X", "Y"], prices=price_rows(2, 2).ravel()
    )
    other.model.name = "large"
    valid = validate_batch(_batch(*requests, other), shape_for)
    assert [v.prices.shape for v in valid] == [(1, 6), (2, 6), (3, 6), (4, 6), (2, 3)]
    assert valid[-1].model_name == "large"
    assert valid[-1].current_weights is None
