"""Request validation: every bad input is refused with the field named, and nothing else raises."""

from __future__ import annotations

import math
import warnings

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
    required_id,
)
from tests.serving.requests import SHAPE, make_request, price_rows, refused, validate_one

# --- the happy path -------------------------------------------------------------------------


def test_valid_request_is_typed_and_shaped() -> None:
    request = make_request(3)
    request.model.name = "alpha"
    valid = validate_one(request, SHAPE)
    assert isinstance(valid, ValidRequest)
    assert valid.portfolio_id == "fund-1"
    assert valid.request_id == "req-1"
    assert valid.asset_ids == ("A0", "A1", "A2")
    assert valid.n_assets == 3
    assert valid.prices.dtype == np.float64
    assert valid.prices.shape == (3, SHAPE.window + 1)
    np.testing.assert_array_equal(valid.prices, price_rows(3))  # row-major, oldest first
    assert valid.current_weights is not None
    assert valid.current_weights.shape == (4,)
    assert (valid.model_name, valid.model_version) == ("alpha", None)
    with pytest.raises(ValueError, match="read-only"):
        valid.prices[0, 0] = 1.0


def test_weights_and_pin_are_optional() -> None:
    valid = validate_one(make_request(1, weights=False), SHAPE)
    assert valid.current_weights is None
    assert valid.model_name is None
    assert valid.model_version is None


def test_exactly_max_assets_is_fine() -> None:
    assert validate_one(make_request(SHAPE.max_assets), SHAPE).n_assets == SHAPE.max_assets


def test_weights_within_tolerance_and_with_zeros() -> None:
    request = make_request(3, weights=False)
    request.current_weights.extend([0.0, 0.5, 0.5 + 5e-7, 0.0])
    assert validate_one(request, SHAPE).current_weights is not None


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
    assert validate_one(make_request(portfolio_id="p" * 200), SHAPE).portfolio_id == "p" * 200


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
    assert validate_one(request, SHAPE).asset_ids == ids


@pytest.mark.parametrize(
    ("value", "words"),
    [("", "required"), ("a\x00b", "NUL"), ("x" * 201, "201 characters"), ("y" * 10_000, "10000")],
)
def test_reset_refuses_the_ids_allocate_refuses(value: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as reset:
        required_id(value, "portfolio_id")
    allocate = refused(make_request(portfolio_id=value))
    assert reset.value.field == allocate.field == "portfolio_id"
    assert reset.value.message == allocate.message
    assert words in reset.value.message


def test_reset_takes_what_allocate_takes() -> None:
    for value in ("p" * 200, "fund-1", "üñí €"):
        assert required_id(value, "portfolio_id") == value
        assert validate_one(make_request(portfolio_id=value), SHAPE).portfolio_id == value


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
    assert validate_one(request, SHAPE).asset_ids[3].startswith("3x")


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
        ([0.0, 1.5, 0.0, 0.0], "sum to 1.5"),
        ([1e308, 1e308, 0.0, 0.0], "sum to inf"),
    ],
)
def test_current_weights_not_a_distribution(weights: list[float], words: str) -> None:
    request = make_request(3, weights=False)
    request.current_weights.extend(weights)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # huge weights are refused, not overflowed on the way
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
    valid = validate_one(request, shape)
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
        validate_one(request, shape)
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
