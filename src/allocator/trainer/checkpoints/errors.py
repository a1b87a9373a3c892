"""The one error of checkpoint upgrades: refused requests and failed identity checks alike."""

from __future__ import annotations


class CheckpointUpgradeError(ValueError):
    """A run directory that cannot be upgraded or widened, or an upgrade that failed its check.

    The message names the directory and, after a failure, the backup it was restored from.
    """
