"""A run's identity, ``walk_forward.json``: what ``--resume`` reads.

Written before any window trains and on every resume: the resolved config, the label, the run
row and database, the plan cut from the data, and one entry per session."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from allocator.artifacts.files import atomic_write_text
from allocator.trainer.jobs.json_safe import json_safe
from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig, WalkForwardError
from allocator.trainer.jobs.walk_forward.progress import utc_now
from allocator.trainer.jobs.walk_forward.window import WindowJob
from allocator.trainer.market.store import shown

STATE_FILE = "walk_forward.json"
FORMAT = 1


class ResumeError(WalkForwardError):
    """A run directory that cannot be resumed as asked (nothing was changed)."""


def plan_payload(jobs: Sequence[WindowJob]) -> dict[str, Any]:
    """What the config cut from the data: the registry, the dataset, the windows."""
    return {
        "registry": jobs[0].registry if jobs else None,
        "dataset": jobs[0].trainer.data.dataset if jobs else None,
        "windows": [j.window.to_dict() for j in jobs],
    }


@dataclass
class RunState:
    """The contents of ``walk_forward.json``."""

    label: str
    name: str
    config: dict[str, Any]
    run_id: int | None
    database: str | None
    plan: dict[str, Any]
    sessions: list[dict[str, Any]] = field(default_factory=list)
    format: int = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunState:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


def new_state(
    config: WalkForwardConfig,
    label: str,
    jobs: Sequence[WindowJob],
    run_id: int | None,
    url: str | None,
) -> RunState:
    """The state of a run that starts now."""
    return RunState(
        label=label,
        name=f"{config.name}-{label}",
        config=config.model_dump(mode="json"),
        run_id=run_id,
        database=shown(url) if url else None,
        plan=plan_payload(jobs),
        sessions=[{"started": utc_now(), "resumed": False}],
    )


def write_state(out_dir: str | Path, state: RunState) -> Path:
    """``walk_forward.json`` in the run directory, replaced atomically."""
    return atomic_write_text(
        Path(out_dir) / STATE_FILE, json.dumps(state.to_dict(), indent=2) + "\n"
    )


def read_state(out_dir: str | Path) -> RunState:
    """A run directory's state; refused naming what is missing."""
    path = Path(out_dir) / STATE_FILE
    if not path.is_file():
        raise ResumeError(
            f"{out_dir} has no {STATE_FILE}: not a walk-forward run directory, or one made "
            "before runs could be resumed"
        )
    try:
        raw = json.loads(path.read_text())
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT}")
        return RunState.from_dict(raw)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ResumeError(f"{path}: not a readable walk-forward state: {exc}") from exc
