"""Allocator: reinforcement-learning portfolio allocation, trained honestly and served fast."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("allocator")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = ["__version__"]
