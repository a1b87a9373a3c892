"""Writing JSON artifacts that strict readers (browsers, Grafana, jq) accept."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(obj: Any) -> Any:
    """NaN and infinities are not JSON: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _clean(obj.item())
    return obj


def write_json(path: str | Path, payload: Any) -> Path:
    """Write ``payload`` as indented JSON, creating parent folders."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_clean(payload), indent=2, default=str) + "\n")
    return out
