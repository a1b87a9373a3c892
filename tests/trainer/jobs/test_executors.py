"""The executors every batch job runs on (walk-forward, tuning, the suite), on jobs that take
milliseconds: results by executor, a worker killed mid-job and rerun, retries used up, and a
job's own exception. The jobs' tests run them on real training (test_walk_forward*.py,
test_tuning.py, test_suite.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.trainer.jobs.executors import (
    Executor,
    ExecutorSettings,
    ProcessExecutor,
    RayExecutor,
    WorkerLostError,
    fan_out,
    open_executor,
)
from allocator.trainer.jobs.tuning.config import NoPruning
from allocator.trainer.jobs.tuning.objective import TrialJob
from allocator.trainer.jobs.tuning.runner import next_outcome, trial_label
from allocator.trainer.training.config import load_config
from tests.trainer.jobs.workers import die, die_once, fail_once, label, refuse, square


@pytest.mark.parametrize("kind", ["local", "processes"])
def test_every_executor_gives_every_result(kind: str) -> None:
    jobs = list(range(7))
    results = list(
        fan_out(open_executor(ExecutorSettings(executor=kind, workers=2), square, label), jobs)
    )
    assert sorted(results) == [j * j for j in jobs]


def test_the_local_executor_runs_in_order_when_a_result_is_asked_for() -> None:
    ran: list[int] = []

    def work(job: int) -> int:
        ran.append(job)
        return job

    executor = Executor(work, label)
    executor.submit(1)
    executor.submit(2)
    assert (executor.capacity, executor.running, ran) == (1, 2, [])
    assert executor.next_done() == 1
    assert ran == [1]
    assert list(fan_out(executor, [3])) == [2, 3]


def test_a_killed_worker_is_rerun_in_a_fresh_process(tmp_path: Path) -> None:
    marker = tmp_path / "first"
    (pid,) = fan_out(
        ProcessExecutor(die_once, label, ExecutorSettings(workers=1, retries=1)), [str(marker)]
    )
    assert pid != int(marker.read_text())


def test_a_worker_that_keeps_dying_names_its_job_once_retries_are_used(tmp_path: Path) -> None:
    job = str(tmp_path / "never")
    with pytest.raises(WorkerLostError, match=r"job .*never: a worker process died 2 time") as e:
        list(fan_out(ProcessExecutor(die, label, ExecutorSettings(workers=1, retries=1)), [job]))
    assert e.value.job == job


def test_a_jobs_own_exception_fails_the_run_unless_it_may_be_retried(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="job 3 refused"):
        list(fan_out(ProcessExecutor(refuse, label, ExecutorSettings(workers=1, retries=3)), [3]))
    marker = str(tmp_path / "once")
    with pytest.raises(ValueError, match="first attempt"):
        list(fan_out(ProcessExecutor(fail_once, label, ExecutorSettings(workers=1)), [marker]))
    retried = ProcessExecutor(
        fail_once, label, ExecutorSettings(workers=1, retries=1), retry_exceptions=True
    )
    assert list(fan_out(retried, [marker + "-retried"])) == ["second attempt"]


def test_a_trial_whose_worker_died_is_failed_and_the_study_goes_on(tmp_path: Path) -> None:
    """The tuning driver's rule: a lost worker fails its trial (naming the error); it does not
    end the study as it ends a walk-forward run."""
    job = TrialJob(3, load_config(None), tmp_path / "trial-0003", "", "study", NoPruning())
    executor = ProcessExecutor(die, trial_label, ExecutorSettings(workers=1, retries=0))
    with executor:
        executor.submit(job)
        outcome = next_outcome(executor)
    assert (outcome.number, outcome.state, outcome.value) == (3, "FAIL", None)
    assert outcome.run_dir == str(job.run_dir)
    assert outcome.error is not None
    assert outcome.error.startswith("BrokenProcessPool: ")


def test_ray_gives_every_result_and_names_a_job_whose_worker_kept_dying() -> None:
    """One local Ray for both executors (a caller's Ray is used as it is, and left running)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        squares = RayExecutor(square, label, ExecutorSettings(workers=2))
        assert squares.capacity == 2
        assert sorted(fan_out(squares, range(5))) == [0, 1, 4, 9, 16]
        with pytest.raises(WorkerLostError, match=r"job x: its Ray worker failed 2 time"):
            list(fan_out(RayExecutor(die, label, ExecutorSettings(retries=1)), ["x"]))
        with pytest.raises(ValueError, match="job 3 refused"):  # its own error, not a lost one
            list(fan_out(RayExecutor(refuse, label, ExecutorSettings(retries=1)), [3]))
        assert ray.is_initialized()
    finally:
        ray.shutdown()
