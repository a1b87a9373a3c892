"""JSON-safe copies of job figures for the database's JSON columns.

Postgres ``JSON``/``JSONB`` refuses ``NaN`` and infinities, and neither it nor SQLite's JSON
knows numpy scalars, dates or paths. A job's metrics routinely hold all of these (a Sharpe of
a flat line divides 0 by 0), so every JSON value a job records goes through ``json_safe``:
non-finite floats become ``null``, numpy scalars their Python value, dates and paths their text.
"""

from __future__ import annotations

import datetime as dt
from math import isfinite
from pathlib import Path
from typing import Any


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
