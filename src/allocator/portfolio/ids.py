"""The cash slot's id, reserved in any case (a case-insensitive reader would see two cash
entries), and what makes an id storable in ``VARCHAR`` columns and Redis keys."""

from __future__ import annotations

from collections.abc import Callable

CASH_ID = "CASH"
_CASH_FOLDED = CASH_ID.casefold()
MAX_ID_LENGTH = 200
"""Portfolio, request, asset and model-name ids are stored as ``VARCHAR(200)``."""
MAX_VERSION_LENGTH = 100
"""Model versions are stored as ``VARCHAR(100)``."""


def check_id(
    value: object,
    field: str,
    max_length: int = MAX_ID_LENGTH,
    error: Callable[[str, str], Exception] = lambda f, p: ValueError(f"{f}: {p}"),
) -> str:
    """``value`` when it is a storable id (no NUL: PostgreSQL refuses it), else
    ``error(field, problem)``: each layer refuses in its own terms, the rule stays here."""
    if not isinstance(value, str):
        raise error(field, f"must be a non-empty string, got {value!r}")
    if not value:
        raise error(field, "is required (a non-empty string)")
    if len(value) > max_length:
        raise error(field, f"is {len(value)} characters long, at most {max_length}")
    if "\x00" in value:
        raise error(field, "must not contain NUL characters")
    return value


def is_cash_id(value: str) -> bool:
    """Whether ``value`` is ``CASH`` under case folding (which never shortens a string)."""
    return len(value) <= len(_CASH_FOLDED) and value.casefold() == _CASH_FOLDED
