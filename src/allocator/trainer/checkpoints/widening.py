"""Widening a policy trained on ``m`` asset slots to ``M``: new slots get zero input columns and
zero actor rows (a pre-tanh 0 keeps tanh's gradient, where a large negative bias would start
them dead), and Adam moments are zero-padded alike, so training can resume.
"""

from __future__ import annotations

import copy
import io
import json
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from numpy.typing import NDArray
from stable_baselines3.common.save_util import data_to_json, json_to_data

from allocator.artifacts.files import atomic_write_with
from allocator.artifacts.manifest import (
    SCHEMA_VERSION,
    Manifest,
    MigrationRecord,
    checksums,
    read_manifest,
    write_manifest,
)
from allocator.portfolio import FeatureSpec
from allocator.trainer.checkpoints.errors import CheckpointUpgradeError
from allocator.trainer.sim.env import observation_space
from allocator.trainer.training.run_dir import CHECKPOINT_FILES, ICM_FILE, MODEL_FILE


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
        [np.arange(m * w), big * w + np.arange(m + 1), big * w + (big + 1) + np.arange(m + 1)]
    )
    return Embedding(index, big * w + 2 * (big + 1))


def action_embedding(spec: FeatureSpec, max_assets: int) -> Embedding:
    """Cash and the old slots keep their positions; the new slots are appended."""
    return Embedding(np.arange(spec.max_assets + 1), max_assets + 1)


def joined(first: Embedding, second: Embedding) -> Embedding:
    """``concat(x, v)`` with ``x`` embedded by ``first`` and ``v`` by ``second``."""
    index = np.concatenate([first.index, first.size + second.index])
    return Embedding(index, first.size + second.size)


Plan = dict[str, tuple[Embedding | None, Embedding | None]]
"""Parameter name -> (row embedding, column embedding) of its padding; absent: unchanged."""


def pad_tensor(t: th.Tensor, rows: Embedding | None, cols: Embedding | None) -> th.Tensor:
    """A zero tensor of the widened shape with ``t`` placed at the embedded rows and columns."""
    dims = list(zip((rows, cols)[: t.ndim], t.shape, strict=False))
    index = [th.arange(n) if e is None else th.as_tensor(e.index) for e, n in dims]
    out = t.new_zeros([n if e is None else e.size for e, n in dims] + list(t.shape[len(dims) :]))
    out[th.meshgrid(*index, indexing="ij")] = t
    return out


def _linear_indices(keys: Iterable[str], prefix: str) -> list[int]:
    """Indices of the Linear layers of the ``nn.Sequential`` saved under ``prefix``."""
    pattern = re.compile(rf"{re.escape(prefix)}\.(\d+)\.(.*\.)?weight$")
    return sorted({int(m[1]) for key in keys if (m := pattern.match(key))})


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
    crit = joined(obs, act)  # the critics read concat(observation, action)
    for critic in ("critic", "critic_target"):
        for q in range(8):
            layers = _linear_indices(keys, f"{critic}.qf{q}")
            if layers:
                _add(plan, f"{critic}.qf{q}.{layers[0]}", None, crit)
    # A parameter missed here keeps its old shape and fails to load into the widened model.
    if not any(k.startswith("actor.") for k in plan) or not any(
        k.startswith("critic.") for k in plan
    ):
        raise CheckpointUpgradeError(
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
    _add(plan, "forward_model.0", None, joined(Embedding(np.arange(features), features), act))
    return plan


def pad_state(state: dict[str, th.Tensor], plan: Plan) -> dict[str, th.Tensor]:
    """A state_dict with every planned tensor padded (the rest unchanged, same order)."""
    missing = [k for k in plan if k not in state]
    if missing:
        raise CheckpointUpgradeError(f"cannot widen: parameter(s) {', '.join(missing)} not found")
    return {k: pad_tensor(v, *plan[k]) if k in plan else v for k, v in state.items()}


def pad_optimizer(
    state: dict[str, Any], names: list[str], old: dict[str, th.Tensor], plan: Plan
) -> dict[str, Any]:
    """Adam state with its moments padded like their parameters (``names``, in order)."""
    ids = [i for group in state["param_groups"] for i in group["params"]]
    if len(ids) != len(names):
        raise CheckpointUpgradeError(
            f"cannot widen optimizer state: {len(ids)} parameters, expected {len(names)}"
        )
    out = copy.deepcopy(state)
    for i, name in zip(ids, names, strict=True):
        for key, value in out["state"].get(i, {}).items():
            if not isinstance(value, th.Tensor) or value.ndim == 0:
                continue
            if value.shape != old[name].shape:
                raise CheckpointUpgradeError(
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


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    th.save(obj, buf)
    return buf.getvalue()


def widen_model_zip(src: Path, dst: Path, spec: FeatureSpec, max_assets: int) -> None:
    """Rewrite an SB3 ``model.zip`` for ``max_assets`` slots: tensors and shape-dependent data
    change (the last rollout observation is dropped), every other entry is copied byte for byte."""
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
        raise CheckpointUpgradeError(
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
    atomic_write_with(dst, lambda tmp: _write_zip(tmp, infos, entries))


def _json_value(raw: dict[str, Any], key: str) -> Any:
    """One item of SB3's serialized ``data``, deserialized."""
    return json_to_data(json.dumps({key: raw[key]}))[key]


def _write_zip(path: Path, infos: list[zipfile.ZipInfo], entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for info in infos:  # fresh headers: the old ones carry the old sizes
            fresh = zipfile.ZipInfo(info.filename, info.date_time)
            fresh.compress_type, fresh.external_attr = info.compress_type, info.external_attr
            archive.writestr(fresh, entries[info.filename])


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
    if manifest.policy.kind != "mlp":
        raise CheckpointUpgradeError(
            f"cannot widen a {manifest.policy.kind} policy: it serves any number of assets "
            "as it is; only a flat MLP policy can be widened"
        )
    if fs.features != ["log_return"]:
        raise CheckpointUpgradeError(
            f"cannot widen features {fs.features}: only a log_return window"
        )
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
            "files": checksums(run_dir, CHECKPOINT_FILES),
        }
    )
    write_manifest(run_dir, widened)
    return widened
