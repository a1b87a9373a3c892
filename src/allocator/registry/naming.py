"""How registry names and versions are spelled and ordered; stdlib only, so the gRPC client
picks the newest listed version by the server's rule."""

from __future__ import annotations

import re

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
"""A model name or version: one plain path component (never ``..``, never a separator), not
starting with ``.`` (hidden: staging and candidates) or ``-`` (read as an option by tools)."""

STAGING_PREFIX = ".tmp-"
"""Prefix of a version being written (``NAME/.tmp-<uuid>``): renamed into place when whole."""

_NAME_RE = re.compile(NAME_PATTERN)
_NUMERIC_RE = re.compile(r"^\d+(\.\d+)*$")


def is_valid_name(value: str) -> bool:
    """Whether ``value`` may be a model name or version (``NAME_PATTERN``)."""
    return bool(_NAME_RE.match(value)) and value not in {".", ".."}


def is_hidden(entry: str) -> bool:
    """Dot-names (staging, candidates, temp files) are never versions."""
    return entry.startswith(".")


def version_key(version: str) -> tuple[int, tuple[int, ...], str]:
    """Numeric versions (``3``, ``20221228.1``) compare as numbers (10 after 9, dated ones after
    ``allocator export``'s small integers), all after non-numeric ones."""
    if _NUMERIC_RE.match(version):
        return (1, tuple(int(p) for p in version.split(".")), version)
    return (0, (), version)
