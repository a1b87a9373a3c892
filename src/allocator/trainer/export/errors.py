"""The one error of the export package: what went wrong, with nothing written to the registry."""

from __future__ import annotations


class ExportError(ValueError):
    """An export that cannot be made or failed its checks; nothing was written to the registry."""
