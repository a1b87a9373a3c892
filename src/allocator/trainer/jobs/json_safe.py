"""JSON-safe copies of job figures for the database's JSON columns: Postgres refuses NaN and
infinities, and no JSON column knows numpy scalars, dates or paths."""

from __future__ import annotations

import json
from math import isfinite
from pathlib import Path
from typing import Any

from allocator.artifacts.files import json_text


def finite(value: Any) -> float | None:
    """A float for a JSON figure, or None (strict JSON has no NaN)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if isfinite(x) else None


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file's contents; None when it is missing, unreadable or not an object
    (a file cut short by a kill reads as absent)."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def json_safe(obj: Any) -> Any:
    """``obj`` as the JSON files hold it (keys as text, NaN/inf as None, dates as text)."""
    return json.loads(json_text(obj))
