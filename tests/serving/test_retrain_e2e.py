"""End to end: retrain -> promote -> a running server switches version with no failed call.

A server runs in-process on a registry whose only model came from a first retrain, under paced
client load (unpinned, and pinned to the first version). Then, while calls flow:

1. a retrain whose candidate fails a gate: the server never loads it and keeps answering with
   the production version;
2. ``allocator retrain`` in a subprocess, as the CronJob runs it: the candidate passes, the
   production pointer moves, and unpinned calls switch to it on the next registry scan.

No call fails at any point, every answer is recorded under the version that gave it, and the
promotions table holds the three decisions.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from allocator.recording.migrations import upgrade
from allocator.registry.pointer import read_production_pointer
from allocator.registry.versions import CANDIDATES_DIR
from allocator.serving.server import ServerConfig, build_server
from allocator.trainer.jobs.retrain.config import load_retrain_config
from allocator.trainer.jobs.retrain.runner import retrain
from tests.serving.load import LoadThread, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO_ROOT / "configs" / "retrain_tiny.yaml"
WINDOW = 10  # configs/retrain_tiny.yaml: trainer.env.window


def runs(versions: list[str]) -> list[tuple[str, int]]:
    """Run-length encoding: ``["a", "a", "b"]`` -> ``[("a", 2), ("b", 1)]``."""
    out: list[tuple[str, int]] = []
    for v in versions:
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out


def recorded(path: Path) -> dict[str, str]:
    """request id -> model version of every recorded decision."""
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT d.request_id, m.version FROM decisions d "
            "JOIN model_versions m ON m.id = d.model_version_id"
        ).fetchall()
    return dict(rows)


def decisions_made(path: Path) -> list[tuple[str, str | None, int]]:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT candidate_version, production_version, promoted FROM promotions ORDER BY id"
        ).fetchall()


def test_retrain_promotes_and_the_running_server_switches_without_a_failed_call(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "models"
    db_path = tmp_path / "trades.sqlite"
    url = f"sqlite:///{db_path}"
    upgrade(url)
    overrides = [
        f"registry={registry}",
        f"database_url={url}",
        f"trainer.output_dir={tmp_path / 'runs'}",
    ]
    first = retrain(load_retrain_config(TINY_CONFIG, overrides))
    assert first.promoted
    v1 = first.candidate_version

    server = build_server(
        ServerConfig(
            registry=registry,
            port=0,
            metrics_port=None,
            reload_interval=0.2,
            database_url=url,
            spool_dir=tmp_path / "spool",
            prefer_cuda=False,
        )
    ).start()
    unpinned = LoadThread(server.target, "e2e-unpinned", window=WINDOW, rate=100, seed=1)
    pinned = LoadThread(
        server.target, "e2e-pinned", window=WINDOW, rate=30, model="tiny", version=v1, seed=2
    )
    loaders = [unpinned, pinned]

    def answered(version: str, since: int = 0) -> int:
        return sum(o.version == version for o in unpinned.outcomes[since:])

    try:
        for loader in loaders:
            loader.start()
        wait_until(lambda: answered(v1) >= 30, 30, f"30 calls answered by {v1}")

        # 1. A rejected candidate: exported, judged, never visible to the server.
        rejected = retrain(
            load_retrain_config(TINY_CONFIG, [*overrides, "gates.max_turnover=0.0001"])
        )
        assert not rejected.promoted
        after_rejection = len(unpinned.outcomes)
        wait_until(
            lambda: len(unpinned.outcomes) >= after_rejection + 50, 30, "50 calls after rejection"
        )
        assert set(server.registry.snapshot.models) == {("tiny", v1)}
        assert not server.registry.snapshot.refused

        # 2. The CronJob's command: promotes; the server follows the pointer on its next scan.
        job = subprocess.run(
            [
                sys.executable,
                "-m",
                "allocator.cli",
                "retrain",
                "--config",
                str(TINY_CONFIG),
                *[arg for o in [*overrides, "trainer.seed=1"] for arg in ("--set", o)],
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert job.returncode == 0, job.stdout + job.stderr
        pointer = read_production_pointer(registry, "tiny")
        assert pointer is not None
        v2 = pointer["version"]
        assert f"PROMOTED: tiny/{v2} (production before: {v1})" in job.stdout
        promoted_at = len(unpinned.outcomes)
        wait_until(lambda: answered(v2) >= 100, 30, f"100 calls answered by {v2}")
        snapshot = server.registry.snapshot
    finally:
        for loader in loaders:
            loader.stop()
        for loader in loaders:
            loader.join(30)
        server.stop()

    for loader in loaders:
        assert loader.error is None, loader.error
        failed = [o for o in loader.outcomes if not o.ok]
        assert not failed, f"{loader.name}: {len(failed)} failed calls, first {failed[0]}"

    # Unpinned calls: the first version, then the promoted one, once, never back.
    versions = unpinned.versions()
    assert [v for v, _ in runs(versions)] == [v1, v2], runs(versions)
    assert runs(versions)[0][1] >= after_rejection  # the rejection changed nothing
    assert runs(versions)[0][1] <= promoted_at + 300  # switched within seconds, not minutes
    # Pinned calls: the old version stays loaded beside the new one and kept answering.
    assert set(pinned.versions()) == {v1}
    assert set(snapshot.models) == {("tiny", v1), ("tiny", v2)}
    assert snapshot.defaults["tiny"] == v2
    assert (registry / CANDIDATES_DIR / "tiny" / rejected.candidate_version).is_dir()

    # Every answer recorded under the version that gave it; the decisions with their reasons.
    answers = {o.request_ids[0]: o.version for loader in loaders for o in loader.outcomes}
    assert recorded(db_path) == answers
    assert decisions_made(db_path) == [
        (v1, None, 1),
        (rejected.candidate_version, v1, 0),
        (v2, v1, 1),
    ]
