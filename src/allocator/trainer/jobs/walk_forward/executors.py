"""Where the windows run: one after another in this process, in a pool of worker processes on
this machine, or as Ray tasks (this machine or a cluster).

Every executor yields ``WindowResult``s as windows finish; a window is a pure function of its
job, so which executor ran it changes the order and the wall time, never the figures. The
process pool needs nothing beyond the standard library, so a many-core machine without Ray
(or one where Ray is too heavy to install) still runs its windows side by side.

Failures: locally, a window that raises fails the run (the windows already finished stay kept,
and ``--resume`` continues from them). With processes or Ray a window whose worker process
dies (killed, out of memory, node lost) is rerun up to ``retries`` times (Ray's
``max_retries``); an exception raised inside the window is a bug or bad data and fails the run
at once unless ``retry_exceptions`` is set (then also up to ``retries`` times). A rerun window
starts clean, or from its last checkpoint when the trainer writes them
(``window.train_window``).

The fan-out itself (``fan_out_processes``, ``fan_out_ray``) takes any picklable job and a
top-level function of it, so other batch jobs made of independent runs (the market suite) use
the same pool and retry rules instead of a copy of them.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from allocator.trainer import require_extra
from allocator.trainer.jobs.walk_forward.config import WalkForwardError
from allocator.trainer.jobs.walk_forward.results import WindowResult
from allocator.trainer.jobs.walk_forward.window import WindowJob, run_window

JobT = TypeVar("JobT")
ResultT = TypeVar("ResultT")


def _window_label(job: WindowJob) -> str:
    return f"window {job.window.label}"


def run_local(jobs: Sequence[WindowJob]) -> Generator[WindowResult, None, None]:
    """Windows one after another in this process."""
    for job in jobs:
        yield run_window(job)


def run_processes(
    jobs: Sequence[WindowJob],
    workers: int | None = None,
    retries: int = 1,
    retry_exceptions: bool = False,
) -> Generator[WindowResult, None, None]:
    """Each window in one of ``workers`` spawned processes (``fan_out_processes``)."""
    yield from fan_out_processes(
        jobs, run_window, _window_label, workers, retries, retry_exceptions
    )


def fan_out_processes(
    jobs: Sequence[JobT],
    work: Callable[[JobT], ResultT],
    label: Callable[[JobT], str],
    workers: int | None = None,
    retries: int = 1,
    retry_exceptions: bool = False,
) -> Generator[ResultT, None, None]:
    """``work(job)`` for each job in one of ``workers`` spawned processes (None: one per CPU),
    yielded as it finishes, rerun as the module says; ``label`` names a job in errors.

    Spawned, not forked: the parent may hold torch threads and open files that a fork would
    copy mid-state. A dead worker breaks the whole pool (the standard library cannot say which
    job it ran), so every job that was in flight is charged one attempt and resubmitted to a
    fresh pool.
    """
    size = max(1, min(len(jobs), workers or os.cpu_count() or 1))
    attempts = [0] * len(jobs)
    todo = list(range(len(jobs)))
    while todo:
        pool = ProcessPoolExecutor(
            max_workers=size, mp_context=multiprocessing.get_context("spawn")
        )
        finished = False
        try:
            pending: dict[Future[ResultT], int] = {}
            for i in todo:
                attempts[i] += 1
                pending[pool.submit(work, jobs[i])] = i
            todo = []
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    i = pending.pop(future)
                    try:
                        result = future.result()
                    except BrokenProcessPool as exc:
                        if attempts[i] > retries:
                            raise WalkForwardError(
                                f"{label(jobs[i])}: a worker process died "
                                f"{attempts[i]} time(s) while it ran (config retries: "
                                f"{retries}): {exc}"
                            ) from exc
                        todo.append(i)
                        continue
                    except Exception:
                        if not retry_exceptions or attempts[i] > retries:
                            raise
                        attempts[i] += 1
                        pending[pool.submit(work, jobs[i])] = i
                        continue
                    yield result
            finished = True
        finally:
            _close(pool, finished)


def _close(pool: ProcessPoolExecutor, finished: bool) -> None:
    """Shut the pool; a run that failed or was abandoned must not wait for windows it will
    never use, so their processes are ended rather than awaited."""
    if finished:
        pool.shutdown(wait=True)
        return
    processes = list(getattr(pool, "_processes", {}).values())  # no public handle before 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=10)


def run_ray(
    jobs: Sequence[WindowJob],
    address: str | None = None,
    workers: int | None = None,
    retries: int = 1,
    retry_exceptions: bool = False,
) -> Generator[WindowResult, None, None]:
    """Each window a Ray task (``fan_out_ray``)."""
    yield from fan_out_ray(
        jobs, run_window, _window_label, address, workers, retries, retry_exceptions
    )


def fan_out_ray(
    jobs: Sequence[JobT],
    work: Callable[[JobT], ResultT],
    label: Callable[[JobT], str],
    address: str | None = None,
    workers: int | None = None,
    retries: int = 1,
    retry_exceptions: bool = False,
) -> Generator[ResultT, None, None]:
    """``work(job)`` for each job as a Ray task (1 CPU), yielded as it finishes, rerun as the
    module says; ``label`` names a job in errors.

    Without ``address`` a local Ray is started with ``workers`` CPUs (and shut down after);
    with one, ``ray.init(address=address)`` joins that cluster. An already initialized Ray
    (a caller's) is used as it is.
    """
    # heavy optional dependency (the `ray` extra), needed only by this executor
    ray = require_extra("ray", "ray", "walk-forward on Ray (executor: ray)")

    started = False
    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=retry_exceptions)(
            work
        )
        pending = {remote.remote(job): job for job in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                job = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError:
                    raise  # the job's own exception (also an instance of its type)
                except ray.exceptions.RayError as exc:
                    raise WalkForwardError(
                        f"{label(job)}: its Ray worker failed {retries + 1} "
                        f"time(s) (config retries: {retries}): {exc}"
                    ) from exc
                yield result
    finally:
        if started:
            ray.shutdown()
