"""Deterministic ids: a rerun of a cycle asks the server and the broker under the same ids."""

from __future__ import annotations

import datetime as dt
import hashlib
import struct
from collections.abc import Mapping


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
        values = closes[asset]
        seq = values if isinstance(values, list | tuple) else [values]
        for value in seq:
            digest.update(struct.pack("<d", float(value)))  # type: ignore[arg-type]
    return digest.hexdigest()
