"""Turn ``AllocateRequest`` messages into checked, typed requests, or say which field is wrong.

Bad input must become INVALID_ARGUMENT naming the field, never a crash deeper in the server.
The numbers are checked by whole-array reductions; the culprit is searched for only once
something is known to be wrong.
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
]

Float64Array = NDArray[np.float64]

_CASH_FOLDED = CASH_ID.casefold()
# The ufuncs' reduce, bound once: a little cheaper per call than the ndarray methods.
_min = np.minimum.reduce
_max = np.maximum.reduce
_sum = np.add.reduce
_EMPTY = np.empty(0)


class InvalidRequest(ValueError):  # noqa: N818 - the name the server and clients use
    """A request the server must refuse; ``field`` is its path in the message."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def within(self, prefix: str) -> InvalidRequest:
        return InvalidRequest(f"{prefix}.{self.field}", self.message)


class ModelShape(NamedTuple):
    """At most ``max_assets`` assets, ``window + 1`` prices each; ``limit`` names the manifest
    field of the asset limit, for the error message."""

    max_assets: int
    window: int
    limit: str = "max_assets"


ShapeResolver = Callable[[str | None, str | None], ModelShape]
"""Model pin (name, version; ``None``: default / newest) -> the model's shape."""


@dataclass(frozen=True, slots=True)
class ValidRequest:
    """A checked ``AllocateRequest`` (float64 read-only arrays): the decision step trusts it."""

    portfolio_id: str
    request_id: str
    asset_ids: tuple[str, ...]
    model_name: str | None  # None: the default model
    model_version: str | None  # None: the newest loaded version
    prices: Float64Array
    """Shape ``(len(asset_ids), window + 1)``, oldest first, finite and > 0."""
    current_weights: Float64Array | None
    """Shape ``(len(asset_ids) + 1,)``, cash first, a distribution; ``None`` when not sent."""

    @property
    def n_assets(self) -> int:
        return len(self.asset_ids)


def required_id(value: str, field: str) -> str:
    """The one id rule every RPC applies, so no method accepts an id another refuses."""
    return check_id(value, field, error=InvalidRequest)


def _optional_id(value: str, field: str, max_length: int) -> str | None:
    return check_id(value, field, max_length, error=InvalidRequest) if value else None


def model_pin(request: pb.AllocateRequest) -> tuple[str | None, str | None]:
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
    """Raise for the first bad asset id; the cheap test may flag good ids (``CASH`` across two
    neighbours), so finding none means they are fine."""
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


class _Head(NamedTuple):
    """A ``ValidRequest``'s fields before its numbers, in its order."""

    portfolio_id: str
    request_id: str
    assets: tuple[str, ...]
    model_name: str | None
    model_version: str | None
    per_asset: int


def validate_call(request: pb.AllocateRequest, shape_for: ShapeResolver) -> ValidRequest:
    return _validate((request,), shape_for, indexed=False)[0]


def validate_batch(batch: pb.AllocateBatchRequest, shape_for: ShapeResolver) -> list[ValidRequest]:
    """All or nothing; errors name ``requests[i].<field>``. What ``shape_for`` raises
    propagates with a note naming ``requests[i].model``. Ids must be distinct in a batch: two
    steps of one portfolio in one call would have no defined order."""
    requests = batch.requests
    if not requests:
        raise InvalidRequest("requests", "empty batch: at least one request is required")
    return _validate(requests, shape_for, indexed=True)


def _validate(
    requests: Sequence[pb.AllocateRequest], shape_for: ShapeResolver, *, indexed: bool
) -> list[ValidRequest]:
    """The one path every request is accepted by. Whatever fails is named as checking the
    requests one by one would name it: earlier requests' numbers are explained first."""
    shapes: dict[tuple[str | None, str | None], ModelShape] = {}
    checked: dict[tuple[tuple[str, ...], ModelShape], tuple[str, ...]] = {}
    seen: dict[str, dict[str, int]] = {"request_id": {}, "portfolio_id": {}}
    heads: list[_Head] = []
    for i, request in enumerate(requests):
        try:
            head = _head(request, shape_for, shapes, checked)
        except Exception as exc:
            _explain_numbers(requests, heads, indexed)
            if not isinstance(exc, InvalidRequest):
                exc.add_note(f"requests[{i}].model" if indexed else "model")
            elif indexed:
                raise exc.within(f"requests[{i}]") from None
            raise
        heads.append(head)
        for field, key in (("request_id", head.request_id), ("portfolio_id", head.portfolio_id)):
            j = seen[field].setdefault(key, i)
            if j != i:
                _explain_numbers(requests, heads, indexed)
                hint = ": send one step per portfolio per batch" if field == "portfolio_id" else ""
                raise InvalidRequest(
                    f"requests[{i}].{field}",
                    f"duplicate {field} {key!r} (also requests[{j}].{field}){hint}",
                )
    with_weights = [i for i, request in enumerate(requests) if len(request.current_weights)]
    prices = _rows([r.prices for r in requests], _finite_positive)
    sent = _rows([requests[i].current_weights for i in with_weights], _distributions)
    if prices is None or sent is None:
        _explain_numbers(requests, heads, indexed)
        raise AssertionError("a whole-array check refused numbers that no single check refuses")
    current = dict(zip(with_weights, sent, strict=True))
    return [
        ValidRequest(*h[:5], row.reshape(len(h.assets), h.per_asset), current.get(i))
        for i, (h, row) in enumerate(zip(heads, prices, strict=True))
    ]


def _head(
    request: pb.AllocateRequest,
    shape_for: ShapeResolver,
    shapes: dict[tuple[str | None, str | None], ModelShape],
    checked: dict[tuple[tuple[str, ...], ModelShape], tuple[str, ...]],
) -> _Head:
    """Everything of one request but its numbers; ``shapes`` and ``checked`` cache per batch."""
    if not (
        request.portfolio_id or request.request_id or len(request.asset_ids) or len(request.prices)
    ):
        raise InvalidRequest(
            "request", "empty request: portfolio_id, request_id, asset_ids and prices are required"
        )
    portfolio_id = required_id(request.portfolio_id, "portfolio_id")
    request_id = required_id(request.request_id, "request_id")
    pin = model_pin(request)
    shape = shapes.get(pin)
    if shape is None:
        shape = shapes[pin] = shape_for(*pin)
    ids = tuple(request.asset_ids)
    assets = checked.get((ids, shape))
    if assets is None:
        assets = checked[(ids, shape)] = _check_asset_ids(ids, shape)
    n, per_asset = len(assets), shape.window + 1
    if len(request.prices) != n * per_asset:
        raise InvalidRequest(
            "prices",
            f"expected {n * per_asset} values ({n} assets x {per_asset} prices: window "
            f"{shape.window} + 1), got {len(request.prices)}",
        )
    got = len(request.current_weights)
    if got and got != n + 1:
        raise InvalidRequest(
            "current_weights",
            f"expected {n + 1} values (CASH first, then the {n} assets), got {got}",
        )
    return _Head(portfolio_id, request_id, assets, *pin, per_asset)


def _finite_positive(block: Float64Array) -> bool:
    """``min > 0`` is False for NaN and non-positive prices; ``max < inf`` for +inf."""
    return bool(_min(block, None) > 0.0 and _max(block, None) < np.inf)


def _distributions(block: Float64Array) -> bool:
    """Every row a distribution; bounds first, so huge weights fail without overflowing a sum."""
    if not (_min(block, None) >= 0.0 and _max(block, None) <= 1.0 + WEIGHT_SUM_TOLERANCE):
        return False
    return bool(_max(np.abs(_sum(block, axis=1) - 1.0)) <= WEIGHT_SUM_TOLERANCE)


def _rows(
    fields: Sequence[Sequence[float]], ok: Callable[[Float64Array], bool]
) -> list[Float64Array] | None:
    """Read-only float64 rows, converted and tested per group of equal length; None: failed."""
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


def _explain_numbers(
    requests: Sequence[pb.AllocateRequest], heads: Sequence[_Head], indexed: bool
) -> None:
    """Raise for the first bad price or weight among the requests ``heads`` describes."""
    for i, head in enumerate(heads):
        try:
            _explain_prices(requests[i].prices, head)
            _explain_weights(requests[i].current_weights, head.assets)
        except InvalidRequest as exc:
            raise (exc.within(f"requests[{i}]") if indexed else exc) from None


def _explain_prices(values: Sequence[float], head: _Head) -> None:
    prices = np.asarray(values, dtype=np.float64)
    flagged = np.flatnonzero(~((prices > 0.0) & np.isfinite(prices)))
    if flagged.size:
        bad = int(flagged[0])
        i, j = divmod(bad, head.per_asset)
        raise InvalidRequest(
            "prices",
            f"prices[{bad}] = {float(prices[bad])!r} (asset {head.assets[i]!r}, asset_ids[{i}], "
            f"price {j + 1} of {head.per_asset}): prices must be finite and > 0",
        )


def _explain_weights(values: Sequence[float], assets: tuple[str, ...]) -> None:
    if not len(values):
        return
    weights = np.asarray(values, dtype=np.float64)
    flagged = np.flatnonzero(~((weights >= 0.0) & np.isfinite(weights)))
    if flagged.size:
        bad = int(flagged[0])
        slot = CASH_ID if bad == 0 else f"asset {assets[bad - 1]!r}"
        raise InvalidRequest(
            "current_weights",
            f"current_weights[{bad}] = {float(weights[bad])!r} ({slot}): "
            "weights must be finite and >= 0",
        )
    with np.errstate(over="ignore"):
        total = float(_sum(weights))
    if abs(total - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise InvalidRequest(
            "current_weights",
            f"weights sum to {total!r}, not 1 (tolerance {WEIGHT_SUM_TOLERANCE:g}): "
            "send a distribution over CASH and the assets",
        )
