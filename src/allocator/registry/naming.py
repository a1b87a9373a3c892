"""How registry names and versions are spelled, and how versions are ordered.

Standard library only: the gRPC client (grpcio + numpy, no pydantic) imports this module to
pick the newest version the server lists, by the same rule the server uses.
"""

from __future__ import annotations

import re

__all__ = [
    "NAME_PATTERN",
    "STAGING_PREFIX",
    "is_hidden",
    "is_valid_name",
    "version_key",
]

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
"""A model name or version: one plain path component (never ``..``, never a separator), not
starting with ``.`` (hidden: staging and candidates) or ``-`` (read as an option by tools)."""

STAGING_PREFIX = ".tmp-"
"""Prefix of a version being written (``NAME/.tmp-<uuid>``): renamed into place when whole."""

_NAME_RE = re.compile(NAME_PATTERN)
_NUMERIC_RE = re.compile(r"^\d+(\.\d+)*$")


def is_valid_name(value: str) -> bool:
    """Whether ``value`` may be a registry model name or version (``NAME_PATTERN``)."""
    return bool(_NAME_RE.match(value)) and value not in {".", ".."}


def is_hidden(entry: str) -> bool:
    """Dot-names (staging directories, the candidates area, temp files) are never versions."""
    return entry.startswith(".")


def version_key(version: str) -> tuple[int, tuple[int, ...], str]:
    """Sort key: numeric versions (``3``, ``20221228.1``) numerically, so 10 comes after 9 and
    a dated version after the small integers ``allocator export`` gives, all after any
    non-numeric ones."""
    if _NUMERIC_RE.match(version):
        return (1, tuple(int(p) for p in version.split(".")), version)
    return (0, (), version)
