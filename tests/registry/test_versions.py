"""Which directories are versions, in which order, and how a name and version resolve."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from allocator.registry.errors import ModelLoadError, ModelNotFoundError
from allocator.registry.naming import is_valid_name, version_key
from allocator.registry.versions import (
    CANDIDATES_DIR,
    dated_version,
    latest_version,
    list_models,
    next_version,
    resolve,
    versions,
)
from tests.registry import SPEC
from tests.serving import write_exported_model


def test_list_models_in_numeric_order(registry: Path) -> None:
    assert list_models(registry) == [
        ("alpha", "1"),
        ("alpha", "2"),
        ("alpha", "9"),
        ("alpha", "10"),
        ("beta", "3"),
    ]


def test_latest_version_is_numeric(registry: Path) -> None:
    assert latest_version(registry, "alpha") == "10"
    assert latest_version(registry, "beta") == "3"


def test_resolve(registry: Path) -> None:
    assert resolve(registry, "alpha") == registry / "alpha" / "10"
    assert resolve(registry, "alpha", "9") == registry / "alpha" / "9"


def test_not_found_errors_name_what_was_asked(registry: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no model named 'gamma'") as info:
        resolve(registry, "gamma")
    assert "alpha, beta" in str(info.value)
    with pytest.raises(ModelNotFoundError, match="'gamma'"):
        resolve(registry, "gamma", "1")
    with pytest.raises(ModelNotFoundError, match=r"'alpha' has no version '11'") as info:
        resolve(registry, "alpha", "11")
    assert "1, 2, 9, 10" in str(info.value)
    with pytest.raises(ModelNotFoundError, match="'4'"):
        resolve(registry, "beta", "4")
    with pytest.raises(ModelNotFoundError, match="'gamma'"):
        latest_version(registry, "gamma")
    with pytest.raises(ModelNotFoundError, match="no such registry"):
        list_models(registry / "absent")
    assert issubclass(ModelNotFoundError, ModelLoadError)
    assert issubclass(ModelLoadError, ValueError)


@pytest.mark.parametrize("name", ["..", "../registry", "alpha/10", "/etc", ""])
def test_path_like_names_refused(registry: Path, name: str) -> None:
    with pytest.raises(ModelNotFoundError, match="invalid"):
        resolve(registry, name)
    with pytest.raises(ModelNotFoundError, match="invalid"):
        resolve(registry, "alpha", name or ".")


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("alpha", True),
        ("tiny-td3", True),
        ("_private", True),
        ("20221228.1", True),
        (".tmp-abc", False),
        ("-rf", False),
        ("a/b", False),
        ("..", False),
        ("", False),
    ],
)
def test_one_name_rule(value: str, valid: bool) -> None:
    assert is_valid_name(value) is valid


def test_hidden_directories_are_never_versions(registry: Path) -> None:
    """A complete staging directory (manifest included, just before its rename) and the
    candidates area look like versions but are not."""
    write_exported_model(registry / "alpha" / ".tmp-0123abcd", SPEC)
    write_exported_model(registry / CANDIDATES_DIR / "alpha" / "20221228", SPEC)
    write_exported_model(registry / ".hidden" / "1", SPEC)
    assert versions(registry / "alpha") == ["1", "2", "9", "10"]
    assert {name for name, _ in list_models(registry)} == {"alpha", "beta"}
    assert latest_version(registry, "alpha") == "10"
    with pytest.raises(ModelNotFoundError, match="invalid"):
        resolve(registry, "alpha", ".tmp-0123abcd")


def test_versions_sort_numerically_dates_after_integers() -> None:
    ordered = sorted(
        ["20221229", "20221228.2", "3", "latest", "20221228", "20221228.10"], key=version_key
    )
    assert ordered == ["latest", "3", "20221228", "20221228.2", "20221228.10", "20221229"]


def test_next_version_counts_every_integer_directory(registry: Path, tmp_path: Path) -> None:
    assert next_version(registry / "alpha") == "11"
    assert next_version(registry / "beta") == "5"  # 4 is an export in progress: taken
    assert next_version(tmp_path / "nothing") == "1"


def test_dated_version_skips_served_candidate_and_partial_names(tmp_path: Path) -> None:
    day = dt.date(2022, 12, 28)
    assert dated_version(tmp_path, "m", day) == "20221228"
    write_exported_model(tmp_path / CANDIDATES_DIR / "m" / "20221228", SPEC)
    assert dated_version(tmp_path, "m", day) == "20221228.1"
    (tmp_path / "m" / "20221228.1").mkdir(parents=True)  # no manifest yet, but taken
    assert dated_version(tmp_path, "m", day) == "20221228.2"


def test_a_registry_in_the_existing_layout_lists_the_same_versions(tmp_path: Path) -> None:
    """What the exporter and the retraining job have written so far: integer versions, dated
    versions, a production pointer, an interrupted export, staging and candidates."""
    r = tmp_path / "registry"
    for version in ["1", "2", "20221228", "20221228.1"]:
        write_exported_model(r / "tiny" / version, SPEC)
    (r / "tiny" / "production.json").write_text('{"version": "2"}')
    (r / "tiny" / "3").mkdir()
    (r / "tiny" / ".tmp-5f1c").mkdir()
    (r / "tiny" / ".production-x1y2.json").write_text("{")
    write_exported_model(r / CANDIDATES_DIR / "tiny" / "20230105", SPEC)
    assert list_models(r) == [
        ("tiny", "1"),
        ("tiny", "2"),
        ("tiny", "20221228"),
        ("tiny", "20221228.1"),
    ]
    assert next_version(r / "tiny") == "20221229"
    assert dated_version(r, "tiny", dt.date(2023, 1, 5)) == "20230105.1"
