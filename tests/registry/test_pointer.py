"""The production pointer: round trip, atomic replacement, and the rule when it is unusable."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from allocator.registry.errors import ModelNotFoundError
from allocator.registry.pointer import (
    PRODUCTION_FILE,
    choose_production,
    production_version,
    read_production_pointer,
    write_production_pointer,
)


def test_round_trip(registry: Path) -> None:
    assert read_production_pointer(registry, "alpha") is None
    written = write_production_pointer(registry, "alpha", "9", previous=None, reasons=["ok"])
    assert written["version"] == "9"
    assert written["reasons"] == ["ok"]
    assert read_production_pointer(registry, "alpha") == written
    path = registry / "alpha" / PRODUCTION_FILE
    assert json.loads(path.read_text()) == written
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # servers may run as another user
    assert sorted(p.name for p in (registry / "alpha").iterdir() if p.is_file()) == [
        PRODUCTION_FILE
    ]  # no temporary file left


def test_a_pointer_to_no_version_is_refused(registry: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no exported version to promote"):
        write_production_pointer(registry, "alpha", "11")
    with pytest.raises(ModelNotFoundError, match="no exported version"):
        write_production_pointer(registry, "beta", "4")  # no manifest: not a version
    assert not (registry / "alpha" / PRODUCTION_FILE).exists()


def test_a_failed_write_leaves_the_old_pointer(
    registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_production_pointer(registry, "alpha", "2")
    before = (registry / "alpha" / PRODUCTION_FILE).read_bytes()

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        write_production_pointer(registry, "alpha", "9")
    assert (registry / "alpha" / PRODUCTION_FILE).read_bytes() == before
    assert [p.name for p in (registry / "alpha").iterdir() if p.is_file()] == [PRODUCTION_FILE]


@pytest.mark.parametrize("content", ["{", "[]", '{"version": 3}'])
def test_an_unreadable_pointer_counts_as_unset(
    registry: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    (registry / "alpha" / PRODUCTION_FILE).write_text(content)
    with caplog.at_level(logging.ERROR, logger="allocator.registry"):
        assert read_production_pointer(registry, "alpha") is None
    assert PRODUCTION_FILE in caplog.text
    assert production_version(registry, "alpha") == (
        "10",
        "newest version (no production pointer)",
    )


def test_which_version_is_production(registry: Path) -> None:
    assert production_version(registry, "alpha") == (
        "10",
        "newest version (no production pointer)",
    )
    write_production_pointer(registry, "alpha", "2")
    assert production_version(registry, "alpha") == ("2", "production pointer")
    assert production_version(registry, "gamma") == (None, "no version in the registry")
    assert choose_production("7", ["1", "10", "9"]) == (
        "10",
        "newest version (the pointer names 7, not exported)",
    )
