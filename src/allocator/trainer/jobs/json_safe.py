"""JSON-safe copies of job figures for the database's JSON columns: Postgres refuses NaN and
infinities, and no JSON column knows numpy scalars, dates or paths."""

from __future__ import annotations

import datetime as dt
from math import isfinite
from pathlib import Path
from typing import Any


def finite(value: Any) -> float | None:
    """A float for a JSON figure, or None (strict JSON has no NaN)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if isfinite(x) else None


def json_safe(obj: Any) -> Any:
    """A copy of ``obj`` that any JSON column accepts (keys as text, NaN/inf as None)."""
    if isinstance(obj, float):
        return obj if isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, dt.date | Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return json_safe(obj.item())
    return obj
