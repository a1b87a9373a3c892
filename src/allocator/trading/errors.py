"""What can stop a trading cycle: raised before anything of the cycle is recorded or after its
record is complete, so a rerun neither repeats nor loses work."""

from __future__ import annotations


class TradingError(RuntimeError):
    """A cycle could not run; the message says why and what to do."""


class UnknownAccountError(TradingError):
    """No account of that name in the trade database."""


class AccountHaltedError(TradingError):
    """The account was halted (a failed reconciliation) and must be cleared by an operator."""


class StaleBarError(TradingError):
    """The prices table has no closes for the cycle's date."""


class MissingPriceError(TradingError):
    """An asset the account holds or trades has no close (or too short a history) for the bar."""


class ReconciliationError(TradingError):
    """The broker's positions differ from the recorded ones; the account is now halted."""


class ServerUnavailableError(TradingError):
    """The allocation server did not answer after the retries; nothing was recorded."""


class BrokerRejectedError(TradingError):
    """The broker refused one or more orders of a cycle (recorded as rejected, once)."""
