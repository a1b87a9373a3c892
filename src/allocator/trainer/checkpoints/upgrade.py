"""``allocator checkpoint migrate``: upgrade run directories to the current schema, and widen them.

Versions of a run directory:

* 1: the layout written before manifests existed (``model.zip``, ``config.yaml``,
  ``normalization.json``, optional ``icm.pt``, ``run.json``, ``validation.json``), no manifest;
* 2: the same plus ``manifest.json`` (``allocator.artifacts.manifest``, schema version 2).

``migrate`` upgrades one step at a time through ``STEPS`` (a future v3 adds ``{2: v2_to_v3}``),
after copying the directory to a sibling ``<dir>.bak-v<from>-<timestamp>``. Any failure restores
the directory from that copy. Every migration is then checked on a fixed, seeded probe set: the
migrated model must act exactly as the backed-up one.

Widening (``max_assets=M``) pads the SB3 networks so that a policy trained on ``m`` slots runs
in an ``M``-slot observation layout, new slots masked: zero input columns for the new slots'
features, weights and mask (and, in the critics, actions), and new actor output rows with zero
weights and zero bias. Zero bias puts the new slots' pre-tanh output at 0, the unsaturated middle
of tanh: the action is 0 (preference 0.5) and fine-tuning gets a gradient there, where a large
negative bias (action -1, "never hold") would start the new slots dead. The new slots are masked
until an asset fills them, so their action does not change any allocation until then. SAC's
log-std rows get zero bias too (std 1, a fresh policy's exploration). Adam moments are padded
with zeros the same way, so training can resume.

Identity after widening is checked twice. In float64 with every dot product summed in a
canonical order (``canonical_forward``: summation order and the inserted zero terms cannot
matter) the old slots' actions, the critics' Q values, the target networks and the ICM must agree
bit for bit on every mask over the old slots. The float32 models as deployed (``model.predict``)
are compared too and the difference reported: BLAS may group a longer row's terms differently,
which moves float32 results by an ulp or two (see ``FLOAT32_ATOL``).
"""

from __future__ import annotations

import copy
import datetime as dt
import io
import itertools
import json
import math
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from numpy.typing import NDArray
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.save_util import data_to_json, json_to_data
from stable_baselines3.common.torch_layers import FlattenExtractor
from torch import nn

from allocator.artifacts.manifest import (
    MANIFEST_FILE,
    SCHEMA_VERSION,
    Manifest,
    ManifestError,
    MigrationRecord,
    read_manifest,
    read_raw,
    verify_checksums,
    write_manifest,
)
from allocator.portfolio import FeatureSpec, NormalizationStats, assemble_observation
from allocator.trainer.agents.icm import CuriosityNet
from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.td3 import SmoothTD3
from allocator.trainer.checkpoints.manifest import (
    CONFIG_FILE,
    ICM_FILE,
    MODEL_FILE,
    NORMALIZATION_FILE,
    build_manifest,
    refresh_checksums,
)
from allocator.trainer.market.data import SP500, DataError, load_dataset
from allocator.trainer.training.config import ConfigError, TrainConfig, load_config

VALIDATION_FILE = "validation.json"
V1_REQUIRED = (MODEL_FILE, CONFIG_FILE, NORMALIZATION_FILE)
PROBE_COUNT = 64
PROBE_SEED = 0
MAX_PROBE_MASKS = 256
"""Masks over the old slots checked when widening: all 2^m of them up to this many."""
FLOAT32_ATOL = 1e-5
"""Bound on the float32 ``predict`` difference after widening (a few ulps of BLAS reordering).

The identity itself is checked exactly (``canonical_max_diff`` must be 0); this bound only
catches a deployed float32 model that is wrong in a way the canonical check could not see.
"""
EVALUATOR_ATOL = 1e-4
"""The canonical evaluator must agree this closely with the float32 model it re-computes."""

ALGORITHMS: dict[str, type[BaseAlgorithm]] = {"td3": SmoothTD3, "sac": SmoothSAC}
Array = NDArray[np.float64]


class MigrationError(ValueError):
    """A run directory that cannot be migrated, or a migration that failed its check."""


# --- versions and steps -----------------------------------------------------------------------


def detect_version(run_dir: str | Path) -> int:
    """Schema version of a run directory: 1 without ``manifest.json``, else the manifest's."""
    d = Path(run_dir)
    if not d.is_dir():
        raise MigrationError(f"{d}: no such directory")
    if not (d / MANIFEST_FILE).is_file():
        missing = [n for n in V1_REQUIRED if not (d / n).is_file()]
        if missing:
            raise MigrationError(
                f"{d}: not a run directory (no {MANIFEST_FILE}, and no {', '.join(missing)})"
            )
        return 1
    version = read_raw(d).get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise MigrationError(f"{d / MANIFEST_FILE}: schema_version {version!r} is not an integer")
    return version


def _training_record(model_zip: Path) -> tuple[dt.datetime, dict[str, str]]:
    """When training started and the library versions it used, as SB3 recorded them in the zip
    (a copied or checked-out file's mtime says nothing; the mtime is only the fallback)."""
    keys = {
        "Stable-Baselines3": "stable-baselines3",
        "PyTorch": "torch",
        "Numpy": "numpy",
        "Gymnasium": "gymnasium",
    }
    started = dt.datetime.fromtimestamp(model_zip.stat().st_mtime, dt.UTC)
    versions: dict[str, str] = {}
    try:
        with zipfile.ZipFile(model_zip) as archive:
            names = set(archive.namelist())
            if "data" in names:
                ns = json.loads(archive.read("data")).get("start_time")
                if isinstance(ns, int) and ns > 0:
                    started = dt.datetime.fromtimestamp(ns / 1e9, dt.UTC)
            info = archive.read("system_info.txt").decode() if "system_info.txt" in names else ""
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise MigrationError(f"{model_zip}: not a readable SB3 model: {exc}") from exc
    for line in info.splitlines():
        name, sep, value = line.lstrip("- ").partition(":")
        if sep and name.strip() in keys:
            versions[keys[name.strip()]] = value.strip()
    return started, versions


def resolve_dataset(run_dir: Path, dataset: str) -> str | Path:
    """A config's dataset: ``sp500``, an absolute path, or a relative path tried beside the run
    directory first (self-contained runs and fixtures) and then in the working directory (where
    training resolved it)."""
    if dataset == SP500:
        return dataset
    path = Path(dataset)
    if not path.is_absolute() and (run_dir / path).exists():
        return run_dir / path
    return path


def training_universe(run_dir: Path, config: TrainConfig) -> tuple[list[str], str]:
    """The assets training drew from, and where that came from.

    ``data.assets`` when the config lists them (no data needed); else the dataset's assets with
    prices in the training period, as ``train`` computes it. ``validation.json`` lists only the
    validation period's slots, so it is not a substitute.
    """
    if config.data.assets:
        return list(config.data.assets), "config data.assets"
    source = resolve_dataset(run_dir, config.data.dataset)
    try:
        data = load_dataset(source)
    except DataError as exc:
        raise MigrationError(
            f"{run_dir}: the config lists no data.assets, so the universe comes from the dataset, "
            f"which cannot be loaded: {exc}"
        ) from exc
    train_data = data.between(config.data.train_start, config.data.train_end)
    return list(train_data.assets), f"dataset {source} training period"


def v1_to_v2(run_dir: Path, at: str) -> Manifest:
    """Write the manifest a version-1 run would have had, from the files it already holds."""
    try:
        config = load_config(run_dir / CONFIG_FILE)
    except ConfigError as exc:
        raise MigrationError(str(exc)) from exc
    try:
        stats = NormalizationStats(**json.loads((run_dir / NORMALIZATION_FILE).read_text()))
    except (ValueError, TypeError) as exc:
        raise MigrationError(f"{run_dir / NORMALIZATION_FILE}: {exc}") from exc
    validation_path = run_dir / VALIDATION_FILE
    metrics: dict[str, Any] = {}
    if validation_path.is_file():
        metrics = json.loads(validation_path.read_text()).get("metrics", {})
    universe, universe_source = training_universe(run_dir, config)
    manifest = build_manifest(config, stats, universe, metrics, run_dir)
    started, versions = _training_record(run_dir / MODEL_FILE)
    note = (
        f"manifest built from {CONFIG_FILE}, {NORMALIZATION_FILE}, "
        f"{VALIDATION_FILE if metrics else 'no metrics'}; universe from {universe_source}; "
        f"created and library versions as recorded in {MODEL_FILE}"
    )
    manifest = manifest.model_copy(
        update={
            "created": started.isoformat(),
            "library_versions": versions,
            "migrations": [MigrationRecord(from_version=1, to_version=2, at=at, note=note)],
        }
    )
    write_manifest(run_dir, manifest)
    return manifest


MigrationStep = Callable[[Path, str], Manifest]
STEPS: dict[int, MigrationStep] = {1: v1_to_v2}
"""``STEPS[n]`` rewrites a version-n run directory in place as version n + 1."""


# --- observation layout and padding -----------------------------------------------------------


@dataclass(frozen=True)
class Embedding:
    """Where the entries of an old vector go in a longer one (the rest are new, zero)."""

    index: NDArray[np.int64]
    size: int


def observation_embedding(spec: FeatureSpec, max_assets: int) -> Embedding:
    """Old observation entries in the ``max_assets`` layout: the feature blocks of the new slots
    follow the old ones, and each new slot's weight and mask entry follows the old slots' own."""
    m, w, big = spec.max_assets, spec.window, max_assets
    index = np.concatenate(
        [
            np.arange(m * w),
            big * w + np.arange(m + 1),
            big * w + (big + 1) + np.arange(m + 1),
        ]
    )
    return Embedding(index, big * w + 2 * (big + 1))


def action_embedding(spec: FeatureSpec, max_assets: int) -> Embedding:
    """Cash and the old slots keep their positions; the new slots are appended."""
    return Embedding(np.arange(spec.max_assets + 1), max_assets + 1)


def critic_embedding(obs: Embedding, act: Embedding) -> Embedding:
    """The critics read ``concat(observation, action)``."""
    return Embedding(np.concatenate([obs.index, obs.size + act.index]), obs.size + act.size)


def shifted(emb: Embedding, prefix: int) -> Embedding:
    """``concat(x, v)`` with ``x`` of fixed length ``prefix`` and ``v`` embedded by ``emb``."""
    return Embedding(np.concatenate([np.arange(prefix), prefix + emb.index]), prefix + emb.size)


Plan = dict[str, tuple[Embedding | None, Embedding | None]]
"""Parameter name -> (row embedding, column embedding) of its padding; absent: unchanged."""


def pad_tensor(t: th.Tensor, rows: Embedding | None, cols: Embedding | None) -> th.Tensor:
    """A zero tensor of the widened shape with ``t`` placed at the embedded rows and columns."""
    r = th.as_tensor(rows.index) if rows is not None else th.arange(t.shape[0])
    shape = [rows.size if rows is not None else t.shape[0], *t.shape[1:]]
    if t.ndim == 1:
        out = t.new_zeros(shape)
        out[r] = t
        return out
    c = th.as_tensor(cols.index) if cols is not None else th.arange(t.shape[1])
    shape[1] = cols.size if cols is not None else t.shape[1]
    out = t.new_zeros(shape)
    out[r[:, None], c[None, :]] = t
    return out


def _linear_indices(keys: Iterable[str], prefix: str) -> list[int]:
    """Indices of the Linear layers of the ``nn.Sequential`` saved under ``prefix``."""
    found = set()
    for key in keys:
        head, _, rest = key.partition(prefix + ".")
        if head == "" and rest.endswith(".weight") and rest.split(".")[0].isdigit():
            found.add(int(rest.split(".")[0]))
    return sorted(found)


def _add(plan: Plan, name: str, rows: Embedding | None, cols: Embedding | None) -> None:
    plan[f"{name}.weight"] = (rows, cols)
    plan[f"{name}.bias"] = (rows, None)


def policy_plan(keys: list[str], obs: Embedding, act: Embedding) -> Plan:
    """How each parameter of an SB3 TD3/SAC ``MlpPolicy`` is padded; unknown layouts raise."""
    plan: Plan = {}
    for actor in ("actor", "actor_target"):
        mu = _linear_indices(keys, f"{actor}.mu")
        if mu:  # TD3: mu = Linear, ReLU, ..., Linear, Tanh
            _add(plan, f"{actor}.mu.{mu[0]}", None, obs)
            _add(plan, f"{actor}.mu.{mu[-1]}", act, obs if len(mu) == 1 else None)
            continue
        if f"{actor}.mu.weight" in keys:  # SAC: latent_pi, then the mu and log_std heads
            latent = _linear_indices(keys, f"{actor}.latent_pi")
            if latent:
                _add(plan, f"{actor}.latent_pi.{latent[0]}", None, obs)
            for head in ("mu", "log_std"):
                _add(plan, f"{actor}.{head}", act, None if latent else obs)
    crit = critic_embedding(obs, act)
    for critic in ("critic", "critic_target"):
        for q in range(8):
            layers = _linear_indices(keys, f"{critic}.qf{q}")
            if layers:
                _add(plan, f"{critic}.qf{q}.{layers[0]}", None, crit)
    # A parameter missed here keeps its old shape and fails to load into the widened model.
    if not any(k.startswith("actor.") for k in plan) or not any(
        k.startswith("critic.") for k in plan
    ):
        raise MigrationError(
            "cannot widen this policy: expected SB3's TD3/SAC MlpPolicy layout, got parameters "
            + ", ".join(keys[:6])
        )
    return plan


def icm_plan(net: dict[str, th.Tensor], obs: Embedding, act: Embedding) -> Plan:
    """``CuriosityNet``: encoder input, inverse-model output, forward-model action input."""
    features = int(net["encoder.2.weight"].shape[0])
    plan: Plan = {}
    _add(plan, "encoder.0", None, obs)
    _add(plan, "inverse_model.0.2", act, None)
    _add(plan, "forward_model.0", None, shifted(act, features))
    return plan


def pad_state(state: dict[str, th.Tensor], plan: Plan) -> dict[str, th.Tensor]:
    """A state_dict with every planned tensor padded (the rest unchanged, same order)."""
    missing = [k for k in plan if k not in state]
    if missing:
        raise MigrationError(f"cannot widen: parameter(s) {', '.join(missing)} not found")
    return {k: pad_tensor(v, *plan[k]) if k in plan else v for k, v in state.items()}


def pad_optimizer(
    state: dict[str, Any], names: list[str], old: dict[str, th.Tensor], plan: Plan
) -> dict[str, Any]:
    """Adam state with its moments padded like the parameters they belong to (new entries 0).

    ``names`` are the optimizer's parameters in order (its state is keyed by position).
    """
    ids = [i for group in state["param_groups"] for i in group["params"]]
    if len(ids) != len(names):
        raise MigrationError(
            f"cannot widen optimizer state: {len(ids)} parameters, expected {len(names)}"
        )
    out = copy.deepcopy(state)
    for i, name in zip(ids, names, strict=True):
        for key, value in out["state"].get(i, {}).items():
            if not isinstance(value, th.Tensor) or value.ndim == 0:
                continue
            if value.shape != old[name].shape:
                raise MigrationError(
                    f"cannot widen optimizer state: {key} of {name} has shape "
                    f"{tuple(value.shape)}, parameter {tuple(old[name].shape)}"
                )
            if name in plan:
                out["state"][i][key] = pad_tensor(value, *plan[name])
    return out


def pad_noise(noise: Any, size: int) -> Any:
    """TD3 action noise for ``size`` slots: new sigma = mean old sigma, other arrays zero."""
    if noise is None:
        return None
    out = copy.copy(noise)
    for name, value in vars(noise).items():
        if isinstance(value, np.ndarray) and value.ndim == 1 and value.size < size:
            fill = float(value.mean()) if name == "_sigma" else 0.0
            extra = np.full(size - value.size, fill, dtype=value.dtype)
            setattr(out, name, np.concatenate([value, extra]))
    return out


def observation_space(spec: FeatureSpec) -> gym.spaces.Box:
    """The environment's observation space (``PortfolioEnv``): features in +-clip, rest [0, 1]."""
    n_feat = spec.max_assets * spec.window
    low = np.concatenate([np.full(n_feat, -spec.clip), np.zeros(2 * spec.n_slots)])
    high = np.concatenate([np.full(n_feat, spec.clip), np.ones(2 * spec.n_slots)])
    return gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    th.save(obj, buf)
    return buf.getvalue()


def widen_model_zip(src: Path, dst: Path, spec: FeatureSpec, max_assets: int) -> None:
    """Rewrite an SB3 ``model.zip`` for ``max_assets`` slots, entry by entry.

    Only the tensors and the shape-dependent data change (spaces, action noise, SAC's automatic
    target entropy; the last rollout observation is dropped so training resets the env); every
    other entry is copied byte for byte, so ``SmoothTD3.load`` / ``SmoothSAC.load`` read it
    like any saved model.
    """
    obs, act = observation_embedding(spec, max_assets), action_embedding(spec, max_assets)
    with zipfile.ZipFile(src) as archive:
        infos = archive.infolist()
        entries = {info.filename: archive.read(info) for info in infos}
    raw = json.loads(entries["data"])
    saved_obs, expected = _json_value(raw, "observation_space"), observation_space(spec)
    saved_act = _json_value(raw, "action_space")
    if not (
        saved_obs.shape == expected.shape
        and np.array_equal(saved_obs.low, expected.low)
        and np.array_equal(saved_obs.high, expected.high)
        and saved_act.shape == (spec.n_slots,)
    ):
        raise MigrationError(
            f"{src}: spaces {saved_obs.shape}, {saved_act.shape} do not match the manifest's "
            f"feature spec (max_assets {spec.max_assets}, window {spec.window})"
        )
    policy = th.load(io.BytesIO(entries["policy.pth"]), map_location="cpu", weights_only=True)
    keys = list(policy)
    plan = policy_plan(keys, obs, act)
    entries["policy.pth"] = _torch_bytes(pad_state(policy, plan))
    for prefix in ("actor", "critic"):
        name = f"{prefix}.optimizer.pth"
        if name in entries:
            state = th.load(io.BytesIO(entries[name]), map_location="cpu", weights_only=True)
            names = [k for k in keys if k.startswith(prefix + ".")]
            entries[name] = _torch_bytes(pad_optimizer(state, names, policy, plan))
    new_spec = FeatureSpec(max_assets, spec.window, spec.clip)
    patch: dict[str, Any] = {
        "observation_space": observation_space(new_spec),
        "action_space": gym.spaces.Box(-1.0, 1.0, (new_spec.n_slots,), np.float32),
        "_last_obs": None,
        "_last_original_obs": None,
    }
    if "action_noise" in raw:
        patch["action_noise"] = pad_noise(_json_value(raw, "action_noise"), new_spec.n_slots)
    if raw.get("target_entropy") == -float(spec.n_slots):  # "auto": -dim(action)
        patch["target_entropy"] = -float(new_spec.n_slots)
    raw.update(json.loads(data_to_json(patch)))
    entries["data"] = json.dumps(raw, indent=4).encode()
    _write_zip(dst, infos, entries)


def _json_value(raw: dict[str, Any], key: str) -> Any:
    """One item of SB3's serialized ``data``, deserialized."""
    return json_to_data(json.dumps({key: raw[key]}))[key]


def _write_zip(dst: Path, infos: list[zipfile.ZipInfo], entries: dict[str, bytes]) -> None:
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=".model-", suffix=".zip")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w") as archive:
            for info in infos:  # fresh headers: the old ones carry the old sizes
                fresh = zipfile.ZipInfo(info.filename, info.date_time)
                fresh.compress_type, fresh.external_attr = info.compress_type, info.external_attr
                archive.writestr(fresh, entries[info.filename])
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def widen_icm(src: Path, dst: Path, spec: FeatureSpec, max_assets: int) -> None:
    """Pad ``icm.pt`` (network and Adam state) for ``max_assets`` slots."""
    state = th.load(src, map_location="cpu", weights_only=True)
    obs, act = observation_embedding(spec, max_assets), action_embedding(spec, max_assets)
    plan = icm_plan(state["net"], obs, act)
    names = [k for k in state["net"] if k.endswith((".weight", ".bias"))]
    out = {
        **state,
        "net": pad_state(state["net"], plan),
        "optimizer": pad_optimizer(state["optimizer"], names, state["net"], plan),
        "dims": [obs.size, act.size],
    }
    th.save(out, dst)


def widen(run_dir: Path, max_assets: int, at: str) -> Manifest:
    """Widen a current-version run directory in place to ``max_assets`` slots."""
    manifest = read_manifest(run_dir)
    fs = manifest.feature_spec
    if fs.features != ["log_return"]:
        raise MigrationError(f"cannot widen features {fs.features}: only a log_return window")
    spec = FeatureSpec(fs.max_assets, fs.window, fs.clip)
    widen_model_zip(run_dir / MODEL_FILE, run_dir / MODEL_FILE, spec, max_assets)
    if (run_dir / ICM_FILE).is_file():
        widen_icm(run_dir / ICM_FILE, run_dir / ICM_FILE, spec, max_assets)
    note = (
        f"widened max_assets {spec.max_assets} -> {max_assets}: zero input columns for the new "
        "slots' features, weights, mask (and critic actions); new actor rows zero weight and "
        "bias (action 0 until trained, masked until filled); Adam moments zero-padded"
    )
    record = MigrationRecord(
        from_version=manifest.schema_version, to_version=SCHEMA_VERSION, at=at, note=note
    )
    widened = manifest.model_copy(
        update={
            "feature_spec": fs.model_copy(update={"max_assets": max_assets}),
            "widened_from": spec.max_assets,
            "migrations": [*manifest.migrations, record],
        }
    )
    widened = refresh_checksums(run_dir, widened)
    write_manifest(run_dir, widened)
    return widened


# --- canonical evaluation---------------------------------------------------------------------


def _elementwise(module: nn.Module, x: Array) -> Array:
    """Activations, element by element in float64 (scalar libm: no SIMD-path differences)."""
    if isinstance(module, nn.ReLU):
        return np.maximum(x, 0.0)
    if isinstance(module, nn.Tanh):
        return np.vectorize(math.tanh, otypes=[np.float64])(x)
    if isinstance(module, nn.ELU):
        alpha = float(module.alpha)
        return np.vectorize(lambda v: v if v > 0 else alpha * math.expm1(v), otypes=[np.float64])(x)
    if isinstance(module, (nn.Identity, nn.Flatten)):
        return x
    raise MigrationError(f"cannot verify a network with a {type(module).__name__} layer")


def canonical_linear(x: Array, w: Array, b: Array) -> Array:
    """``x @ w.T + b`` with each dot product's terms sorted and added one by one in float64.

    The sum then depends only on the multiset of its terms, and exact zeros (the padding times
    a masked input) add nothing; BLAS instead splits rows into blocks and SIMD lanes by their
    length, so a longer row regroups the same terms.
    """
    out = np.empty((len(x), w.shape[0]))
    chunk = max(1, 4_000_000 // (w.shape[0] * (w.shape[1] + 1)))
    for s in range(0, len(x), chunk):
        xs = x[s : s + chunk]
        bias = np.broadcast_to(b[None, :, None], (len(xs), w.shape[0], 1))
        terms = np.concatenate([w[None] * xs[:, None, :], bias], axis=2)
        terms.sort(axis=2)
        out[s : s + chunk] = np.cumsum(terms, axis=2)[..., -1]  # accumulate: sequential
    return out


def canonical_forward(layers: Iterable[nn.Module], x: Array) -> Array:
    """A float64 forward pass in which summation order cannot matter (``canonical_linear``).

    A widened network on an embedded observation and the original network on the original
    observation then give bit-identical outputs exactly when their weights compute the same
    function; the first layer's products of float32 values are even exact in float64.
    """
    out = np.asarray(x, dtype=np.float64)
    for module in layers:
        if isinstance(module, nn.Sequential):
            out = canonical_forward(module, out)
        elif isinstance(module, nn.Linear):
            w = module.weight.detach().cpu().double().numpy()
            b = (
                module.bias.detach().cpu().double().numpy()
                if module.bias is not None
                else np.zeros(w.shape[0])
            )
            out = canonical_linear(out, w, b)
        else:
            out = _elementwise(module, out)
    return out


def _actor_layers(model: BaseAlgorithm) -> dict[str, list[nn.Module]]:
    """The deterministic actor(s) of a TD3/SAC ``MlpPolicy`` as plain layer lists."""
    policy: Any = model.policy
    if not isinstance(policy.actor.features_extractor, FlattenExtractor):
        raise MigrationError("cannot verify: the actor's features extractor is not Flatten")
    if hasattr(policy.actor, "latent_pi"):  # SAC: deterministic action = tanh(mu(latent))
        if policy.actor.use_sde:
            raise MigrationError("cannot verify a SAC actor with gSDE")
        return {"actor": [*policy.actor.latent_pi, policy.actor.mu, nn.Tanh()]}
    return {"actor": list(policy.actor.mu), "actor_target": list(policy.actor_target.mu)}


def _critic_layers(model: BaseAlgorithm) -> dict[str, list[nn.Module]]:
    policy: Any = model.policy
    return {
        f"{name}.qf{i}": list(q)
        for name in ("critic", "critic_target")
        for i, q in enumerate(getattr(policy, name).q_networks)
    }


# --- probes and checks ------------------------------------------------------------------------


def load_model(algorithm: str, path: Path) -> BaseAlgorithm:
    """A saved SmoothTD3/SmoothSAC on the CPU."""
    if algorithm not in ALGORITHMS:
        raise MigrationError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    return ALGORITHMS[algorithm].load(path, device="cpu")


@dataclass(frozen=True)
class ProbeParts:
    """A probe set before assembly: the same parts embed into any wider layout."""

    features: NDArray[np.float32]  # (n, max_assets, window)
    weights: NDArray[np.float32]  # (n, max_assets + 1)
    mask: NDArray[np.float32]  # (n, max_assets + 1)

    def observations(self, spec: FeatureSpec) -> NDArray[np.float32]:
        """The probes in ``spec``'s layout; slots beyond the parts' own are empty and masked."""
        n, m, w = self.features.shape
        extra = spec.max_assets - m
        feats = np.concatenate([self.features, np.zeros((n, extra, w), np.float32)], axis=1)
        pad = np.zeros((n, extra), np.float32)
        weights = np.concatenate([self.weights, pad], axis=1)
        mask = np.concatenate([self.mask, pad], axis=1)
        return assemble_observation(feats, weights, mask, spec)


def probe_masks(max_assets: int, seed: int = PROBE_SEED) -> NDArray[np.float32]:
    """Every subset of live asset slots (cash always live), or a seeded sample of them."""
    if 2**max_assets <= MAX_PROBE_MASKS:
        live = np.array(list(itertools.product([0.0, 1.0], repeat=max_assets)), np.float32)
    else:
        rng = np.random.default_rng(seed)
        live = (rng.random((MAX_PROBE_MASKS, max_assets)) < 0.5).astype(np.float32)
        live[0], live[1] = 0.0, 1.0  # all masked and all live, always
    return np.concatenate([np.ones((len(live), 1), np.float32), live], axis=1)


def probe_parts(
    spec: FeatureSpec, masks: NDArray[np.float32], per_mask: int, seed: int = PROBE_SEED
) -> ProbeParts:
    """``per_mask`` seeded observations for each mask: normal features (clipped), Dirichlet
    weights over the live slots."""
    rng = np.random.default_rng(seed)
    mask = np.repeat(masks, per_mask, axis=0)
    n = len(mask)
    features = np.clip(rng.normal(size=(n, spec.max_assets, spec.window)), -spec.clip, spec.clip)
    weights = rng.dirichlet(np.ones(spec.n_slots), size=n) * mask
    weights /= weights.sum(axis=1, keepdims=True)
    return ProbeParts(features.astype(np.float32), weights.astype(np.float32), mask)


def random_probes(spec: FeatureSpec, n: int = PROBE_COUNT, seed: int = PROBE_SEED) -> ProbeParts:
    """``n`` seeded observations with random masks (each asset slot live with probability 1/2)."""
    rng = np.random.default_rng(seed + 1)
    live = (rng.random((n, spec.max_assets)) < 0.5).astype(np.float32)
    masks = np.concatenate([np.ones((n, 1), np.float32), live], axis=1)
    return probe_parts(spec, masks, 1, seed)


@dataclass(frozen=True)
class ProbeReport:
    """What the post-migration check compared and found.

    ``float32_max_diff``: old vs migrated ``model.predict`` (as deployed), old slots only.
    ``canonical_max_diff``: the same in ``canonical_forward`` (widening only; must be 0), with
    ``critic_canonical_max_diff`` (Q values, target networks too) and ``icm_canonical_max_diff``.
    ``new_slot_max_action``: largest |action| of a new slot (0 by construction).
    """

    observations: int
    masks: int
    float32_max_diff: float
    canonical_max_diff: float | None = None
    critic_canonical_max_diff: float | None = None
    icm_canonical_max_diff: float | None = None
    new_slot_max_action: float | None = None


def _max_abs(a: Array, b: Array) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def check_same_actions(algorithm: str, before: Path, after: Path, spec: FeatureSpec) -> ProbeReport:
    """Same-shape migration: the probe actions must be bit-identical."""
    parts = random_probes(spec)
    obs = parts.observations(spec)
    old, new = load_model(algorithm, before / MODEL_FILE), load_model(algorithm, after / MODEL_FILE)
    diff = _max_abs(
        old.predict(obs, deterministic=True)[0], new.predict(obs, deterministic=True)[0]
    )
    if diff != 0.0:
        raise MigrationError(f"probe actions differ after migration (max |diff| {diff:.3g})")
    masks = len(np.unique(parts.mask, axis=0))
    return ProbeReport(observations=len(obs), masks=masks, float32_max_diff=diff)


def _icm_net(path: Path) -> CuriosityNet:
    state = th.load(path, map_location="cpu", weights_only=True)
    obs_dim, act_dim = state["dims"]
    net_state = state["net"]
    net = CuriosityNet(
        obs_dim,
        act_dim,
        feature_dim=int(net_state["encoder.2.weight"].shape[0]),
        hidden_dim=int(net_state["encoder.0.weight"].shape[0]),
    )
    net.load_state_dict(net_state)
    return net


def _check_icm(
    before: Path, after: Path, obs: tuple[Array, Array], acts: tuple[Array, Array], n_act: int
) -> float:
    """Exact ICM encoder, inverse-model (old slots) and forward-model outputs, old vs widened."""
    old, new = _icm_net(before), _icm_net(after)
    phi_old = canonical_forward(old.encoder, obs[0])
    phi_new = canonical_forward(new.encoder, obs[1])
    pair_old = np.concatenate([phi_old, phi_old[::-1]], axis=1)
    pair_new = np.concatenate([phi_new, phi_new[::-1]], axis=1)
    inv_old = canonical_forward(old.inverse_model, pair_old)
    inv_new = canonical_forward(new.inverse_model, pair_new)[:, :n_act]
    fwd_old = canonical_forward(old.forward_model, np.concatenate([phi_old, acts[0]], axis=1))
    fwd_new = canonical_forward(new.forward_model, np.concatenate([phi_new, acts[1]], axis=1))
    return max(_max_abs(phi_old, phi_new), _max_abs(inv_old, inv_new), _max_abs(fwd_old, fwd_new))


def check_widened(
    algorithm: str, before: Path, after: Path, spec: FeatureSpec, max_assets: int
) -> ProbeReport:
    """Widened vs original on every mask over the old slots (new slots masked): old slots'
    actions, Q values, targets and ICM bit-identical in ``canonical_forward``; float32
    reported (and bounded by ``FLOAT32_ATOL``)."""
    new_spec = FeatureSpec(max_assets, spec.window, spec.clip)
    masks = probe_masks(spec.max_assets)
    parts = probe_parts(spec, masks, max(1, math.ceil(PROBE_COUNT / len(masks))))
    obs_old, obs_new = parts.observations(spec), parts.observations(new_spec)
    emb = observation_embedding(spec, max_assets)
    rest = np.setdiff1d(np.arange(emb.size), emb.index)
    if not (np.array_equal(obs_new[:, emb.index], obs_old) and not obs_new[:, rest].any()):
        raise MigrationError("observation_embedding disagrees with assemble_observation's layout")
    old, new = load_model(algorithm, before / MODEL_FILE), load_model(algorithm, after / MODEL_FILE)
    n_act = spec.n_slots

    canonical, new_slots, ref = 0.0, 0.0, {}
    new_actors = _actor_layers(new)
    for name, layers in _actor_layers(old).items():
        ref[name] = canonical_forward(layers, obs_old)
        a_new = canonical_forward(new_actors[name], obs_new)
        canonical = max(canonical, _max_abs(ref[name], a_new[:, :n_act]))
        new_slots = max(new_slots, float(np.max(np.abs(a_new[:, n_act:]))))
    f32_old = old.predict(obs_old, deterministic=True)[0]
    f32_new = new.predict(obs_new, deterministic=True)[0]
    float32 = _max_abs(f32_old, f32_new[:, :n_act])
    consistency = _max_abs(ref["actor"], f32_old)

    rng = np.random.default_rng(PROBE_SEED + 2)
    act_old = rng.uniform(-1, 1, (len(obs_old), n_act))
    act_new = np.concatenate(
        [act_old, rng.uniform(-1, 1, (len(obs_old), max_assets - spec.max_assets))], axis=1
    )
    critic = 0.0
    new_critics = _critic_layers(new)
    for name, layers in _critic_layers(old).items():
        q_old = canonical_forward(layers, np.concatenate([obs_old, act_old], axis=1))
        q_new = canonical_forward(new_critics[name], np.concatenate([obs_new, act_new], axis=1))
        critic = max(critic, _max_abs(q_old, q_new))
    icm = None
    if (before / ICM_FILE).is_file():
        icm = _check_icm(
            before / ICM_FILE, after / ICM_FILE, (obs_old, obs_new), (act_old, act_new), n_act
        )
    report = ProbeReport(
        observations=len(obs_old),
        masks=len(masks),
        float32_max_diff=float32,
        canonical_max_diff=canonical,
        critic_canonical_max_diff=critic,
        icm_canonical_max_diff=icm,
        new_slot_max_action=new_slots,
    )
    problems = []
    if canonical != 0.0 or critic != 0.0 or (icm is not None and icm != 0.0):
        problems.append(
            f"canonical float64 outputs differ (actor {canonical:.3g}, critic {critic:.3g}, "
            f"icm {icm})"
        )
    if consistency > EVALUATOR_ATOL:
        problems.append(f"canonical evaluator is {consistency:.3g} from the float32 model")
    if float32 > FLOAT32_ATOL:
        problems.append(f"float32 actions differ by {float32:.3g} > {FLOAT32_ATOL:g}")
    if problems:
        raise MigrationError("widened model does not act like the original: " + "; ".join(problems))
    return report


# --- driver -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MigrationResult:
    """What ``migrate`` did: versions, the backup it made, and the post-migration check."""

    manifest: Manifest
    run_dir: Path
    backup: Path
    from_version: int
    to_version: int
    probe: ProbeReport
    widened_from: int | None = None
    notes: list[str] = field(default_factory=list)


def backup_dir(run_dir: Path, version: int) -> Path:
    """Copy ``run_dir`` to a fresh sibling ``<name>.bak-v<version>-<timestamp>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = run_dir.with_name(f"{run_dir.name}.bak-v{version}-{stamp}")
    target, i = base, 1
    while target.exists():
        target, i = Path(f"{base}-{i}"), i + 1
    shutil.copytree(run_dir, target, symlinks=True)
    return target


def restore(run_dir: Path, backup: Path) -> None:
    """Put the backed-up directory back in place of a failed migration's."""
    shutil.rmtree(run_dir)
    shutil.copytree(backup, run_dir, symlinks=True)


def _current_max_assets(run_dir: Path, version: int) -> int:
    if version == SCHEMA_VERSION:
        return read_manifest(run_dir).feature_spec.max_assets
    try:
        return load_config(run_dir / CONFIG_FILE).env.max_assets
    except ConfigError as exc:
        raise MigrationError(str(exc)) from exc


def _spec(manifest: Manifest) -> FeatureSpec:
    fs = manifest.feature_spec
    return FeatureSpec(fs.max_assets, fs.window, fs.clip)


def _preflight(d: Path, to_version: int, max_assets: int | None) -> tuple[int, int, bool]:
    """(version, current max_assets, widening?), or why the migration is refused."""
    version = detect_version(d)
    known = range(1, SCHEMA_VERSION + 1)
    if version not in known:
        raise MigrationError(
            f"{d}: schema version {version} is unknown to this Allocator (it knows "
            f"{known.start}..{known.stop - 1}); a newer Allocator wrote it?"
        )
    if to_version not in known:
        raise MigrationError(
            f"unknown target schema version {to_version} (known: {known.start}..{known.stop - 1})"
        )
    if to_version < version:
        raise MigrationError(
            f"{d}: is at schema version {version}; cannot downgrade to {to_version}"
        )
    if max_assets is not None and to_version != SCHEMA_VERSION:
        raise MigrationError(f"widening needs the current schema version {SCHEMA_VERSION}")
    if version == SCHEMA_VERSION:
        verify_checksums(d, read_manifest(d))  # never bless altered files with new checksums
    current = _current_max_assets(d, version)
    if max_assets is not None and max_assets < current:
        raise MigrationError(
            f"{d}: max_assets {max_assets} is below the current max_assets {current}; "
            "a checkpoint can only be widened"
        )
    widening = max_assets is not None and max_assets > current
    exported = version == SCHEMA_VERSION and read_manifest(d).export is not None
    if widening and (exported or not (d / MODEL_FILE).is_file()):
        raise MigrationError(
            f"{d}: no {MODEL_FILE} here (an exported model?); widen the run directory it came "
            "from and export that again"
        )
    if to_version == version and not widening:
        raise MigrationError(
            f"{d}: already at schema version {version}"
            + (f" with max_assets {current}" if max_assets is not None else "")
            + "; nothing to migrate"
        )
    return version, current, widening


def run_migration(
    run_dir: str | Path, to_version: int = SCHEMA_VERSION, max_assets: int | None = None
) -> MigrationResult:
    """Upgrade ``run_dir`` to ``to_version`` (and widen it to ``max_assets`` slots), in place.

    Refused before anything is touched: a missing or non-run directory, an unknown or lower
    target version, ``max_assets`` below the current width, and nothing to do. Otherwise the
    directory is backed up first and restored from the backup if any step or check fails.
    """
    d = Path(run_dir).resolve()
    try:
        version, current, widening = _preflight(d, to_version, max_assets)
    except ManifestError as exc:
        raise MigrationError(str(exc)) from exc

    at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    backup = backup_dir(d, version)
    records_before = 0 if version == 1 else len(read_manifest(d).migrations)
    try:
        for step in range(version, to_version):
            STEPS[step](d, at)
        manifest = read_manifest(d)
        algorithm, spec = manifest.algorithm, _spec(manifest)
        if widening:
            assert max_assets is not None
            manifest = widen(d, max_assets, at)
            probe = check_widened(algorithm, backup, d, spec, max_assets)
            summary = (
                f"probe: {probe.observations} observations over {probe.masks} masks, canonical "
                f"max |diff| {probe.canonical_max_diff:g}, float32 max |diff| "
                f"{probe.float32_max_diff:.3g}"
            )
        else:
            probe = check_same_actions(algorithm, backup, d, spec)
            summary = (
                f"probe: {probe.observations} observations, max |action diff| "
                f"{probe.float32_max_diff:g}"
            )
        tail = f"; backup {backup}; {summary}"
        records = [
            r.model_copy(update={"note": r.note + tail}) if i >= records_before else r
            for i, r in enumerate(manifest.migrations)
        ]
        manifest = manifest.model_copy(update={"migrations": records})
        write_manifest(d, manifest)
        verify_checksums(d, read_manifest(d))
    except BaseException as exc:
        restore(d, backup)
        if isinstance(exc, MigrationError | ManifestError | DataError | ConfigError):
            raise MigrationError(f"{exc} (restored {d} from {backup})") from exc
        raise
    return MigrationResult(
        manifest=manifest,
        run_dir=d,
        backup=backup,
        from_version=version,
        to_version=to_version,
        probe=probe,
        widened_from=current if widening else None,
        notes=[r.note for r in manifest.migrations[records_before:]],
    )


def migrate(
    run_dir: str | Path, to_version: int = SCHEMA_VERSION, max_assets: int | None = None
) -> Manifest:
    """``run_migration`` returning only the new manifest (its migration notes name the backup)."""
    return run_migration(run_dir, to_version, max_assets).manifest
