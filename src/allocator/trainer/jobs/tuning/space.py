"""The search space: dotted trainer keys mapped to Optuna distributions, checked against the base
config before any trial trains (``FIXED`` keys would change what a trial is scored on)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from pydantic import Field, model_validator

from allocator.trainer.training.config import UNION_TAGS, TrainConfig
from allocator.typed_config import ConfigError, StrictModel, validate

FIXED: dict[str, str] = {
    "data": "trials see only the base config's training span; tune another span with another "
    "base config",
    "selection.enabled": "every trial selects on the inner span: it is how a trial is scored",
    "selection.metric": "it is the objective; compare trials on one figure",
    "selection.inner_fraction": "it moves the span the objective is measured on",
    "selection.inner_days": "it moves the span the objective is measured on",
    "selection.purge_days": "it moves the span the objective is measured on",
    "env.cost_bps": "the inner backtest's costs: changing them changes what the objective means",
    "name": "set by the tuner for every trial",
    "output_dir": "set by the tuner for every trial",
    "progress_bar": "set by the tuner for every trial",
    "tensorboard": "set by the tuner for every trial",
    "html_report": "set by the tuner for every trial",
    "torch_threads": "set by the tuner for every trial (the study's torch_threads)",
    "device": "where a trial runs, not what it learns",
    "checkpoint_every": "trials are not resumed: they write no checkpoints",
    "validation_episodes": "trials never backtest the validation span",
}
"""Keys a search space may not touch, and why: a trial's score must stay comparable."""

PRIMITIVE = (str, int, float, bool, type(None))  # stored as they are; others as JSON text


class ParamSpec(StrictModel):
    """One key's distribution: ``low``/``high`` (with ``log`` or ``step``) or ``choices``."""

    low: int | float | None = None
    high: int | float | None = None
    log: bool = Field(False, description="draw uniformly in log space (low > 0)")
    step: int | float | None = Field(None, gt=0, description="draw on this grid from low")
    choices: list[Any] | None = Field(None, min_length=1, description="values to choose from")

    @model_validator(mode="after")
    def _one_kind(self) -> ParamSpec:
        bounded = self.low is not None or self.high is not None
        if self.choices is not None:
            if bounded or self.log or self.step is not None:
                raise ValueError("give either choices or low/high (log, step), not both")
            labels = [label(c) for c in self.choices]
            if len(set(labels)) != len(labels):
                raise ValueError(f"choices repeat a value: {self.choices}")
            return self
        if self.low is None or self.high is None:
            raise ValueError("a range needs both low and high (or give choices)")
        if not self.low < self.high:
            raise ValueError(f"need low < high (got {self.low}, {self.high})")
        if self.log and self.step is not None:
            raise ValueError("log and step cannot be combined")
        if self.log and self.low <= 0:
            raise ValueError(f"log needs low > 0 (got {self.low})")
        return self

    @property
    def bounds(self) -> tuple[int | float, int | float]:
        """``(low, high)`` of a range (a spec with choices has none)."""
        if self.low is None or self.high is None:
            raise ValueError("a spec with choices has no bounds")
        return self.low, self.high


def label(choice: Any) -> Any:
    """The value Optuna stores for a choice: itself if primitive, else its JSON text."""
    return choice if isinstance(choice, PRIMITIVE) else json.dumps(choice, default=str)


def lookup(tree: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """Whether ``key`` (dotted) is in ``tree``, and its value there."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def with_values(tree: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``tree`` with each dotted key of ``values`` set (whole sub-trees replaced)."""
    out = copy.deepcopy(dict(tree))
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node[part]
        node[leaf] = copy.deepcopy(value)
    return out


def tuned_config(base: TrainConfig, values: Mapping[str, Any]) -> TrainConfig:
    """``base`` with ``values`` set and selection on: what a trial trains and best.yaml holds."""
    tree = with_values(base.model_dump(mode="json"), {**values, "selection.enabled": True})
    return validate(TrainConfig, tree, "(tuned trainer config)", tags=UNION_TAGS)


@dataclass(frozen=True)
class Param:
    """One checked key of the space: its distribution and whether it draws integers."""

    key: str
    spec: ParamSpec
    integer: bool

    def suggest(self, trial: optuna.Trial) -> Any:
        """The trial's value for this key, as the trainer takes it."""
        s = self.spec
        if s.choices is not None:
            chosen = trial.suggest_categorical(self.key, [label(c) for c in s.choices])
            return self.decode(chosen)
        low, high = s.bounds
        if self.integer:
            step = int(s.step) if s.step is not None else 1
            return trial.suggest_int(self.key, int(low), int(high), step=step, log=s.log)
        return trial.suggest_float(self.key, float(low), float(high), step=s.step, log=s.log)

    def decode(self, stored: Any) -> Any:
        """The trainer value of what Optuna stored (a choice's JSON text back to the choice)."""
        if self.spec.choices is None:
            return stored
        return next(c for c in self.spec.choices if label(c) == stored)

    def contains(self, value: Any) -> bool:
        s = self.spec
        if s.choices is not None:
            return any(label(c) == label(value) for c in s.choices)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        low, high = s.bounds
        return low <= value <= high


@dataclass(frozen=True)
class SearchSpace:
    """The checked keys, in the order they are drawn, and the base config's own values as
    Optuna stores them (trial 0 when ``enqueue_base``)."""

    params: tuple[Param, ...]
    base_params: dict[str, Any]

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Every key's value for ``trial``, as the trainer takes them."""
        return {p.key: p.suggest(trial) for p in self.params}

    def decode(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """Trainer values of a finished trial's stored params."""
        return {p.key: p.decode(stored[p.key]) for p in self.params if p.key in stored}


def fixed_reason(key: str) -> str | None:
    """Why ``key`` may not be searched, or None when it may."""
    for fixed, why in FIXED.items():
        if key == fixed or key.startswith(f"{fixed}.") or fixed.startswith(f"{key}."):
            return f"{fixed} is fixed: {why}"
    return None


def is_integer_key(base: Any, spec: ParamSpec) -> bool:
    """Ranges over an int key draw ints; a key whose base value is None follows its bounds."""
    if isinstance(base, bool):
        return False
    if isinstance(base, int):
        return True
    bounds = [b for b in (spec.low, spec.high, spec.step) if b is not None]
    return base is None and all(isinstance(b, int) for b in bounds)


def key_problems(key: str, spec: ParamSpec, tree: dict[str, Any], source: str) -> list[str]:
    """What is wrong with one key of the space against the base config's tree."""
    why = fixed_reason(key)
    if why is not None:
        return [why]
    found, base = lookup(tree, key)
    if not found:
        return ["not a key of the trainer config (see its config.yaml for every key)"]
    if spec.choices is None:
        if isinstance(base, bool | dict | list | str):
            return [f"a {type(base).__name__} key takes choices, not low/high"]
        bounds = [b for b in (spec.low, spec.high, spec.step) if b is not None]
        if isinstance(base, int) and not all(float(b).is_integer() for b in bounds):
            return [f"an integer key needs integer low/high/step (got {bounds})"]
    candidates = spec.choices if spec.choices is not None else [spec.low, spec.high]
    problems = []
    for value in candidates:
        try:
            validate(TrainConfig, with_values(tree, {key: value}), source, tags=UNION_TAGS)
        except ConfigError as exc:
            detail = "; ".join(line.strip() for line in str(exc).splitlines()[1:])
            problems.append(f"{value!r} makes an invalid trainer config: {detail}")
    return problems


def check_space(
    space: Mapping[str, ParamSpec], base: TrainConfig, source: str, *, enqueue_base: bool
) -> SearchSpace:
    """The checked space, or a ``ConfigError`` listing every bad key as ``space.<key>``."""
    tree = base.model_dump(mode="json")
    problems: list[str] = []
    for key, spec in space.items():
        problems += [f"space.{key}: {p}" for p in key_problems(key, spec, tree, source)]
        problems += [
            f"space.{key}: overlaps space.{other} (one sets part of the other)"
            for other in space
            if other.startswith(f"{key}.")
        ]
    if problems:
        raise ConfigError("\n  ".join([f"{source}: invalid search space", *problems]))
    params = tuple(
        Param(key, spec, spec.choices is None and is_integer_key(lookup(tree, key)[1], spec))
        for key, spec in space.items()
    )
    base_values = {p.key: lookup(tree, p.key)[1] for p in params}
    if enqueue_base:
        outside = [
            f"space.{p.key}: the base config's {base_values[p.key]!r} lies outside it"
            for p in params
            if not p.contains(base_values[p.key])
        ]
        if outside:
            head = f"{source}: enqueue_base trains the base config's values first"
            tail = "(widen the space, or set enqueue_base: false)"
            raise ConfigError("\n  ".join([head, *outside, tail]))
    return SearchSpace(params, {key: label(value) for key, value in base_values.items()})
