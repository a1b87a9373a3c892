"""Old module paths that SB3 pickled into existing ``model.zip`` files, mapped to today's.

SB3 stores some constructor arguments of an algorithm by cloudpickle (the smoothness settings
and lambda, the ICM settings, the curiosity replay buffer class), and pickle records each
object's class by its import path. Run directories written before the trainer was split into
sub-packages name paths such as ``allocator.trainer.icm.ICMSettings``: without this map their
``model.zip`` fails to load (``ModuleNotFoundError``), so they could no longer be exported,
upgraded or trained further.

The aliases exist only while an SB3 load unpickles (``legacy_module_paths``): afterwards an
old path is not importable again, and objects saved from then on name the new modules.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

LEGACY_MODULES: dict[str, str] = {
    "allocator.trainer.icm": "allocator.trainer.agents.icm",
    "allocator.trainer.regularizer": "allocator.trainer.agents.regularizer",
    "allocator.trainer.curiosity": "allocator.trainer.agents.curiosity",
}
"""Old module path -> the module holding its classes now, for every module whose objects SB3
saves: ``ICMSettings`` (icm), ``SmoothnessSettings``, ``SmoothMode`` and ``SmoothnessLambda``
(regularizer), ``CuriosityReplayBuffer`` (curiosity). Everything else in ``model.zip`` is SB3's
own, and the environment and training config are never pickled."""

_lock = threading.Lock()
_depth = 0  # loads in progress (nested or concurrent); the last one out removes the aliases
_added: list[str] = []


@contextmanager
def legacy_module_paths() -> Iterator[None]:
    """While inside, each old path of ``LEGACY_MODULES`` imports as the module replacing it.

    Safe to nest and to use from several threads at once: the aliases stay until the last
    user leaves, and a module really importable under an old name is never replaced.
    """
    global _depth
    with _lock:
        if _depth == 0:
            for old, new in LEGACY_MODULES.items():
                if old not in sys.modules:
                    sys.modules[old] = importlib.import_module(new)
                    _added.append(old)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for old in _added:
                    sys.modules.pop(old, None)
                _added.clear()


class LegacyPathsLoad:
    """Mixin for SB3 algorithms: every unpickling entry point sees the old module paths."""

    @classmethod
    def load(cls, *args: Any, **kwargs: Any) -> Any:
        """SB3's ``load`` (model.zip), with the old module paths resolvable while it unpickles."""
        with legacy_module_paths():
            return super().load(*args, **kwargs)  # type: ignore[misc]

    def load_replay_buffer(
        self, path: str | Path | IO[bytes], truncate_last_traj: bool = True
    ) -> None:
        """SB3's replay-buffer load: the pickled buffer names its class (the curiosity buffer)."""
        with legacy_module_paths():
            super().load_replay_buffer(path, truncate_last_traj)  # type: ignore[misc]
