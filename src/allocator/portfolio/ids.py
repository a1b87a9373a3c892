"""Identifiers of the contract: the cash slot's name, and what makes an id storable.

Every weight vector that leaves the policy (a server answer, a recorded decision, a replay)
is labelled asset by asset, cash first under ``CASH_ID``; no risky asset may take that name in
any case (``cash``, ``Cash``), or an answer would hold two cash entries for any reader that
compares ids without case (a spreadsheet, a case-insensitive SQL collation). Ids end up in
``VARCHAR`` columns of the trade database and in Redis keys, so one rule says what an id may be
(non-empty, bounded length, no NUL, which PostgreSQL text refuses) and every layer that accepts
ids applies this rule, naming the field that breaks it.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CASH_ID", "MAX_ID_LENGTH", "MAX_VERSION_LENGTH", "IdError", "check_id", "is_cash_id"]

CASH_ID = "CASH"
"""The id answered and recorded for the cash slot (slot 0); reserved in any case, never a risky
asset (``is_cash_id``)."""
_CASH_FOLDED = CASH_ID.casefold()
MAX_ID_LENGTH = 200
"""Portfolio, request, asset and model-name ids are stored as ``VARCHAR(200)``."""
MAX_VERSION_LENGTH = 100
"""Model versions are stored as ``VARCHAR(100)``."""


class IdError(ValueError):
    """An id that breaks the rule: ``field`` names it, ``problem`` says what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def check_id(
    value: object,
    field: str,
    max_length: int = MAX_ID_LENGTH,
    error: Callable[[str, str], Exception] = IdError,
) -> str:
    """``value`` when it is a storable id, else ``error(field, problem)``.

    ``error`` lets each layer refuse in its own terms (the server's ``InvalidRequest``, the
    recorder's ``RecordError``) while the rule itself stays here, once.
    """
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
    """Whether ``value`` names the cash slot: ``CASH`` in any case (``cash``, ``Cash``), compared
    by Unicode case folding, so no risky asset can pass for cash wherever ids meet without case.
    Folding never shortens a string, so a longer value is not folded at all."""
    return len(value) <= len(_CASH_FOLDED) and value.casefold() == _CASH_FOLDED
