"""Run directories written before the trainer's sub-packages existed keep loading.

Their ``model.zip`` pickles name ``allocator.trainer.icm``, ``allocator.trainer.regularizer``
and ``allocator.trainer.curiosity``; the frozen version-1 fixtures are such files.
"""

from __future__ import annotations

import base64
import importlib
import json
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from stable_baselines3.common.save_util import load_from_zip_file

from allocator.trainer.agents.algorithms import ALGORITHMS
from allocator.trainer.agents.curiosity import CuriosityReplayBuffer
from allocator.trainer.agents.icm import ICMSettings
from allocator.trainer.agents.legacy_paths import LEGACY_MODULES, legacy_module_paths
from allocator.trainer.agents.regularizer import SmoothnessLambda, SmoothnessSettings
from tests.trainer.agents.tiny import make_icm
from tests.trainer.checkpoints.runs import ALGO, FIXTURES, SAC, TD3


def pickled_modules(model_zip: Path) -> set[str]:
    """Every ``allocator...`` module path named inside the pickled values of SB3's ``data``."""
    with zipfile.ZipFile(model_zip) as archive:
        data = json.loads(archive.read("data"))
    found: set[str] = set()
    for value in data.values():
        if isinstance(value, dict) and ":serialized:" in value:
            raw = base64.b64decode(value[":serialized:"])
            for word in raw.replace(b"\x00", b" ").split():
                text = "".join(chr(c) if 32 < c < 127 else " " for c in word)
                found.update(t for t in text.split() if t.startswith("allocator."))
    return found


def test_the_fixtures_name_the_old_module_paths() -> None:
    """The point of the fixtures here: they were written by the old layout."""
    assert set(LEGACY_MODULES) <= pickled_modules(FIXTURES / TD3 / "model.zip") | pickled_modules(
        FIXTURES / SAC / "model.zip"
    )


def test_old_module_paths_load_with_their_settings() -> None:
    td3 = ALGORITHMS[ALGO[TD3]].load(FIXTURES / TD3 / "model.zip", device="cpu")
    assert isinstance(td3.smoothness, SmoothnessSettings)
    assert isinstance(td3.lam, SmoothnessLambda)
    assert isinstance(td3.icm_settings, ICMSettings)
    sac = ALGORITHMS[ALGO[SAC]].load(FIXTURES / SAC / "model.zip", device="cpu")
    assert sac.icm_settings.enabled  # not the default: the pickled settings were read
    assert sac.replay_buffer_class is CuriosityReplayBuffer


def test_without_the_aliases_an_old_model_does_not_load() -> None:
    """What the aliases prevent: SB3's own reader fails on the first old path."""
    with pytest.raises(
        ModuleNotFoundError, match=r"allocator\.trainer\.(icm|regularizer|curiosity)"
    ):
        load_from_zip_file(FIXTURES / SAC / "model.zip", device="cpu")


def test_aliases_exist_only_during_a_load_and_nest() -> None:
    assert not set(LEGACY_MODULES) & set(sys.modules)
    with legacy_module_paths():
        with legacy_module_paths():
            pass
        for old, new in LEGACY_MODULES.items():
            assert sys.modules[old] is importlib.import_module(new)
    assert not set(LEGACY_MODULES) & set(sys.modules)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("allocator.trainer.icm")


def test_concurrent_loads_keep_the_aliases_until_the_last_one_leaves() -> None:
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with legacy_module_paths():
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=hold)
    thread.start()
    inside.wait(5)
    with legacy_module_paths():
        pass  # leaving here must not remove the aliases the other load still uses
    assert set(LEGACY_MODULES) <= set(sys.modules)
    release.set()
    thread.join()
    assert not set(LEGACY_MODULES) & set(sys.modules)


@pytest.mark.parametrize("algorithm", ["td3", "sac"])
def test_a_newly_saved_model_names_only_the_new_paths(tmp_path: Path, algorithm: str) -> None:
    model = make_icm(algorithm, warmup_steps=0)
    model.learn(60)
    model.save(tmp_path / "model.zip")
    named = pickled_modules(tmp_path / "model.zip")
    assert "allocator.trainer.agents.icm" in named
    assert not named & set(LEGACY_MODULES)
    # ...also after an old model was loaded in the same process.
    ALGORITHMS[ALGO[SAC]].load(FIXTURES / SAC / "model.zip", device="cpu")
    model.save(tmp_path / "again.zip")
    assert not pickled_modules(tmp_path / "again.zip") & set(LEGACY_MODULES)
