"""Old module paths that SB3 pickled into existing ``model.zip`` files, mapped to today's.

SB3 stores some constructor arguments of an algorithm (the smoothness settings and lambda, the
ICM settings, the curiosity replay buffer class) by cloudpickle, which records each object's
class by its import path. Run directories written before the trainer was split into
sub-packages name paths such as ``allocator.trainer.icm``; without this map they could no longer
be loaded, exported or upgraded. The aliases are registered only right before an SB3 load.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

#: module path written into older ``model.zip`` files -> the module that holds those classes now
LEGACY_MODULES: dict[str, str] = {
    "allocator.trainer.icm": "allocator.trainer.agents.icm",
    "allocator.trainer.regularizer": "allocator.trainer.agents.regularizer",
    "allocator.trainer.curiosity": "allocator.trainer.agents.curiosity",
    "allocator.trainer.noise": "allocator.trainer.agents.noise",
    "allocator.trainer.td3": "allocator.trainer.agents.td3",
    "allocator.trainer.sac": "allocator.trainer.agents.sac",
    "allocator.trainer.env": "allocator.trainer.sim.env",
    "allocator.trainer.rewards": "allocator.trainer.sim.rewards",
}


def register_legacy_paths() -> None:
    """Make every old path importable as the module that replaced it (idempotent)."""
    for old, new in LEGACY_MODULES.items():
        if old not in sys.modules:
            sys.modules[old] = importlib.import_module(new)


class LegacyPathsLoad:
    """Mixin for SB3 algorithms: ``load`` registers the old paths before unpickling."""

    @classmethod
    def load(cls, *args: Any, **kwargs: Any) -> Any:
        register_legacy_paths()
        return super().load(*args, **kwargs)  # type: ignore[misc]
