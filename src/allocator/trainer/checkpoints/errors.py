"""The one error of checkpoint upgrades: refused requests and failed identity checks alike."""

from __future__ import annotations


class CheckpointUpgradeError(ValueError):
    """A run directory that cannot be upgraded or widened, or an upgrade that failed its check;
    after a failure the message names the backup it was restored from."""
