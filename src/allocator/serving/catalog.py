"""The server's catalog: every verified version in the registry loaded, swapped atomically.

How it rescans, swaps, heals a refused version and picks the default is step 2 of
docs/architecture.md's request path and its "Registry and loader" note.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from allocator.metrics.serving import ServingMetrics
from allocator.registry.errors import (
    BAD_MANIFEST,
    MISSING_FILE,
    UNREADABLE,
    ModelLoadError,
    ModelNotFoundError,
)
from allocator.registry.naming import version_key
from allocator.registry.pointer import choose_production, read_production_pointer
from allocator.registry.versions import list_models
from allocator.serving.loader import LoadedModel, load_model

__all__ = ["CatalogSnapshot", "ModelCatalog", "Refusal"]

log = logging.getLogger("allocator.serving")

Key = tuple[str, str]
Fingerprint = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class Refusal:
    """Why a version's current files are not served (``registry.errors.REFUSAL_REASONS``)."""

    reason: str
    message: str


@dataclass(frozen=True)
class CatalogSnapshot:
    """Loaded versions, the default of each name, and the refusals (a version can be both
    loaded and refused: it serves what it loaded; its newer files were refused)."""

    models: Mapping[Key, LoadedModel] = field(default_factory=dict)
    defaults: Mapping[str, str] = field(default_factory=dict)
    default_name: str | None = None
    refused: Mapping[Key, Refusal] = field(default_factory=dict)

    def resolve(self, name: str | None = None, version: str | None = None) -> LoadedModel:
        if name is None:
            if self.default_name is None:
                raise ModelNotFoundError("no model is loaded")
            name = self.default_name
        chosen = self.defaults.get(name, "") if version is None else version
        model = self.models.get((name, chosen))
        if model is not None:
            return model
        versions = sorted((v for n, v in self.models if n == name), key=version_key)
        if not versions:
            names = ", ".join(sorted(self.defaults)) or "none"
            raise ModelNotFoundError(f"model {name!r} is not loaded (loaded: {names})")
        raise ModelNotFoundError(
            f"model {name!r} has no loaded version {version!r} (loaded: {', '.join(versions)})"
        )

    @property
    def default(self) -> LoadedModel:
        return self.resolve()


def _fingerprint(directory: Path) -> Fingerprint:
    """Name, size and mtime of every entry; OSError when one vanishes mid-scan."""
    with os.scandir(directory) as it:
        stats = [(e.name, e.stat()) for e in it]
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats))


def _reason(exc: Exception) -> str:
    if isinstance(exc, ModelLoadError):
        return exc.reason
    if isinstance(exc, FileNotFoundError):
        return MISSING_FILE
    if isinstance(exc, OSError):
        return UNREADABLE
    return BAD_MANIFEST  # a ValueError from a manifest value the schema let through


class ModelCatalog:
    """Loads every version under ``root`` and keeps the snapshot current; unpinned requests go
    to ``default_model``, else the first name in sorted order. ``on_change`` gets each new
    snapshot."""

    def __init__(
        self,
        root: str | Path,
        *,
        default_model: str | None = None,
        prefer_cuda: bool = True,
        metrics: ServingMetrics | None = None,
        on_change: Callable[[CatalogSnapshot], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.default_model = default_model
        self.prefer_cuda = prefer_cuda
        self._metrics = metrics
        self._snapshot = CatalogSnapshot()
        self._refused: dict[Key, tuple[Fingerprint, Refusal]] = {}
        self._fingerprints: dict[Key, Fingerprint] = {}
        self._on_change = on_change
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def snapshot(self) -> CatalogSnapshot:
        return self._snapshot

    def refresh(self) -> bool:
        """Scan once; whether the loaded set or the defaults changed."""
        with self._refresh_lock:
            old = self._snapshot
            try:
                on_disk = list_models(self.root)
            except ModelNotFoundError as exc:
                log.error("model registry: %s; keeping the loaded models", exc)
                return False
            models = dict(old.models)
            changed = False
            for key in on_disk:
                loaded = self._scan_version(key)
                if loaded is not None:
                    models[key] = loaded
                    changed = True
            for key in set(models) - set(on_disk):
                log.info("model registry: %s/%s left the registry; unloaded", *key)
                del models[key]
                self._fingerprints.pop(key, None)
                changed = True
            for key in set(self._refused) - set(on_disk):
                log.info("model registry: refused %s/%s left the registry", *key)
                del self._refused[key]
            refused = {key: refusal for key, (_, refusal) in sorted(self._refused.items())}
            if self._metrics is not None:
                self._metrics.set_refused_versions(r.reason for r in refused.values())
            defaults = self._defaults(models)
            default_name = self._default_name(defaults)
            snapshot = CatalogSnapshot(models, defaults, default_name, refused)
            self._snapshot = snapshot  # the atomic swap (unchanged models: new refusals at most)
            if not changed and defaults == dict(old.defaults) and default_name == old.default_name:
                return False
            for name, version in defaults.items():
                if old.defaults.get(name) != version:
                    log.info("model registry: %s now answers with version %s", name, version)
            if self._on_change is not None:
                try:
                    self._on_change(snapshot)
                except Exception:
                    log.exception("model registry: a change listener failed")
            return True

    def _scan_version(self, key: Key) -> LoadedModel | None:
        """The version newly loaded when its files changed, else None (a refusal is remembered
        with its fingerprint, and logged and counted only when new)."""
        name, version = key
        directory = self.root / name / version
        try:
            fingerprint = _fingerprint(directory)
        except OSError:
            return None  # moving under our feet: the next scan sees where it landed
        if self._fingerprints.get(key) == fingerprint:
            if self._refused.pop(key, None) is not None:
                log.info("model registry: %s/%s has the files it loaded again", *key)
            return None
        previous = self._refused.get(key)
        if previous is not None and previous[0] == fingerprint:
            return None
        try:
            model = load_model(directory, prefer_cuda=self.prefer_cuda, name=name, version=version)
        except (ModelLoadError, OSError, ValueError) as exc:
            refusal = Refusal(_reason(exc), str(exc))
            self._refused[key] = (fingerprint, refusal)
            serving = " (it keeps serving its earlier files)" if key in self._fingerprints else ""
            if previous is None or previous[1] != refusal:
                log.error(
                    "model registry: refused %s/%s [%s]%s: %s",
                    name,
                    version,
                    refusal.reason,
                    serving,
                    refusal.message,
                )
                if self._metrics is not None:
                    self._metrics.observe_refusal(refusal.reason)
            else:
                log.info("model registry: %s/%s changed, still refused the same way", *key)
            return None
        if previous is not None:
            log.info("model registry: %s/%s loaded after its files changed (healed)", *key)
        self._refused.pop(key, None)
        self._fingerprints[key] = fingerprint
        return model

    def _defaults(self, models: Mapping[Key, LoadedModel]) -> dict[str, str]:
        defaults: dict[str, str] = {}
        for name in dict.fromkeys(n for n, _ in models):
            versions = [v for n, v in models if n == name]
            pointer = read_production_pointer(self.root, name)
            pointed = pointer["version"] if pointer is not None else None
            chosen, _ = choose_production(pointed, versions)
            assert chosen is not None  # every name here has a loaded version
            if pointed is not None and chosen != pointed:
                log.warning(
                    "model registry: %s's production pointer names version %s, which is "
                    "not loaded; answering with the newest loaded version",
                    name,
                    pointed,
                )
            defaults[name] = chosen
        return defaults

    def _default_name(self, defaults: Mapping[str, str]) -> str | None:
        if self.default_model is not None:
            if self.default_model not in defaults:
                log.error(
                    "model registry: default model %r is not loaded (loaded: %s)",
                    self.default_model,
                    ", ".join(sorted(defaults)) or "none",
                )
                return None
            return self.default_model
        if not defaults:
            return None
        names = sorted(defaults)
        if len(names) > 1:
            log.warning(
                "model registry holds %s; unpinned requests go to %r (set a default model)",
                ", ".join(names),
                names[0],
            )
        return names[0]

    def watch(self, interval: float) -> None:
        if self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.refresh()
                except Exception:
                    log.exception("model registry: refresh failed; keeping the loaded models")

        self._thread = threading.Thread(target=loop, name="allocator-registry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
