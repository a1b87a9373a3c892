"""A walk-forward that survives its process: ``--resume`` keeps finished windows (no
retraining), reruns the rest and ends with a clean run's figures, after a failure, a kill or
SIGTERM; ``allocator walk-forward status``; configs that would compute something else are
refused. The progress files' own tests are in ``test_walk_forward_progress``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.pool import NullPool

from allocator.cli import main
from allocator.trainer.jobs.walk_forward.config import (
    RESUME_FREE,
    WalkForwardError,
    config_differences,
    load_walk_forward_config,
)
from allocator.trainer.jobs.walk_forward.progress import (
    PROGRESS_FILE,
    read_progress,
    write_progress,
)
from allocator.trainer.jobs.walk_forward.rundir import (
    STATE_FILE,
    WalkForwardResult,
    read_returns,
    read_state,
    read_window_result,
    window_file,
)
from allocator.trainer.jobs.walk_forward.runner import resume_walk_forward as resume
from allocator.trainer.jobs.walk_forward.runner import run_walk_forward
from allocator.trainer.training.run_dir import MODEL_FILE
from tests.trainer.jobs.helpers import (
    TINY,
    as_json,
    migrated_sqlite,
    remigrate,
    rows,
    tiny,
)

MODEL = "allocator-wf-tiny"
TOTAL = 300  # trainer.total_timesteps of the tiny config


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary without what differs by design between two runs: label (in the versions),
    wall time, executor, the resume trail."""
    out = {k: v for k, v in summary.items() if k not in {"seconds", "executor", "resumed"}}
    out["per_window"] = [{**r, "version": None} for r in summary["per_window"]]
    return out


def fingerprint(out: Path, registry: Path, label: str, window: str) -> dict[str, Any]:
    """What retraining or re-exporting a window would change: its model's file identity and
    times, its exported version's manifest, its result file."""
    model = out / "runs" / window / MODEL_FILE
    version = registry / MODEL / f"wf-{label}-{window}" / "manifest.json"
    return {
        "model": (model.stat().st_ino, model.stat().st_mtime_ns),
        "version": (version.stat().st_mtime_ns, version.read_text()),
        "result": window_file(out, window).stat().st_mtime_ns,
    }


def assert_same_figures(resumed: WalkForwardResult, clean: WalkForwardResult) -> None:
    assert figures(resumed.summary) == figures(clean.summary)
    for a, b in zip(resumed.windows, clean.windows, strict=True):
        assert a.window == b.window
        assert a.metrics() == b.metrics()
        assert a.baseline_metrics() == b.baseline_metrics()
        pd.testing.assert_frame_equal(a.agent.raw_weights, b.agent.raw_weights)
    pd.testing.assert_frame_equal(
        read_returns(resumed.files["returns"]), read_returns(clean.files["returns"])
    )


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> WalkForwardResult:
    """The tiny walk-forward run once, uninterrupted, unrecorded: what a resume must equal."""
    tmp = tmp_path_factory.mktemp("walk-forward-clean")
    return run_walk_forward(tiny(tmp, "record=false"), label="C", progress=False)


# --- a window that raises, then --resume ---------------------------------------------------


def test_a_run_that_failed_in_window_2_resumes_without_retraining_window_1(
    tmp_path: Path, clean: WalkForwardResult, postgres_database: str
) -> None:
    """Window 2 cannot publish (its version name is taken in the registry): the run fails
    after window 1 was kept. Once the name is free, --resume keeps window 1 as it was (not
    trained, exported or judged again), trains window 2, and reopens the same run row."""
    url = remigrate(postgres_database)
    out, registry = tmp_path / "run", tmp_path / "models"
    taken = registry / MODEL / "wf-L-w01"
    taken.mkdir(parents=True)
    config = tiny(tmp_path, f"database_url={url}")
    with pytest.raises(WalkForwardError, match="registry versions are never overwritten"):
        run_walk_forward(config, out_dir=out, label="L", progress=False)
    (run,) = rows(url, "SELECT * FROM walk_forward_runs")
    assert run["finished"] is not None
    assert run["summary"]["windows_done"] == 1
    assert "wf-L-w01" in run["summary"]["error"]
    assert [w["index"] for w in rows(url, "SELECT * FROM walk_forward_windows")] == [0]
    assert window_file(out, "w00").is_file()
    assert not window_file(out, "w01").exists()
    assert not (out / "runs" / "w01").exists()  # refused before any training
    before = fingerprint(out, registry, "L", "w00")

    status = CliRunner().invoke(main, ["walk-forward", "status", str(out)])
    assert status.exit_code == 0, status.output
    assert "wf_tiny-L: 1 of 2 windows done" in status.output
    assert f"(run row {run['id']} in " in status.output
    assert "w00  done      sharpe" in status.output
    assert "w01  waiting" in status.output
    assert "the run failed" in status.output
    assert f"allocator walk-forward --resume {out}" in status.output

    taken.rmdir()
    resumed = resume(out, progress=False)
    assert fingerprint(out, registry, "L", "w00") == before
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["w00", "w01"]
    assert sorted(p.name for p in (registry / MODEL).iterdir()) == ["wf-L-w00", "wf-L-w01"]
    assert [w.version for w in resumed.windows] == ["wf-L-w00", "wf-L-w01"]
    assert_same_figures(resumed, clean)

    # The same run row, running again then closed with the summary over both windows.
    (again,) = rows(url, "SELECT * FROM walk_forward_runs")
    assert again["id"] == run["id"] == resumed.run_id
    assert again["finished"] > run["finished"]
    assert again["summary"]["windows"] == 2
    (trail,) = again["summary"]["resumed"]
    assert trail["kept"] == ["w00"]
    assert trail["rerun"] == ["w01"]
    assert "never overwritten" in trail["previous"]["error"]
    windows = rows(url, 'SELECT * FROM walk_forward_windows ORDER BY "index"')
    assert [w["index"] for w in windows] == [0, 1]
    for w, result in zip(windows, resumed.windows, strict=True):
        assert w["metrics"]["sharpe"] == pytest.approx(result.metrics()["sharpe"])
    assert len(rows(url, "SELECT * FROM model_versions")) == 2

    # Each window's progress file reached the end of training and carries its figures.
    for result, row in zip(resumed.windows, resumed.summary["per_window"], strict=True):
        progress = read_progress(result.run_dir)
        assert progress is not None
        assert (progress["steps"], progress["total"], progress["phase"]) == (TOTAL, TOTAL, "done")
        assert progress["episodes"] >= 1
        assert progress["reward"] is not None
        assert progress["sharpe"] == pytest.approx(row["sharpe"])
    assert [s["outcome"] for s in read_state(out).sessions] == ["failed", "finished"]


def test_a_window_whose_row_was_lost_is_recorded_from_its_file(
    tmp_path: Path, clean: WalkForwardResult
) -> None:
    """The database refuses window 2's row (a trigger stands in for an outage): its result
    file was already written, so --resume records it from the file, training nothing."""
    url = migrated_sqlite(tmp_path)
    out, registry = tmp_path / "run", tmp_path / "models"
    refuse = (
        'CREATE TRIGGER refuse_w01 BEFORE INSERT ON walk_forward_windows WHEN NEW."index" = 1 '
        "BEGIN SELECT RAISE(ABORT, 'database went away'); END"
    )
    engine = sa.create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text(refuse))
    config = tiny(tmp_path, f"database_url={url}")
    with pytest.raises(sa.exc.DBAPIError, match="database went away"):
        run_walk_forward(config, out_dir=out, label="L", progress=False)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TRIGGER refuse_w01"))
    engine.dispose()
    before = {w: fingerprint(out, registry, "L", w) for w in ("w00", "w01")}
    assert [w["index"] for w in rows(url, "SELECT * FROM walk_forward_windows")] == [0]

    out_cli = CliRunner().invoke(main, ["walk-forward", "--resume", str(out), "--no-progress"])
    assert out_cli.exit_code == 0, out_cli.output
    assert "2 windows in" in out_cli.output
    assert {w: fingerprint(out, registry, "L", w) for w in ("w00", "w01")} == before
    windows = rows(url, 'SELECT * FROM walk_forward_windows ORDER BY "index"')
    assert [w["index"] for w in windows] == [0, 1]
    (run,) = rows(url, "SELECT * FROM walk_forward_runs")
    assert as_json(run["summary"])["resumed"][0]["kept"] == ["w00", "w01"]

    def same(path: Path | str) -> tuple[dict[str, Any], list[float]]:
        payload = json.loads(Path(path).read_text())
        skip = {"seconds", "executor", "resumed"}
        summary = {k: v for k, v in payload["summary"].items() if k not in skip}
        return summary, [w["sharpe"] for w in payload["windows"]]

    assert same(out / "summary.json") == same(clean.files["summary"])


# --- a process killed mid-window, then --resume --------------------------------------------


def wait_for_training(progress_dir: Path, proc: subprocess.Popen[bytes], limit: float) -> dict:
    """Window 2's progress once it is part-way through training; the process is left stopped
    (SIGSTOP), so what it wrote last is what the caller gets."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the walk-forward exited ({proc.returncode}) before window 2 trained")
        progress = read_progress(progress_dir)
        if progress and progress["phase"] == "training" and 0 < progress["steps"] < TOTAL:
            # Freeze the writer before taking its last word: between this read and a kill
            # it could write the next progress (the file is replaced atomically, so the read
            # after SIGSTOP is whole and final).
            os.kill(proc.pid, signal.SIGSTOP)
            return read_progress(progress_dir) or progress
        time.sleep(0.02)
    pytest.fail("window 2 did not start training in time")


def test_a_killed_run_resumes_from_its_finished_windows(
    tmp_path: Path, clean: WalkForwardResult
) -> None:
    """``allocator walk-forward`` in a subprocess, SIGKILLed while window 2 trains: status
    says so, and --resume keeps window 1, trains window 2 again from scratch and ends with
    the clean run's figures."""
    url = migrated_sqlite(tmp_path)
    out, registry = tmp_path / "run", tmp_path / "models"
    command = [sys.executable, "-m", "allocator.cli", "walk-forward", "--config", str(TINY),
               "--set", f"registry={registry}", "--set", f"database_url={url}",
               "--set", "progress_every=20", "--out", str(out), "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        killed_at = wait_for_training(out / "runs" / "w01", proc, limit=240)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed_at["total"] == TOTAL
    label = read_state(out).label
    before = fingerprint(out, registry, label, "w00")
    (run,) = rows(url, "SELECT * FROM walk_forward_runs")
    assert run["finished"] is None  # killed: nobody closed the row

    status = CliRunner().invoke(main, ["walk-forward", "status", str(out)])
    assert status.exit_code == 0, status.output
    assert "1 of 2 windows done, 1 stopped" in status.output
    assert f"w01  stopped   {killed_at['steps']}/{TOTAL} steps" in status.output
    assert "its process is gone" in status.output
    assert f"--resume {out}" in status.output

    resumed = resume(out, progress=False)
    assert fingerprint(out, registry, label, "w00") == before
    w01 = read_progress(out / "runs" / "w01")
    assert w01 is not None
    assert w01["steps"] == TOTAL
    assert w01["pid"] == os.getpid()  # trained again, by the resume
    assert_same_figures(resumed, clean)
    (again,) = rows(url, "SELECT * FROM walk_forward_runs")
    assert again["id"] == run["id"]
    assert again["finished"] is not None
    assert as_json(again["summary"])["resumed"][0]["previous"] is None


def test_a_run_stopped_by_sigterm_ends_its_worker_and_resumes(
    tmp_path: Path, clean: WalkForwardResult
) -> None:
    """SIGTERM (a scheduler's stop; ``nohup`` jobs ignore Ctrl-C) while window 2 trains in a
    worker process: the command exits 143 naming ``--resume``, ends the worker, closes the run's
    row, status says the run was stopped, and --resume ends with the clean run's figures."""
    url = migrated_sqlite(tmp_path)
    out, registry = tmp_path / "run", tmp_path / "models"
    command = [sys.executable, "-m", "allocator.cli", "walk-forward", "--config", str(TINY),
               "--set", f"registry={registry}", "--set", f"database_url={url}",
               "--set", "progress_every=20", "--set", "executor=processes",
               "--set", "workers=1", "--out", str(out), "--no-progress"]  # fmt: skip
    with (tmp_path / "stderr.txt").open("wb") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            at = wait_for_training(out / "runs" / "w01", proc, limit=240)  # the parent stopped
            os.kill(proc.pid, signal.SIGTERM)
            os.kill(proc.pid, signal.SIGCONT)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = (tmp_path / "stderr.txt").read_text()
    assert code == 128 + signal.SIGTERM, err
    assert "walk-forward stopped (stopped by signal SIGTERM)" in err
    assert f"--resume {out}" in err
    worker = int(at["pid"])
    assert worker != proc.pid  # window 2 trained in a worker process, which is gone
    deadline = time.monotonic() + 10
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{worker}").exists()
    assert read_state(out).sessions[-1]["outcome"] == "stopped"
    (run,) = rows(url, "SELECT * FROM walk_forward_runs")
    assert run["finished"] is not None
    assert "SIGTERM" in as_json(run["summary"])["error"]

    status = CliRunner().invoke(main, ["walk-forward", "status", str(out)])
    assert status.exit_code == 0, status.output
    assert "the run was stopped" in status.output
    assert f"--resume {out}" in status.output
    assert_same_figures(resume(out, progress=False), clean)


# --- refusals --------------------------------------------------------------------------------


def test_a_resume_with_another_config_is_refused_naming_the_key(
    clean: WalkForwardResult,
) -> None:
    out = str(clean.out_dir)
    state = (clean.out_dir / STATE_FILE).read_text()
    changed = CliRunner().invoke(
        main, ["walk-forward", "--resume", out, "--set", "trainer.total_timesteps=400"]
    )
    assert changed.exit_code == 2
    assert "the config differs from the run's at trainer.total_timesteps (run: 300, now: 400)" in (
        changed.output
    )
    assert "only executor, progress_every, ray_address, retries," in changed.output
    other = CliRunner().invoke(
        main, ["walk-forward", "--resume", out, "--config", str(TINY), "--set", "seed=3"]
    )
    assert other.exit_code == 2
    assert "seed (run: 0, now: 3)" in other.output
    assert "registry (run: " in other.output  # the tiny file's registry, not the run's
    assert (clean.out_dir / STATE_FILE).read_text() == state  # nothing was touched


def test_a_run_still_in_progress_is_not_resumed_beside_itself(clean: WalkForwardResult) -> None:
    """A window whose progress file was last written by a live process of this machine."""
    run_dir = clean.out_dir / "runs" / "w01"
    kept = (run_dir / PROGRESS_FILE).read_text()
    state = (clean.out_dir / STATE_FILE).read_text()
    try:
        write_progress(run_dir, "w01", "training", steps=10, total=TOTAL)
        with pytest.raises(
            WalkForwardError, match=f"still being worked on by process {os.getpid()}"
        ):
            resume(clean.out_dir, progress=False)
    finally:
        (run_dir / PROGRESS_FILE).write_text(kept)
    assert (clean.out_dir / STATE_FILE).read_text() == state


def test_only_how_windows_run_may_change_on_a_resume() -> None:
    run = load_walk_forward_config(TINY).model_dump(mode="json")
    now = {
        **run,
        "executor": "ray",
        "ray_address": "10.0.0.1:6379",
        "workers": 3,
        "retries": 4,
        "retry_exceptions": True,
        "progress_every": 7,
        "trainer_source": None,
    }
    assert {k for k in now if now[k] != run[k]} <= RESUME_FREE
    assert config_differences(run, now) == []
    now["trainer"] = {**run["trainer"], "seed": 11}
    now["windows"] = {**run["windows"], "purge_days": 1}
    assert config_differences(run, now) == [
        ("trainer.seed", run["trainer"]["seed"], 11),
        ("windows.purge_days", 5, 1),
    ]


def test_resume_refuses_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    out = CliRunner().invoke(main, ["walk-forward", "--resume", str(tmp_path)])
    assert out.exit_code == 2
    assert f"{tmp_path} has no {STATE_FILE}: not a walk-forward run directory" in out.output
    both = CliRunner().invoke(
        main, ["walk-forward", "--resume", str(tmp_path), "--out", str(tmp_path / "x")]
    )
    assert both.exit_code == 2
    assert "leave out --out" in both.output
    status = CliRunner().invoke(main, ["walk-forward", "status", str(tmp_path)])
    assert status.exit_code == 2
    assert f"has no {STATE_FILE}" in status.output


def test_a_window_file_reads_back_exactly(clean: WalkForwardResult) -> None:
    for result in clean.windows:
        back = read_window_result(window_file(clean.out_dir, result.window.label))
        assert back.window == result.window
        assert back.manifest == result.manifest
        pairs = [(result.agent, back.agent)]
        pairs += [(result.baselines[n], back.baselines[n]) for n in result.baselines]
        for a, b in pairs:
            pd.testing.assert_series_equal(a.nav, b.nav, check_exact=True)
            pd.testing.assert_frame_equal(a.executed_weights, b.executed_weights, check_exact=True)
            pd.testing.assert_series_equal(a.turnover, b.turnover, check_exact=True)
            assert a.settings == b.settings
        pd.testing.assert_frame_equal(result.daily_returns(), back.daily_returns())
    damaged = window_file(clean.out_dir, "w00").read_text()[:-10]
    path = clean.out_dir / "damaged.json"
    path.write_text(damaged)
    with pytest.raises(WalkForwardError, match="not a readable window result"):
        read_window_result(path)


# --- retries of a killed worker (process pool and Ray) -----------------------------------


@pytest.mark.parametrize("executor", ["processes", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_window_whose_worker_was_killed_is_rerun(
    tmp_path: Path, clean: WalkForwardResult, executor: str
) -> None:
    """One worker; window 0's worker is SIGKILLed mid-training (its pid read from the window's
    progress file): the executor reruns the window (retries=1) from a clean start and the run
    ends with the clean run's figures."""
    out = tmp_path / "run"
    config = tiny(
        tmp_path,
        "record=false",
        f"executor={executor}",
        "workers=1",
        "retries=1",
        "progress_every=20",
    )
    killed: list[dict[str, Any]] = []

    def kill_first_worker() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            progress = read_progress(out / "runs" / "w00")
            if progress and progress["phase"] == "training" and 0 < progress["steps"] < TOTAL:
                os.kill(int(progress["pid"]), signal.SIGKILL)
                killed.append(progress)
            time.sleep(0.02)

    killer = threading.Thread(target=kill_first_worker, daemon=True)
    killer.start()
    result = run_walk_forward(config, out_dir=out, label="R", progress=False)
    killer.join(timeout=5)
    assert killed, "the first window's worker was never seen training"
    rerun = read_progress(out / "runs" / "w00")
    assert rerun is not None
    assert rerun["pid"] != killed[0]["pid"]
    assert rerun["steps"] == TOTAL
    assert_same_figures(result, clean)
