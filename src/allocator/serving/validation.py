"""Turn ``AllocateRequest`` messages into checked, typed requests, or say which field is wrong.

Bad input must become INVALID_ARGUMENT naming the field, never a crash deeper in the server, so
everything the model and the smoothing state will touch is checked here first. Pure functions of
numpy and the generated messages (no torch, no server state): the server resolves model pins to
a ``ModelShape`` and maps ``InvalidRequest`` to a status.

The batch call carries up to tens of thousands of decisions a second, so a batch's numbers are
converted one array per group of requests of equal length and checked by a few whole-array
reductions; the request-by-request check, and the per-element search for the culprit, only
run once something is known to be wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from allocator.portfolio import (
    CASH_ID,
    MAX_ID_LENGTH,
    MAX_VERSION_LENGTH,
    WEIGHT_SUM_TOLERANCE,
    check_id,
    is_cash_id,
)
from allocator.serving.proto import allocator_pb2 as pb

__all__ = [
    "InvalidRequest",
    "ModelShape",
    "ShapeResolver",
    "ValidRequest",
    "model_pin",
    "required_id",
    "validate_batch",
    "validate_call",
    "validate_request",
    "validate_reset",
]

Float64Array = NDArray[np.float64]

_CASH_FOLDED = CASH_ID.casefold()
"""What the cheap test for a reserved asset id looks for in the folded, joined ids."""

# The ufuncs' reduce, bound once: a little cheaper per call than the ndarray methods.
_min = np.minimum.reduce
_max = np.maximum.reduce
_sum = np.add.reduce
_EMPTY = np.empty(0)


class InvalidRequest(ValueError):  # noqa: N818 - the name the server and clients use
    """A request the server must refuse; ``field`` is the path a client can find it at."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def within(self, prefix: str) -> InvalidRequest:
        """The same error seen from an enclosing message, e.g. ``requests[2].prices``."""
        return InvalidRequest(f"{prefix}.{self.field}", self.message)


class ModelShape(NamedTuple):
    """What a model accepts: at most ``max_assets`` assets, ``window + 1`` prices each.

    ``limit`` names the manifest field the asset limit comes from, for the error message: a
    flat policy has one slot per asset (``max_assets``), a shared one a served limit.
    """

    max_assets: int
    window: int
    limit: str = "max_assets"


ShapeResolver = Callable[[str | None, str | None], ModelShape]
"""Maps a model pin (name, version; ``None`` = default / newest) to the model's shape."""


@dataclass(frozen=True, slots=True)
class ValidRequest:
    """A checked ``AllocateRequest``: arrays are float64, read-only and correctly shaped.

    The decision step (``decision.decide_batch``) trusts these invariants and checks nothing
    again, so every caller, the server and the replay alike, reaches it through validation.
    """

    portfolio_id: str
    request_id: str
    asset_ids: tuple[str, ...]
    prices: Float64Array
    """Shape ``(len(asset_ids), window + 1)``, oldest first, finite and > 0."""
    current_weights: Float64Array | None
    """Shape ``(len(asset_ids) + 1,)``, cash first, a distribution; ``None`` when not sent."""
    model_name: str | None
    """``None``: the default model."""
    model_version: str | None
    """``None``: the newest loaded version of the model."""

    @property
    def n_assets(self) -> int:
        return len(self.asset_ids)


def required_id(value: str, field: str) -> str:
    """A portfolio or request id, checked by the one rule every RPC applies (non-empty, at most
    ``MAX_ID_LENGTH`` characters, no NUL): the same id cannot be refused by one method and
    accepted by another."""
    return check_id(value, field, error=InvalidRequest)


def _optional_id(value: str, field: str, max_length: int) -> str | None:
    return check_id(value, field, max_length, error=InvalidRequest) if value else None


def model_pin(request: pb.AllocateRequest) -> tuple[str | None, str | None]:
    """The request's model pin as (name, version), ``None`` where unset; checks the strings."""
    if not request.HasField("model"):
        return None, None
    model = request.model
    return (
        _optional_id(model.name, "model.name", MAX_ID_LENGTH),
        _optional_id(model.version, "model.version", MAX_VERSION_LENGTH),
    )


def _check_asset_ids(ids: Sequence[str], shape: ModelShape) -> tuple[str, ...]:
    n = len(ids)
    if n == 0:
        raise InvalidRequest("asset_ids", "at least one asset is required")
    if n > shape.max_assets:
        raise InvalidRequest(
            "asset_ids",
            f"{n} assets, but the model takes at most {shape.max_assets} ({shape.limit})",
        )
    assets = tuple(ids)
    unique = set(assets)
    joined = "".join(assets)
    if (
        len(unique) != n
        or "" in unique
        or _CASH_FOLDED in joined.casefold()  # also flags ("CA", "SH"): the search tells
        or "\x00" in joined
        or (len(joined) > MAX_ID_LENGTH and max(map(len, assets)) > MAX_ID_LENGTH)
    ):
        _explain_asset_ids(assets)
    return assets


def _explain_asset_ids(assets: tuple[str, ...]) -> None:
    """Raise for the first bad asset id, if any: the cheap test above may flag good ids too
    (``CASH`` across two neighbours), so finding none here means they are fine."""
    first: dict[str, int] = {}
    for i, asset in enumerate(assets):
        field = f"asset_ids[{i}]"
        check_id(asset, field, error=InvalidRequest)
        if is_cash_id(asset):
            raise InvalidRequest(
                field, f"{asset!r}: {CASH_ID!r} is reserved for the cash slot, in any case"
            )
        j = first.setdefault(asset, i)
        if j != i:
            raise InvalidRequest(field, f"duplicate asset id {asset!r} (also asset_ids[{j}])")


def _check_prices(
    request: pb.AllocateRequest, assets: tuple[str, ...], window: int
) -> Float64Array:
    n, per_asset = len(assets), window + 1
    expected = n * per_asset
    got = len(request.prices)
    if got != expected:
        raise InvalidRequest(
            "prices",
            f"expected {expected} values ({n} assets x {per_asset} prices: window {window} + 1), "
            f"got {got}",
        )
    prices = np.asarray(request.prices, dtype=np.float64).reshape(n, per_asset)
    # min > 0 is False for NaN (it propagates) and for non-positive prices; max < inf for +inf.
    if not (_min(prices, None) > 0.0 and _max(prices, None) < np.inf):
        bad = np.flatnonzero(~((prices > 0.0) & np.isfinite(prices)))[0]
        i, j = divmod(int(bad), per_asset)
        raise InvalidRequest(
            "prices",
            f"prices[{bad}] = {float(prices[i, j])!r} (asset {assets[i]!r}, asset_ids[{i}], price "
            f"{j + 1} of {per_asset}): prices must be finite and > 0",
        )
    prices.flags.writeable = False
    return prices


def _check_current_weights(
    request: pb.AllocateRequest, assets: tuple[str, ...]
) -> Float64Array | None:
    got = len(request.current_weights)
    if got == 0:
        return None
    expected = len(assets) + 1
    if got != expected:
        raise InvalidRequest(
            "current_weights",
            f"expected {expected} values (CASH first, then the {len(assets)} assets), got {got}",
        )
    weights = np.asarray(request.current_weights, dtype=np.float64)
    # Each weight of a distribution lies in [0, 1] (NaN and inf fail it): checked before the
    # sum, so finite but huge weights are refused without overflowing it.
    if not (_min(weights) >= 0.0 and _max(weights) <= 1.0 + WEIGHT_SUM_TOLERANCE):
        with np.errstate(over="ignore"):
            _explain_current_weights(weights, float(_sum(weights)), assets)
    total = float(_sum(weights))
    if abs(total - 1.0) > WEIGHT_SUM_TOLERANCE:
        _explain_current_weights(weights, total, assets)
    weights.flags.writeable = False
    return weights


def _explain_current_weights(weights: Float64Array, total: float, assets: tuple[str, ...]) -> None:
    """Raise for bad current weights (only called once they are known to be bad)."""
    flagged = np.flatnonzero(~((weights >= 0.0) & np.isfinite(weights)))
    if flagged.size:
        bad = int(flagged[0])
        slot = CASH_ID if bad == 0 else f"asset {assets[bad - 1]!r}"
        raise InvalidRequest(
            "current_weights",
            f"current_weights[{bad}] = {float(weights[bad])!r} ({slot}): "
            "weights must be finite and >= 0",
        )
    raise InvalidRequest(
        "current_weights",
        f"weights sum to {total!r}, not 1 (tolerance {WEIGHT_SUM_TOLERANCE:g}): "
        "send a distribution over CASH and the assets",
    )


def validate_request(
    request: pb.AllocateRequest,
    shape: ModelShape,
    *,
    pin: tuple[str | None, str | None] | None = None,
) -> ValidRequest:
    """Check one request against the shape of the model that will answer it.

    ``pin`` is ``model_pin(request)`` when the caller already computed it (to resolve
    ``shape``), saving the second check. Raises ``InvalidRequest`` naming the first bad field.
    """
    if not (
        request.portfolio_id or request.request_id or len(request.asset_ids) or len(request.prices)
    ):
        raise InvalidRequest(
            "request", "empty request: portfolio_id, request_id, asset_ids and prices are required"
        )
    portfolio_id = required_id(request.portfolio_id, "portfolio_id")
    request_id = required_id(request.request_id, "request_id")
    name, version = model_pin(request) if pin is None else pin
    assets = _check_asset_ids(request.asset_ids, shape)
    prices = _check_prices(request, assets, shape.window)
    current = _check_current_weights(request, assets)
    return ValidRequest(
        portfolio_id=portfolio_id,
        request_id=request_id,
        asset_ids=assets,
        prices=prices,
        current_weights=current,
        model_name=name,
        model_version=version,
    )


def validate_reset(request: pb.ResetPortfolioRequest) -> str:
    """The portfolio id of a reset, by the rule ``Allocate`` applies to it: an id no allocation
    can create is refused, not looked up."""
    return required_id(request.portfolio_id, "portfolio_id")


def validate_batch(batch: pb.AllocateBatchRequest, shape_for: ShapeResolver) -> list[ValidRequest]:
    """Check a whole batch, all or nothing; errors name ``requests[i].<field>``.

    ``shape_for`` resolves each distinct model pin once per batch. What it raises (the server's
    unknown-model error, say) propagates unchanged, with a note naming ``requests[i].model``.
    request_ids and portfolio_ids must be distinct within a batch: two steps of one portfolio
    in one call would have no defined order.

    A batch is first checked whole (``_valid_batch``: the numbers of all its requests as one
    array each); only when that flags something does the request-by-request check run, which
    finds and names the first bad field exactly as it always did.
    """
    requests = batch.requests
    if not requests:
        raise InvalidRequest("requests", "empty batch: at least one request is required")
    valid = _valid_batch(requests, shape_for)
    return valid if valid is not None else _validate_each(requests, shape_for)


def validate_call(request: pb.AllocateRequest, shape_for: ShapeResolver) -> ValidRequest:
    """A unary call, checked as a batch of one (``_valid_batch``, the path every request is
    accepted by); what that flags is checked by ``validate_request``, which names the first bad
    field (``asset_ids[3]``). What ``shape_for`` raises for the pin propagates unchanged."""
    valid = _valid_batch((request,), shape_for)
    if valid is not None:
        return valid[0]
    pin = model_pin(request)
    return validate_request(request, shape_for(*pin), pin=pin)


def _valid_batch(
    requests: Sequence[pb.AllocateRequest], shape_for: ShapeResolver
) -> list[ValidRequest] | None:
    """The batch's ``ValidRequest``s, or None when anything is (or may be) wrong.

    Per request only what is per request (ids, the model pin, lengths; a distinct asset list
    is checked once); prices and current weights are converted one array per batch (a model's
    requests share the price count) and checked by whole-array reductions. It accepts exactly
    what ``_validate_each`` accepts: everything it flags goes there to be refused or accepted.
    """
    shapes: dict[tuple[str | None, str | None], ModelShape] = {}
    checked: dict[tuple[tuple[str, ...], ModelShape], tuple[str, ...]] = {}
    heads: list[tuple[str, str, tuple[str, ...], str | None, str | None, int]] = []
    with_weights: list[int] = []
    try:
        for request in requests:
            pin = model_pin(request)
            shape = shapes.get(pin)
            if shape is None:
                shape = shapes[pin] = shape_for(*pin)
            ids = tuple(request.asset_ids)
            assets = checked.get((ids, shape))
            if assets is None:
                assets = checked[(ids, shape)] = _check_asset_ids(ids, shape)
            per_asset = shape.window + 1
            if len(request.prices) != len(assets) * per_asset:
                return None
            n_weights = len(request.current_weights)
            if n_weights:
                if n_weights != len(assets) + 1:
                    return None
                with_weights.append(len(heads))
            heads.append(
                (
                    required_id(request.portfolio_id, "portfolio_id"),
                    required_id(request.request_id, "request_id"),
                    assets,
                    *pin,
                    per_asset,
                )
            )
    except Exception:  # the request-by-request check raises it, where it always did
        return None
    if len({h[0] for h in heads}) != len(heads) or len({h[1] for h in heads}) != len(heads):
        return None
    prices = _rows([r.prices for r in requests], range(len(heads)), _finite_positive)
    sent = _rows([requests[i].current_weights for i in with_weights], with_weights, _distributions)
    if prices is None or sent is None:
        return None
    current: list[Float64Array | None] = [None] * len(heads)
    for i, row in zip(with_weights, sent, strict=True):
        current[i] = row
    return [
        ValidRequest(pid, rid, assets, row.reshape(len(assets), per), current[i], name, version)
        for i, ((pid, rid, assets, name, version, per), row) in enumerate(
            zip(heads, prices, strict=True)
        )
    ]


def _finite_positive(block: Float64Array) -> bool:
    """``_check_prices``'s test, on many rows at once."""
    return bool(_min(block, None) > 0.0 and _max(block, None) < np.inf)


def _distributions(block: Float64Array) -> bool:
    """``_check_current_weights``'s test, on many rows at once: every weight in [0, 1] first (so
    finite but huge ones fail without overflowing a sum), then each row summed along its
    contiguous axis, as a single request's weights are."""
    if not (_min(block, None) >= 0.0 and _max(block, None) <= 1.0 + WEIGHT_SUM_TOLERANCE):
        return False
    totals = _sum(block, axis=1)
    return bool(_max(np.abs(totals - 1.0)) <= WEIGHT_SUM_TOLERANCE)


def _rows(
    fields: Sequence[Sequence[float]], members: Sequence[int], ok: Callable[[Float64Array], bool]
) -> list[Float64Array] | None:
    """The repeated fields as read-only float64 rows: one conversion and one ``ok`` test per
    group of equal length; None when a test fails."""
    groups: dict[int, list[int]] = {}
    for k, values in enumerate(fields):
        groups.setdefault(len(values), []).append(k)
    rows: list[Float64Array] = [_EMPTY] * len(fields)
    for at in groups.values():
        block = np.asarray([fields[k] for k in at], dtype=np.float64)
        if not ok(block):
            return None
        block.flags.writeable = False  # the rows are views of it
        for k, row in zip(at, block, strict=True):
            rows[k] = row
    return rows


def _validate_each(
    requests: Sequence[pb.AllocateRequest], shape_for: ShapeResolver
) -> list[ValidRequest]:
    """``validate_batch`` request by request: raises for the first bad field, in order."""
    shapes: dict[tuple[str | None, str | None], ModelShape] = {}
    request_index: dict[str, int] = {}
    portfolio_index: dict[str, int] = {}
    valid: list[ValidRequest] = []
    for i, request in enumerate(requests):
        try:
            pin = model_pin(request)
            shape = shapes.get(pin)
            if shape is None:
                try:
                    shape = shapes[pin] = shape_for(*pin)
                except InvalidRequest:
                    raise
                except Exception as exc:
                    exc.add_note(f"requests[{i}].model")
                    raise
            item = validate_request(request, shape, pin=pin)
        except InvalidRequest as exc:
            raise exc.within(f"requests[{i}]") from None
        j = request_index.setdefault(item.request_id, i)
        if j != i:
            raise InvalidRequest(
                f"requests[{i}].request_id",
                f"duplicate request_id {item.request_id!r} (also requests[{j}].request_id)",
            )
        j = portfolio_index.setdefault(item.portfolio_id, i)
        if j != i:
            raise InvalidRequest(
                f"requests[{i}].portfolio_id",
                f"duplicate portfolio_id {item.portfolio_id!r} (also requests[{j}].portfolio_id): "
                "send one step per portfolio per batch",
            )
        valid.append(item)
    return valid
