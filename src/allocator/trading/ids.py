"""Deterministic ids: a rerun of a cycle asks the server and the broker under the same ids."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping

import numpy as np


def request_id(account: str, bar_date: dt.date) -> str:
    """The allocation request id of ``account``'s cycle for ``bar_date``."""
    return f"trade:{account}:{bar_date.isoformat()}"


def client_order_id(account: str, bar_date: dt.date, asset: str, side: str) -> str:
    """A broker-safe id (32 hex characters) for the cycle's one order per asset and side."""
    key = "\x1f".join((account, bar_date.isoformat(), asset, side))
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def prices_digest(bar_date: dt.date, closes: Mapping[str, object]) -> str:
    """SHA-256 over the bar date and every asset's closes (sorted by asset, float64 bytes)."""
    digest = hashlib.sha256(bar_date.isoformat().encode())
    for asset in sorted(closes):
        digest.update(b"\x00" + asset.encode() + b"\x00")
        digest.update(np.asarray(closes[asset], dtype="<f8").tobytes())  # a list or one close
    return digest.hexdigest()
