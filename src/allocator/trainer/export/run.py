"""Export a finished run to ONNX for serving, checked against torch before it is published.

``export_run`` turns a run directory into a registry version
``registry/NAME/VERSION/{model.onnx, icm.onnx?, manifest.json}``:

* ``model.onnx`` takes the *raw* observation (``portfolio.build_raw_observation``) and the mask,
  and returns the deterministic action and the portfolio weights. Normalization (with the
  manifest's statistics) and the action -> weights mapping are part of the graph, so a server
  never re-implements either and cannot apply stale statistics.
* ``icm.onnx`` (runs trained with curiosity) returns the intrinsic reward of a transition.

Parity with torch is measured on 1,000 random and 1,000 real observations (a rollout over the
run's training data) and recorded in the exported manifest; an export whose graphs disagree with
torch by more than ``PARITY_TOLERANCE`` fails and leaves the registry untouched. A version
appears atomically: files are staged in a hidden directory beside it and renamed into place.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import os
import re
import shutil
import stat
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from stable_baselines3.common.base_class import BaseAlgorithm
from torch import nn

from allocator.artifacts.manifest import (
    Manifest,
    ManifestError,
    checksums,
    library_versions,
    read_manifest,
    verify_checksums,
    write_manifest,
)
from allocator.portfolio import (
    FeatureSpec,
    NormalizationStats,
    action_to_weights,
    assemble_observation,
    build_raw_observation,
    normalize_observation,
)
from allocator.trainer.agents.icm import CuriosityNet, ICMSettings, IntrinsicCuriosity
from allocator.trainer.checkpoints.manifest import ICM_FILE, MODEL_FILE, NORMALIZATION_FILE

MODEL_ONNX = "model.onnx"
ICM_ONNX = "icm.onnx"
ONNX_OPSET = 18
PARITY_TOLERANCE = 1e-5
"""Largest absolute ONNX-vs-torch difference (actions, weights, rewards) an export accepts."""
PARITY_SAMPLES = 1000
POLICY_INPUTS = ("observation", "mask")
POLICY_OUTPUTS = ("action", "weights")
ICM_INPUTS = ("previous_observation", "action", "observation", "mask")
ICM_OUTPUTS = ("intrinsic_reward",)
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_STAGING_PREFIX = ".tmp-"

Float32Array = NDArray[np.float32]
ActorFn = Callable[[Float32Array], Float32Array]


class ExportError(ValueError):
    """An export that cannot be made or failed its checks; nothing was written to the registry."""


# --- graphs ------------------------------------------------------------------------------


class ObservationNormalizer(nn.Module):
    """``portfolio.normalize_observation`` in torch ops, for raw observations in a graph.

    The ``mask`` input decides which slots are live (non-zero, cash forced live, as
    ``portfolio.live_mask``); it replaces the observation's mask block, so the actor never sees
    a mask other than the one its weights are mapped under. The standardization runs in
    float64, as numpy does, so the normalized features match ``normalize_observation`` bit for
    bit.
    """

    cash_live: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    clip: torch.Tensor

    def __init__(self, spec: FeatureSpec, stats: NormalizationStats) -> None:
        super().__init__()
        self.max_assets = spec.max_assets
        self.window = spec.window
        self.n_slots = spec.n_slots
        self.n_features = spec.max_assets * spec.window
        # float64 tensors, not Python floats: the exporter would store scalars as float32.
        for key, value in (("mean", stats.mean), ("std", stats.std), ("clip", spec.clip)):
            self.register_buffer(key, torch.tensor(float(value), dtype=torch.float64), False)
        cash = torch.zeros(spec.n_slots, dtype=torch.bool)
        cash[0] = True
        self.register_buffer("cash_live", cash, persistent=False)

    def live(self, mask: torch.Tensor) -> torch.Tensor:
        """Boolean live slots: non-zero mask entries, cash always live."""
        return (mask != 0) | self.cash_live

    def forward(self, raw: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        live = self.live(mask)
        n = self.n_features
        z = (raw[:, :n].to(torch.float64) - self.mean) / self.std
        z = torch.clamp(z, -self.clip, self.clip).to(torch.float32)  # tensor bounds: float64
        z = z.reshape(-1, self.max_assets, self.window)
        z = torch.where(live[:, 1:].unsqueeze(-1), z, 0.0).reshape(-1, n)
        weights = raw[:, n : n + self.n_slots]
        return torch.cat([z, weights, live.to(torch.float32)], dim=-1)


class ActionToWeights(nn.Module):
    """``portfolio.action_to_weights`` in torch ops (float64 inside, as numpy; float32 out).

    Preference ``min((a + 1) / 2, 1)``, NaN and negatives as zero, masked slots zero (cash
    always live), renormalized; a row with no positive live preference goes all to cash.
    """

    cash_live: torch.Tensor
    cash_only: torch.Tensor

    def __init__(self, n_slots: int) -> None:
        super().__init__()
        cash = torch.zeros(n_slots, dtype=torch.float64)
        cash[0] = 1.0
        self.register_buffer("cash_only", cash, persistent=False)
        self.register_buffer("cash_live", cash > 0, persistent=False)

    def forward(self, action: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        live = (mask != 0) | self.cash_live
        a = action.to(torch.float64)
        a = torch.where(torch.isnan(a), -1.0, a)  # NaN: no preference (clamp would keep NaN)
        preference = torch.clamp((a + 1.0) * 0.5, 0.0, 1.0)
        v = preference * live.to(torch.float64)
        total = v.sum(dim=-1, keepdim=True)
        wanted = total > 0.0
        weights = torch.where(wanted, v / torch.where(wanted, total, 1.0), self.cash_only)
        return weights.to(torch.float32)


class DeterministicActor(nn.Module):
    """The deterministic action of an SB3 TD3 or SAC actor, in a form ``torch.export`` takes.

    SB3's docs export SAC as ``actor(obs, deterministic=True)``; that builds a
    ``torch.distributions.Normal`` whose argument validation branches on data, which
    ``torch.export`` refuses. The deterministic action is the squashed Gaussian's mode,
    ``tanh(mean)``, computed here directly; parity checks it against the SB3 call.
    """

    def __init__(self, actor: nn.Module, squashed_gaussian: bool) -> None:
        super().__init__()
        self.actor = actor
        self.squashed_gaussian = squashed_gaussian

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.squashed_gaussian:
            mean, _, _ = self.actor.get_action_dist_params(obs)  # type: ignore[operator]
            return torch.tanh(mean)
        return self.actor(obs)


class PolicyGraph(nn.Module):
    """Raw observation and mask -> (action, weights): what ``model.onnx`` computes."""

    def __init__(self, actor: nn.Module, spec: FeatureSpec, stats: NormalizationStats) -> None:
        super().__init__()
        self.normalizer = ObservationNormalizer(spec, stats)
        self.actor = actor
        self.to_weights = ActionToWeights(spec.n_slots)

    def forward(
        self, observation: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        action = self.actor(self.normalizer(observation, mask))
        return action, self.to_weights(action, mask)


class CuriosityGraph(nn.Module):
    """Raw transition and mask -> normalized, clipped intrinsic reward: ``icm.onnx``.

    One mask serves both observations: an episode's assets do not change between steps.
    """

    def __init__(self, net: CuriosityNet, spec: FeatureSpec, stats: NormalizationStats) -> None:
        super().__init__()
        self.normalizer = ObservationNormalizer(spec, stats)
        self.net = net

    def forward(
        self,
        previous_observation: torch.Tensor,
        action: torch.Tensor,
        observation: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        previous = self.normalizer(previous_observation, mask)
        current = self.normalizer(observation, mask)
        return self.net(previous, action, current)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's progress lines and warnings (CLI output stays readable)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def export_graph(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: tuple[str, ...],
    output_names: tuple[str, ...],
    path: Path,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Export ``module`` with a dynamic batch axis (dynamo exporter), one self-contained file.

    ``onnx.checker.check_model(full_check=True)`` must pass; ``metadata`` goes into the
    model's ``metadata_props`` so a server can see what it loaded.
    """
    import onnx

    module = module.eval()
    batch = torch.export.Dim("batch", min=1)
    dynamic = tuple({0: batch} for _ in example)  # positional: forward's names may differ
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(
            module,
            example,
            None,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=dynamic,
            opset_version=ONNX_OPSET,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    if program is None:  # pragma: no cover - dynamo=True always returns a program
        raise ExportError("torch.onnx.export returned no program")
    proto = program.model_proto
    if metadata:
        onnx.helper.set_model_props(proto, metadata)
    onnx.save(proto, str(path))
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"{path.name}: ONNX checker failed: {exc}") from exc
    return path


def graph_opset(path: Path) -> int:
    """The default-domain opset a saved ONNX model imports."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next(int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx"))


# --- loading a run -----------------------------------------------------------------------


@dataclass
class LoadedRun:
    """A run's model, optional curiosity module and the contract they were trained under."""

    run_dir: Path
    manifest: Manifest
    model: BaseAlgorithm
    spec: FeatureSpec
    stats: NormalizationStats
    icm: IntrinsicCuriosity | None

    @property
    def squashed_gaussian(self) -> bool:
        return self.manifest.algorithm == "sac"

    def deterministic_actor(self) -> DeterministicActor:
        return DeterministicActor(self.model.actor, self.squashed_gaussian)  # type: ignore[attr-defined]

    def reference_actor(self) -> ActorFn:
        """The torch reference: SB3's own deterministic actor call on normalized observations."""
        actor = self.model.actor  # type: ignore[attr-defined]

        @torch.no_grad()
        def act(obs: Float32Array) -> Float32Array:
            x = torch.as_tensor(np.asarray(obs, dtype=np.float32))
            out = actor(x, deterministic=True) if self.squashed_gaussian else actor(x)
            return out.numpy().astype(np.float32)

        return act


def _algorithm_class(name: str) -> type[BaseAlgorithm]:
    from allocator.trainer.agents.sac import SmoothSAC
    from allocator.trainer.agents.td3 import SmoothTD3

    classes: dict[str, type[BaseAlgorithm]] = {"td3": SmoothTD3, "sac": SmoothSAC}
    if name not in classes:
        raise ExportError(f"algorithm {name!r} cannot be exported (known: td3, sac)")
    return classes[name]


def _check_normalization_file(run_dir: Path, manifest: Manifest) -> None:
    """The manifest's statistics must be those the run saved (manifest.json has no checksum)."""
    path = run_dir / NORMALIZATION_FILE
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ExportError(f"{path}: not valid JSON: {exc}") from exc
    ours = manifest.normalization
    pair = (saved.get("mean"), saved.get("std")) if isinstance(saved, dict) else None
    if pair != (ours.mean, ours.std):
        raise ExportError(
            f"{run_dir}: manifest normalization (mean {ours.mean}, std {ours.std}) differs from "
            f"the run's {NORMALIZATION_FILE} ({saved}); the manifest was altered"
        )


def load_run(run_dir: str | Path) -> LoadedRun:
    """Read, verify and load a run directory on CPU; every problem raises ``ExportError``."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ExportError(f"{d}: not a run directory (no such directory)")
    try:
        manifest = read_manifest(d)
        verify_checksums(d, manifest)
    except ManifestError as exc:
        raise ExportError(str(exc)) from exc
    _check_normalization_file(d, manifest)
    if not (d / MODEL_FILE).is_file():
        raise ExportError(f"{d / MODEL_FILE}: missing")
    fs = manifest.feature_spec
    spec = FeatureSpec(max_assets=fs.max_assets, window=fs.window, clip=fs.clip)
    stats = NormalizationStats(mean=manifest.normalization.mean, std=manifest.normalization.std)
    cls = _algorithm_class(manifest.algorithm)
    try:
        model = cls.load(d / MODEL_FILE, device="cpu")
    except Exception as exc:
        raise ExportError(
            f"{d / MODEL_FILE}: cannot load the {manifest.algorithm} model: {exc}"
        ) from exc
    model.policy.set_training_mode(False)
    obs_shape = tuple(model.observation_space.shape or ())
    act_space = model.action_space
    if obs_shape != (spec.obs_size,):
        raise ExportError(
            f"{d / MODEL_FILE}: observation shape {obs_shape} does not match the manifest's "
            f"feature spec ({spec.obs_size},)"
        )
    low, high = np.asarray(act_space.low), np.asarray(act_space.high)  # type: ignore[attr-defined]
    if tuple(act_space.shape or ()) != (spec.n_slots,) or not (
        np.all(low == -1.0) and np.all(high == 1.0)
    ):
        raise ExportError(
            f"{d / MODEL_FILE}: action space must be [-1, 1]^{spec.n_slots} (cash + max_assets)"
        )
    icm = None
    if manifest.icm is not None and (d / ICM_FILE).is_file():
        try:
            icm = IntrinsicCuriosity.load(
                d / ICM_FILE, spec.obs_size, spec.n_slots, ICMSettings(**manifest.icm)
            )
        except Exception as exc:
            raise ExportError(f"{d / ICM_FILE}: cannot load the curiosity module: {exc}") from exc
        icm.net.eval()
    return LoadedRun(d, manifest, model, spec, stats, icm)


# --- parity sets -------------------------------------------------------------------------


def random_live_masks(n: int, n_slots: int, rng: np.random.Generator) -> NDArray[np.bool_]:
    """Random live masks (cash live) of every density; every tenth row is cash only."""
    density = rng.uniform(0.0, 1.0, size=(n, 1))
    live = rng.random((n, n_slots)) < density
    live[::10, 1:] = False
    live[:, 0] = True
    return live


def random_raw_observations(
    spec: FeatureSpec,
    n: int,
    rng: np.random.Generator,
    live: NDArray[np.bool_] | None = None,
) -> tuple[Float32Array, Float32Array]:
    """``n`` raw observations and their masks, of realistic scale and beyond.

    Daily log returns are Student-t (3 dof) with a per-row scale from calm (0.5%) to crisis
    (5%) markets, so some normalized features hit the clip; weights are Dirichlet draws of
    varying concentration over the live slots (some rows all cash).
    """
    live = random_live_masks(n, spec.n_slots, rng) if live is None else live
    scale = rng.choice([0.005, 0.01, 0.02, 0.05], size=(n, 1, 1))
    returns = scale * rng.standard_t(3.0, size=(n, spec.max_assets, spec.window))
    concentration = rng.choice([0.1, 1.0, 10.0], size=(n, 1))
    g = rng.gamma(concentration, size=(n, spec.n_slots)) * live
    g[::7, 1:] = 0.0
    g[:, 0] = np.where(g.sum(axis=1) > 0, g[:, 0], 1.0)
    weights = g / g.sum(axis=1, keepdims=True)
    obs = assemble_observation(returns, weights, live, spec)
    return obs, live.astype(np.float32)


@dataclass
class RealTransitions:
    """Raw observations met on a rollout over the training data, and what followed them."""

    observations: Float32Array
    masks: Float32Array
    actions: Float32Array
    next_observations: Float32Array
    max_abs_observation_diff: float
    """Largest gap between ``normalize_observation(raw)`` and the environment's observation."""


def _raw_from_env(env: Any, spec: FeatureSpec) -> Float32Array:
    """The raw observation of the environment's next decision, from its real price window."""
    t, w = env.t, spec.window
    prices = np.full((spec.max_assets, spec.prices_per_asset), np.nan)
    k = len(env.asset_index)
    prices[:k] = env.data.prices[t - w : t + 1, env.asset_index].T
    return build_raw_observation(prices, env.drifted, env.mask, spec)


def real_transitions(loaded: LoadedRun, n: int, seed: int = 0) -> RealTransitions:
    """Roll the deterministic policy over the run's training data, rebuilt from the manifest.

    Raw observations are built from the environment's actual price windows with
    ``build_raw_observation`` (never by inverting the clipped normalization).
    """
    from allocator.trainer.market.data import DataError, load_dataset
    from allocator.trainer.sim.env import EnvConfig, PortfolioEnv

    m = loaded.manifest
    try:
        data = load_dataset(m.data.dataset).between(m.data.train_start, m.data.train_end)
        if m.data.universe and set(m.data.universe) <= set(data.assets):
            data = data.select(m.data.universe)
    except DataError as exc:
        raise ExportError(f"cannot rebuild the training data for the parity check: {exc}") from exc
    spec = loaded.spec
    length = min(252, data.n_dates - 1 - spec.window)
    if length < 1:
        raise ExportError(
            f"{m.data.dataset}: training period too short for a window of {spec.window}"
        )
    config = EnvConfig(
        max_assets=spec.max_assets,
        min_assets=1,
        window=spec.window,
        episode_length=length,
        cost_bps=m.cost_bps,
        beta=m.beta,
        obs_clip=spec.clip,
    )
    env = PortfolioEnv(data, config, stats=loaded.stats)
    actor = loaded.reference_actor()
    obs_list: list[Float32Array] = []
    mask_list: list[Float32Array] = []
    act_list: list[Float32Array] = []
    next_list: list[Float32Array] = []
    worst = 0.0
    env_obs, _ = env.reset(seed=seed)
    raw = _raw_from_env(env, spec)
    while len(obs_list) < n:
        normalized = normalize_observation(raw, spec, loaded.stats)
        worst = max(worst, float(np.max(np.abs(normalized - env_obs))))
        action = actor(normalized[None])[0]
        env_obs, _, terminated, truncated, _ = env.step(action)
        next_raw = _raw_from_env(env, spec)
        obs_list.append(raw)
        mask_list.append(env.mask.astype(np.float32))
        act_list.append(action)
        next_list.append(next_raw)
        if terminated or truncated:
            env_obs, _ = env.reset()
            raw = _raw_from_env(env, spec)
        else:
            raw = next_raw
    return RealTransitions(
        np.stack(obs_list),
        np.stack(mask_list),
        np.stack(act_list),
        np.stack(next_list),
        worst,
    )


# --- parity ------------------------------------------------------------------------------


def onnx_session(path: Path) -> Any:
    """An onnxruntime CPU session (parity is a CPU measurement whatever the server uses)."""
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _max_abs(a: NDArray[Any], b: NDArray[Any]) -> float:
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(np.max(diff)) if diff.size else 0.0


def policy_parity(
    session: Any, loaded: LoadedRun, observations: Float32Array, masks: Float32Array
) -> dict[str, float | int]:
    """ONNX policy vs torch actor on ``normalize_observation``, and the graph's weights vs
    numpy ``action_to_weights`` of the graph's own action.

    The two parts are checked separately on purpose. The network is judged on its action. The
    mapping is judged on the same action: when every live preference is near 0 (actions near
    -1, common on random observations) renormalizing divides by a small sum and multiplies any
    float32 action difference, so a torch-to-ONNX weight comparison would fail a correct graph
    (seen: 1.6e-5 from a 5e-7 action difference). That end-to-end figure is still reported
    (``end_to_end_weight_diff``), not checked.
    """
    action, weights = session.run(
        list(POLICY_OUTPUTS), {"observation": observations, "mask": masks}
    )
    ref_action = loaded.reference_actor()(
        normalize_observation(observations, loaded.spec, loaded.stats)
    )
    return {
        "n": len(observations),
        "max_abs_action_diff": _max_abs(action, ref_action),
        "max_abs_weight_diff": _max_abs(weights, action_to_weights(action, masks)),
        "end_to_end_weight_diff": _max_abs(weights, action_to_weights(ref_action, masks)),
    }


def curiosity_parity(
    session: Any,
    loaded: LoadedRun,
    previous: Float32Array,
    actions: Float32Array,
    current: Float32Array,
    masks: Float32Array,
) -> dict[str, float | int]:
    """ONNX curiosity graph vs ``CuriosityNet.forward`` on numpy-normalized observations."""
    assert loaded.icm is not None
    (reward,) = session.run(
        list(ICM_OUTPUTS),
        {
            "previous_observation": previous,
            "action": actions,
            "observation": current,
            "mask": masks,
        },
    )
    spec, stats = loaded.spec, loaded.stats
    with torch.no_grad():
        ref = loaded.icm.net(
            torch.as_tensor(normalize_observation(previous, spec, stats)),
            torch.as_tensor(actions),
            torch.as_tensor(normalize_observation(current, spec, stats)),
        ).numpy()
    return {"n": len(previous), "max_abs_reward_diff": _max_abs(reward, ref)}


def _diffs(parity: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for key, value in parity.items():
        if isinstance(value, dict):
            yield from _diffs(value, f"{prefix}{key}.")
        elif key.startswith("max_abs_"):
            yield f"{prefix}{key}", float(value)


def check_parity(parity: dict[str, Any], tolerance: float = PARITY_TOLERANCE) -> None:
    """Raise ``ExportError`` naming every difference above ``tolerance`` (or not finite)."""
    bad = [
        f"{key} = {value:.3g}"
        for key, value in _diffs(parity)
        if not (math.isfinite(value) and value <= tolerance)
    ]
    if bad:
        raise ExportError(
            f"ONNX/torch parity above the tolerance {tolerance:g}: {', '.join(bad)}; "
            "nothing was written to the registry"
        )


def format_parity(parity: dict[str, Any]) -> str:
    """One line per measured difference, for the CLI."""
    return "\n".join(f"  {key:<36} {value:.3g}" for key, value in _diffs(parity))


# --- registry ----------------------------------------------------------------------------


def _check_name(kind: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ExportError(
            f"registry {kind} {value!r} must be letters, digits, '_', '.', '-' "
            "and must not start with '.' or '-'"
        )
    return value


def next_version(model_dir: Path) -> str:
    """One more than the largest numeric version in ``model_dir`` ("1" when there is none)."""
    numbers = (
        [int(p.name) for p in model_dir.iterdir() if p.is_dir() and re.fullmatch(r"\d+", p.name)]
        if model_dir.is_dir()
        else []
    )
    return str(max(numbers, default=0) + 1)


def _refuse_existing(target: Path) -> None:
    if target.exists():
        raise ExportError(f"{target}: version already exists; versions are never overwritten")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(files: list[Path], manifest: Manifest, model_dir: Path, version: str) -> Path:
    """Stage ``files`` and the manifest (with their sha256) in ``model_dir``, rename into place.

    A reader sees either no version directory or a complete one; the staging directory is
    removed on any failure.
    """
    model_dir.mkdir(parents=True, exist_ok=True)
    target = model_dir / version
    staging = model_dir / f"{_STAGING_PREFIX}{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        for src in files:
            shutil.copyfile(src, staging / src.name)
            _fsync_path(staging / src.name)
        digests = checksums(staging, [f.name for f in files])
        written = write_manifest(staging, manifest.model_copy(update={"files": digests}))
        # write_manifest's temp file is private (0600); readers of the registry need it too.
        os.chmod(written, stat.S_IMODE((staging / files[0].name).stat().st_mode))
        _fsync_path(staging)
        _refuse_existing(target)
        try:
            os.rename(staging, target)
        except OSError as exc:  # another export took the version first
            raise ExportError(f"{target}: cannot publish: {exc}") from exc
        _fsync_path(model_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


# --- export ------------------------------------------------------------------------------


def _graph_metadata(loaded: LoadedRun, graph: str) -> dict[str, str]:
    m = loaded.manifest
    return {
        "allocator.graph": graph,
        "allocator.algorithm": m.algorithm,
        "allocator.action_mapping": m.action_mapping,
        "allocator.max_assets": str(loaded.spec.max_assets),
        "allocator.window": str(loaded.spec.window),
        "allocator.clip": repr(loaded.spec.clip),
        "allocator.normalization_mean": repr(loaded.stats.mean),
        "allocator.normalization_std": repr(loaded.stats.std),
        "allocator.input": "raw observation (portfolio.build_raw_observation) and mask",
    }


def export_policy(loaded: LoadedRun, path: Path) -> Path:
    """Write ``model.onnx``: raw observation + mask -> (action, weights)."""
    graph = PolicyGraph(loaded.deterministic_actor(), loaded.spec, loaded.stats)
    example = (torch.zeros(4, loaded.spec.obs_size), torch.ones(4, loaded.spec.n_slots))
    return export_graph(
        graph, example, POLICY_INPUTS, POLICY_OUTPUTS, path, _graph_metadata(loaded, "policy")
    )


def export_curiosity(loaded: LoadedRun, path: Path) -> Path:
    """Write ``icm.onnx``: raw (previous, action, current) + mask -> intrinsic reward (B, 1)."""
    assert loaded.icm is not None
    graph = CuriosityGraph(loaded.icm.net, loaded.spec, loaded.stats)
    spec = loaded.spec
    example = (
        torch.zeros(4, spec.obs_size),
        torch.zeros(4, spec.n_slots),
        torch.zeros(4, spec.obs_size),
        torch.ones(4, spec.n_slots),
    )
    return export_graph(
        graph, example, ICM_INPUTS, ICM_OUTPUTS, path, _graph_metadata(loaded, "curiosity")
    )


def measure_parity(
    loaded: LoadedRun,
    model_path: Path,
    icm_path: Path | None,
    n: int = PARITY_SAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Parity of the exported graphs with torch on ``n`` random and ``n`` real observations."""
    rng = np.random.default_rng(seed)
    spec = loaded.spec
    random_obs, random_masks = random_raw_observations(spec, n, rng)
    real = real_transitions(loaded, n, seed=seed)
    policy = onnx_session(model_path)
    parity: dict[str, Any] = {
        "random": policy_parity(policy, loaded, random_obs, random_masks),
        "real": {
            **policy_parity(policy, loaded, real.observations, real.masks),
            "max_abs_observation_diff": real.max_abs_observation_diff,
        },
    }
    if icm_path is not None:
        icm = onnx_session(icm_path)
        live = random_masks > 0
        following, _ = random_raw_observations(spec, n, rng, live=live)
        actions = rng.uniform(-1.0, 1.0, size=(n, spec.n_slots)).astype(np.float32)
        parity["icm"] = {
            "random": curiosity_parity(icm, loaded, random_obs, actions, following, random_masks),
            "real": curiosity_parity(
                icm, loaded, real.observations, real.actions, real.next_observations, real.masks
            ),
        }
    return parity


def export_run(
    run_dir: str | Path,
    registry: str | Path,
    name: str | None = None,
    version: str | None = None,
    *,
    tolerance: float = PARITY_TOLERANCE,
    n_parity: int = PARITY_SAMPLES,
    seed: int = 0,
) -> Path:
    """Export a run to ``registry/NAME/VERSION`` and return that directory.

    NAME defaults to the manifest's name, VERSION to the next integer. Raises ``ExportError``
    (and writes nothing to the registry) when the run cannot be loaded, the version exists, or
    ONNX and torch differ by more than ``tolerance``.
    """
    loaded = load_run(run_dir)
    name = _check_name("name", name or loaded.manifest.name)
    model_dir = Path(registry) / name
    version = _check_name("version", next_version(model_dir) if version is None else str(version))
    _refuse_existing(model_dir / version)

    with tempfile.TemporaryDirectory(prefix="allocator-export-") as tmp:
        work = Path(tmp)
        model_path = export_policy(loaded, work / MODEL_ONNX)
        icm_path = export_curiosity(loaded, work / ICM_ONNX) if loaded.icm is not None else None
        parity = measure_parity(loaded, model_path, icm_path, n=n_parity, seed=seed)
        check_parity(parity, tolerance)
        export_info = {
            "parity": {"tolerance": tolerance, **parity},
            "opset": graph_opset(model_path),
            "exported_at": dt.datetime.now(dt.UTC).isoformat(),
            "source_run": str(Path(run_dir).resolve()),
            "source_files": dict(loaded.manifest.files),
            "registry_name": name,
            "registry_version": version,
            "graphs": {
                MODEL_ONNX: {"inputs": list(POLICY_INPUTS), "outputs": list(POLICY_OUTPUTS)},
                **(
                    {ICM_ONNX: {"inputs": list(ICM_INPUTS), "outputs": list(ICM_OUTPUTS)}}
                    if icm_path is not None
                    else {}
                ),
            },
            "library_versions": library_versions(),
        }
        manifest = loaded.manifest.model_copy(update={"name": name, "export": export_info})
        files = [model_path] + ([icm_path] if icm_path is not None else [])
        return publish(files, manifest, model_dir, version)
