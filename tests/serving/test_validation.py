"""Request validation: every bad input is refused with the field named, and nothing else raises."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.portfolio import CASH_ID, is_cash_id
from allocator.serving.proto import allocator_pb2 as pb
from allocator.serving.validation import (
    InvalidRequest,
    ModelShape,
    ValidRequest,
    model_pin,
    validate_batch,
    validate_request,
    validate_reset,
)

SHAPE = ModelShape(max_assets=4, window=5)


def _prices(n: int, window: int = SHAPE.window, seed: int = 0) -> np.ndarray:
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
        prices=_prices(n, seed=seed).ravel().tolist(),
    )
    if weights:
        request.current_weights.extend([1.0 / (n + 1)] * (n + 1))
    return request


def refused(request: pb.AllocateRequest, shape: ModelShape = SHAPE) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate_request(request, shape)
    return info.value


# --- the happy path -------------------------------------------------------------------------


def test_valid_request_is_typed_and_shaped() -> None:
    request = make_request(3)
    request.model.name = "alpha"
    valid = validate_request(request, SHAPE)
    assert isinstance(valid, ValidRequest)
    assert valid.portfolio_id == "fund-1"
    assert valid.request_id == "req-1"
    assert valid.asset_ids == ("A0", "A1", "A2")
    assert valid.n_assets == 3
    assert valid.prices.dtype == np.float64
    assert valid.prices.shape == (3, SHAPE.window + 1)
    np.testing.assert_array_equal(valid.prices, _prices(3))  # row-major, oldest first
    assert valid.current_weights is not None
    assert valid.current_weights.shape == (4,)
    assert (valid.model_name, valid.model_version) == ("alpha", None)
    with pytest.raises(ValueError, match="read-only"):
        valid.prices[0, 0] = 1.0


def test_weights_and_pin_are_optional() -> None:
    valid = validate_request(make_request(1, weights=False), SHAPE)
    assert valid.current_weights is None
    assert valid.model_name is None
    assert valid.model_version is None


def test_exactly_max_assets_is_fine() -> None:
    assert validate_request(make_request(SHAPE.max_assets), SHAPE).n_assets == SHAPE.max_assets


def test_weights_within_tolerance_and_with_zeros() -> None:
    request = make_request(3, weights=False)
    request.current_weights.extend([0.0, 0.5, 0.5 + 5e-7, 0.0])
    assert validate_request(request, SHAPE).current_weights is not None


def test_model_pin() -> None:
    request = make_request()
    assert model_pin(request) == (None, None)
    request.model.version = "7"
    assert model_pin(request) == (None, "7")
    request.model.name = "beta"
    assert model_pin(request) == ("beta", "7")


# --- every refusal names its field ----------------------------------------------------------


def test_empty_request() -> None:
    error = refused(pb.AllocateRequest())
    assert error.field == "request"
    assert "empty request" in str(error)


@pytest.mark.parametrize("field", ["portfolio_id", "request_id"])
def test_missing_ids(field: str) -> None:
    request = make_request()
    request.ClearField(field)
    error = refused(request)
    assert error.field == field
    assert str(error).startswith(f"{field}: ")


@pytest.mark.parametrize("field", ["portfolio_id", "request_id"])
@pytest.mark.parametrize(("value", "words"), [("x" * 201, "201 characters"), ("a\x00b", "NUL")])
def test_bad_ids(field: str, value: str, words: str) -> None:
    request = make_request()
    setattr(request, field, value)
    error = refused(request)
    assert error.field == field
    assert words in error.message


def test_ids_of_200_characters_are_fine() -> None:
    assert validate_request(make_request(portfolio_id="p" * 200), SHAPE).portfolio_id == "p" * 200


def test_no_assets() -> None:
    request = make_request()
    request.ClearField("asset_ids")
    request.ClearField("prices")
    request.ClearField("current_weights")
    error = refused(request)
    assert error.field == "asset_ids"
    assert "at least one" in error.message


def test_more_assets_than_the_model_takes() -> None:
    error = refused(make_request(SHAPE.max_assets + 1))
    assert error.field == "asset_ids"
    assert "5 assets" in error.message
    assert "at most 4" in error.message


def test_duplicate_asset_is_named() -> None:
    request = make_request(3)
    request.asset_ids[2] = "A0"
    error = refused(request)
    assert error.field == "asset_ids[2]"
    assert "'A0'" in error.message
    assert "asset_ids[0]" in error.message


@pytest.mark.parametrize("cash", [CASH_ID, "cash", "Cash", "cAsH", "CA\u017fH"])
def test_cash_is_reserved_in_any_case(cash: str) -> None:
    request = make_request(3)
    request.asset_ids[1] = cash
    error = refused(request)
    assert error.field == "asset_ids[1]"
    assert "reserved" in error.message
    assert repr(cash) in error.message


@pytest.mark.parametrize(
    "ids", [("CA", "SH", "X"), ("cashier", "B"), ("CASH1", "xCASH"), ("CASH ", "C A S H")]
)
def test_ids_that_only_contain_cash_are_assets(ids: tuple[str, ...]) -> None:
    """The cheap test flags them (``CASH`` in the joined ids); the search clears them."""
    request = make_request(len(ids))
    request.asset_ids[:] = ids
    assert validate_request(request, SHAPE).asset_ids == ids


@pytest.mark.parametrize(
    ("value", "words"),
    [("", "required"), ("a\x00b", "NUL"), ("x" * 201, "201 characters"), ("y" * 10_000, "10000")],
)
def test_reset_refuses_the_ids_allocate_refuses(value: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as reset:
        validate_reset(pb.ResetPortfolioRequest(portfolio_id=value))
    allocate = refused(make_request(portfolio_id=value))
    assert reset.value.field == allocate.field == "portfolio_id"
    assert reset.value.message == allocate.message
    assert words in reset.value.message


def test_reset_takes_what_allocate_takes() -> None:
    for value in ("p" * 200, "fund-1", "üñí €"):
        assert validate_reset(pb.ResetPortfolioRequest(portfolio_id=value)) == value
        assert validate_request(make_request(portfolio_id=value), SHAPE).portfolio_id == value


@pytest.mark.parametrize(
    ("value", "words"), [("", "required"), ("a\x00", "NUL"), ("z" * 201, "201")]
)
def test_bad_asset_ids(value: str, words: str) -> None:
    request = make_request(3)
    request.asset_ids[1] = value
    error = refused(request)
    assert error.field == "asset_ids[1]"
    assert words in error.message


def test_long_but_valid_asset_ids() -> None:
    """Many ids whose total length passes 200 characters, each within it."""
    request = make_request(4)
    for i in range(4):
        request.asset_ids[i] = f"{i}" + "x" * 199
    assert validate_request(request, SHAPE).asset_ids[3].startswith("3x")


@pytest.mark.parametrize("delta", [-1, 1, -SHAPE.window - 1])
def test_wrong_number_of_prices(delta: int) -> None:
    request = make_request(3)
    values = list(request.prices)
    request.ClearField("prices")
    request.prices.extend(values[: len(values) + delta] if delta < 0 else [*values, 1.0])
    error = refused(request)
    assert error.field == "prices"
    assert "expected 18 values" in error.message
    assert f"got {18 + delta}" in error.message
    assert "window 5" in error.message


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0.0, -3.5])
def test_bad_price_names_asset_and_position(bad: float) -> None:
    request = make_request(3)
    request.prices[1 * 6 + 4] = bad  # asset A1, 5th price of 6
    error = refused(request)
    assert error.field == "prices"
    assert "'A1'" in error.message
    assert "asset_ids[1]" in error.message
    assert "price 5 of 6" in error.message
    assert "prices[10]" in error.message


def test_first_bad_price_is_reported() -> None:
    request = make_request(3)
    request.prices[17] = -1.0
    request.prices[7] = math.nan
    assert "prices[7]" in refused(request).message


@pytest.mark.parametrize("length", [1, 3, 5])
def test_current_weights_wrong_length(length: int) -> None:
    request = make_request(3, weights=False)
    request.current_weights.extend([1.0 / length] * length)
    error = refused(request)
    assert error.field == "current_weights"
    assert "expected 4 values" in error.message
    assert f"got {length}" in error.message
    assert "CASH first" in error.message


@pytest.mark.parametrize(
    ("weights", "words"),
    [
        ([0.5, -0.1, 0.3, 0.3], "current_weights[1] = -0.1 (asset 'A0')"),
        ([math.nan, 0.5, 0.25, 0.25], "current_weights[0] = nan (CASH)"),
        ([0.0, 0.5, math.inf, 0.5], "current_weights[2] = inf (asset 'A1')"),
        ([0.25, 0.25, 0.25, 0.2], "sum to 0.95"),
        ([0.25, 0.25, 0.25, 0.25 + 2e-6], "not 1"),
        ([0.0, 0.0, 0.0, 0.0], "sum to 0.0"),
    ],
)
def test_current_weights_not_a_distribution(weights: list[float], words: str) -> None:
    request = make_request(3, weights=False)
    request.current_weights.extend(weights)
    error = refused(request)
    assert error.field == "current_weights"
    assert words in error.message


@pytest.mark.parametrize(
    ("field", "value", "limit"), [("name", "m" * 201, 200), ("version", "9" * 101, 100)]
)
def test_absurd_model_pin(field: str, value: str, limit: int) -> None:
    request = make_request()
    setattr(request.model, field, value)
    error = refused(request)
    assert error.field == f"model.{field}"
    assert f"at most {limit}" in error.message


def test_invalid_request_is_a_value_error_and_nests() -> None:
    error = InvalidRequest("prices", "bad")
    assert isinstance(error, ValueError)
    assert str(error) == "prices: bad"
    nested = error.within("requests[2]")
    assert nested.field == "requests[2].prices"
    assert str(nested) == "requests[2].prices: bad"


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
                prices=_prices(2, window=9).ravel().tolist(),
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


# --- properties: valid input passes, any corruption is an InvalidRequest ---------------------


@st.composite
def valid_requests(draw: st.DrawFn) -> tuple[pb.AllocateRequest, ModelShape]:
    max_assets = draw(st.integers(1, 8))
    window = draw(st.integers(1, 12))
    n = draw(st.integers(1, max_assets))
    ids = draw(
        st.lists(
            st.text(min_size=1, max_size=12).filter(
                lambda s: "\x00" not in s and not is_cash_id(s)
            ),
            min_size=n,
            max_size=n,
            unique=True,
        )
    )
    prices = draw(
        st.lists(
            st.floats(min_value=1e-6, max_value=1e12, allow_nan=False),
            min_size=n * (window + 1),
            max_size=n * (window + 1),
        )
    )
    request = pb.AllocateRequest(
        portfolio_id=draw(st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s)),
        request_id=draw(st.uuids()).hex,
        asset_ids=ids,
        prices=prices,
    )
    if draw(st.booleans()):
        raw = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n + 1, max_size=n + 1)))
        raw[0] += 1e-3
        request.current_weights.extend((raw / raw.sum()).tolist())
    return request, ModelShape(max_assets, window)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_requests())
def test_valid_requests_pass_unchanged(case: tuple[pb.AllocateRequest, ModelShape]) -> None:
    request, shape = case
    valid = validate_request(request, shape)
    assert valid.asset_ids == tuple(request.asset_ids)
    assert valid.prices.shape == (len(request.asset_ids), shape.window + 1)
    assert valid.prices.ravel().tolist() == list(request.prices)
    if request.current_weights:
        assert valid.current_weights is not None
        assert valid.current_weights.tolist() == list(request.current_weights)


_ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=valid_requests(),
    mutation=st.sampled_from(
        ["price", "weight", "drop_price", "add_asset", "dup_asset", "cash", "weights_len", "id"]
    ),
    value=_ANY_FLOAT,
    position=st.integers(0, 10_000),
)
def test_corrupted_requests_raise_invalid_request_only(
    case: tuple[pb.AllocateRequest, ModelShape], mutation: str, value: float, position: int
) -> None:
    """Whatever goes wrong, the caller sees InvalidRequest (-> INVALID_ARGUMENT), never a crash."""
    request, shape = case
    n = len(request.asset_ids)
    if mutation == "price":
        request.prices[position % len(request.prices)] = value
    elif mutation == "weight":
        if not request.current_weights:
            request.current_weights.extend([1.0] + [0.0] * n)
        request.current_weights[position % (n + 1)] = value
    elif mutation == "drop_price":
        del request.prices[position % len(request.prices)]
    elif mutation == "add_asset":
        request.asset_ids.append("extra-" + "x" * (position % 3))
    elif mutation == "dup_asset":
        request.asset_ids[position % n] = request.asset_ids[(position + 1) % n]
    elif mutation == "cash":
        request.asset_ids[position % n] = (CASH_ID, "cash", "Cash")[position % 3]
    elif mutation == "weights_len":
        request.current_weights.extend([0.0] * (1 + position % 3))
    else:
        request.request_id = ["", "\x00", "r" * 201][position % 3]
    error: InvalidRequest | None = None
    try:
        validate_request(request, shape)
    except InvalidRequest as exc:
        error = exc
    if error is not None:
        assert error.field
        assert str(error).startswith(error.field + ": ")
        return
    # Some mutations can leave the request valid (a finite positive price, a same-id swap
    # when n == 1, a weight put where it already sums to 1): then it must really be valid.
    prices = np.asarray(request.prices)
    assert prices.size == n * (shape.window + 1)
    assert np.all(np.isfinite(prices))
    assert np.all(prices > 0)
    assert len(set(request.asset_ids)) == len(request.asset_ids) <= shape.max_assets
