"""Serving-path backtest: replay a price history decision by decision through the server's code.

Each date is one ``AllocateRequest``, built as a client would, answered by the server's own
``DecisionStep`` for one portfolio in a ``MemoryStateStore``. Holdings are tracked like
``PortfolioEnv``: the "current" weights sent are the holdings drifted by the last price moves,
trading to the smoothed weights costs ``cost_bps`` of the traded value, then prices move.
An asset is requested at date t when its closes t - window .. t + 1 are all finite and positive;
one leaving the request is sold into cash first, a sale counted in the step's turnover and
costs. The reference for the server's parity test and for walk-forward backtests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from allocator.serving.decision import DecisionOutput
from allocator.serving.loader import LoadedModel, load_model
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.state import MemoryStateStore
from allocator.serving.step import DecisionStep
from allocator.serving.validation import ValidRequest

__all__ = ["ReplayResult", "live_assets", "replay"]

Float64Array = NDArray[np.float64]


@dataclass
class ReplayResult:
    """Every request sent, every answer, and the portfolio's path: ``nav`` has ``n + 1`` entries
    for ``n`` decisions (the start value first)."""

    assets: tuple[str, ...]  # every column of the price history, in order
    dates: list[Any]  # n + 1 dates: decision dates, then the last valuation date
    inputs: list[ValidRequest]
    outputs: list[DecisionOutput]
    nav: Float64Array
    turnover: Float64Array
    costs: Float64Array
    settings: dict[str, Any] = field(default_factory=dict)

    def wide(self, what: str) -> Float64Array:
        """``(n, 1 + len(assets))`` of ``raw_weights``, ``smoothed_weights`` or
        ``current_weights``: cash then every asset in column order, 0 where not requested."""
        if what not in {"raw_weights", "smoothed_weights", "current_weights"}:
            raise ValueError(f"unknown weights {what!r}")
        column = {a: j + 1 for j, a in enumerate(self.assets)}
        out = np.zeros((len(self.outputs), 1 + len(self.assets)))
        for k, o in enumerate(self.outputs):
            idx = [0, *(column[a] for a in o.asset_ids[1:])]
            out[k, idx] = getattr(o, what)
        return out


def live_assets(prices: Float64Array, window: int) -> NDArray[np.bool_]:
    """True at row t when closes t - window .. t + 1 are finite and > 0."""
    ok = np.isfinite(prices) & (prices > 0.0)
    bad = np.concatenate([np.zeros((1, ok.shape[1]), np.int64), np.cumsum(~ok, axis=0)])
    live = np.zeros(ok.shape, dtype=bool)
    t = np.arange(window, ok.shape[0] - 1)
    live[t] = (bad[t + 2] - bad[t - window]) == 0  # no bad close in rows t - window .. t + 1
    return live


def _row(value: Any, dates: NDArray[Any] | None, what: str, first: bool) -> int:
    """A row index as is; a date: the first row on/after it (``first``), else the last before."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    if dates is None:
        raise ValueError(f"{what} must be a row index when no dates are given")
    key = np.asarray(value).astype(dates.dtype)
    if first:
        return int(np.searchsorted(dates, key, side="left"))
    return int(np.searchsorted(dates, key, side="right")) - 1


def _price_table(
    prices: Any, assets: Sequence[str] | None, dates: Sequence[Any] | ArrayLike | None
) -> tuple[Float64Array, tuple[str, ...], Any]:
    if hasattr(prices, "columns") and hasattr(prices, "to_numpy"):
        names = tuple(str(c) for c in prices.columns) if assets is None else tuple(assets)
        dates = prices.index if dates is None else dates
        p = prices.to_numpy(dtype=np.float64)
    else:
        p = np.asarray(prices, dtype=np.float64)
        if assets is None:
            raise ValueError("assets are required when prices is an array")
        names = tuple(assets)
    if p.ndim != 2 or p.shape[1] != len(names):
        raise ValueError(f"prices shape {p.shape} does not match {len(names)} assets")
    if len(set(names)) != len(names):
        raise ValueError("asset ids must be unique")
    if dates is not None and np.asarray(dates).shape != (p.shape[0],):
        raise ValueError(f"{np.asarray(dates).shape[0]} dates for {p.shape[0]} price rows")
    return p, names, dates


def _decision_rows(n_dates: int, window: int, dates: Any, start: Any, end: Any) -> tuple[int, int]:
    date_arr = None if dates is None else np.asarray(dates)
    t0 = window if start is None else _row(start, date_arr, "start", first=True)
    t1 = n_dates - 1 if end is None else _row(end, date_arr, "end", first=False)
    if t0 < window:
        raise ValueError(f"start row {t0} needs {window} earlier closes (earliest: {window})")
    if not t0 < t1 <= n_dates - 1:
        raise ValueError(f"no decision between rows {t0} and {t1} of {n_dates}")
    return t0, t1


def _sell_departed(holdings: Float64Array, slots: NDArray[np.intp]) -> float:
    """Sell the holdings outside ``slots`` into cash (in place) before the request; the share
    sold."""
    departed = np.ones(holdings.shape[0], dtype=bool)
    departed[slots] = False
    sold = float(holdings[departed].sum())
    holdings[0] += sold
    holdings[departed] = 0.0
    return sold


def replay(
    model: LoadedModel | str | Path,
    prices: Any,
    *,
    assets: Sequence[str] | None = None,
    dates: Sequence[Any] | ArrayLike | None = None,
    start: Any = None,
    end: Any = None,
    cost_bps: float | None = None,
    initial_value: float = 1.0,
    portfolio_id: str = "replay",
) -> ReplayResult:
    """Replay ``prices`` (dates x assets, NaN where unlisted; a DataFrame, or an array with
    ``assets``) through serving, deciding at rows ``start`` .. ``end - 1`` (row indices or
    dates; default: the first full window to the last row). ``cost_bps`` defaults to the
    manifest's; request ids are ``{portfolio_id}-{k}``.
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model, prefer_cuda=False)
    p, names, row_dates = _price_table(prices, assets, dates)
    window = loaded.prices_per_asset - 1  # daily returns each decision needs per asset
    t0, t1 = _decision_rows(p.shape[0], window, row_dates, start, end)
    rate = (loaded.manifest.cost_bps if cost_bps is None else float(cost_bps)) / 1e4
    step = DecisionStep(MemoryStateStore())

    def resolve(name: str | None, version: str | None) -> LoadedModel:
        return loaded  # the requests name no model: the replayed one answers

    live = live_assets(p, window)
    holdings = np.zeros(1 + len(names))  # drifted weights: cash, then every column
    holdings[0] = 1.0
    value = float(initial_value)
    nav = [value]
    turnover: list[float] = []
    costs: list[float] = []
    inputs: list[ValidRequest] = []
    outputs: list[DecisionOutput] = []
    for k, t in enumerate(range(t0, t1)):
        cols = np.flatnonzero(live[t])
        if cols.size == 0:
            raise ValueError(f"no asset has prices around row {t}: nothing to request")
        slots = np.concatenate([[0], cols + 1])
        sold = _sell_departed(holdings, slots)
        request = pb.AllocateRequest(
            portfolio_id=portfolio_id,
            request_id=f"{portfolio_id}-{k}",
            asset_ids=[names[j] for j in cols],
            prices=np.ascontiguousarray(p[t - window : t + 1, cols].T).ravel().tolist(),
            current_weights=holdings[slots].tolist(),
        )
        answer = step.allocate(request, resolve)
        out = answer.output
        assert out is not None  # no answers cache: every request is decided
        turnover.append(out.turnover + sold)
        costs.append(rate * turnover[-1] * value)
        grown = out.smoothed_weights * np.concatenate([[1.0], p[t + 1, cols] / p[t, cols]])
        gross = float(np.add.reduce(grown))
        value = (value - costs[-1]) * gross
        holdings[:] = 0.0
        holdings[slots] = grown / gross
        nav.append(value)
        inputs.append(answer.request)
        outputs.append(out)
    return ReplayResult(
        assets=names,
        dates=list(range(t0, t1 + 1)) if row_dates is None else list(row_dates[t0 : t1 + 1]),
        inputs=inputs,
        outputs=outputs,
        nav=np.array(nav),
        turnover=np.array(turnover),
        costs=np.array(costs),
        settings={
            "cost_bps": rate * 1e4,
            "beta": loaded.manifest.beta,
            "window": window,
            "initial_value": initial_value,
            "start_row": t0,
            "end_row": t1,
            "portfolio_id": portfolio_id,
        },
    )
