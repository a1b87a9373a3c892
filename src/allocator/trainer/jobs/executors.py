"""Where a batch job's runs go: in this process, in a pool of worker processes, or as Ray tasks.

Every job is a pure function of a picklable job, so the executor changes order and wall time, never
a result. With processes or Ray a job whose worker dies is rerun up to ``retries`` times, then
``WorkerLostError`` names it; a job that raises fails the run unless ``retry_exceptions``."""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Generic, Literal, TypeVar

from pydantic import Field

from allocator.trainer import require_extra
from allocator.typed_config import StrictModel

JobT = TypeVar("JobT")
ResultT = TypeVar("ResultT")
ExecutorKind = Literal["local", "processes", "ray"]


class WorkerLostError(RuntimeError):
    """A job whose worker died more often than its retries allow (``job``)."""

    def __init__(self, job: object, message: str) -> None:
        super().__init__(message)
        self.job = job


class Executor(Generic[JobT, ResultT]):
    """Runs ``work(job)`` for submitted jobs; ``label(job)`` names a job in errors. This base is
    ``executor: local``: one job at a time, in this process, when its result is asked for."""

    capacity: int = 1

    def __init__(self, work: Callable[[JobT], ResultT], label: Callable[[JobT], str]) -> None:
        self.work = work
        self.label = label
        self.queue: deque[JobT] = deque()

    @property
    def running(self) -> int:
        """Jobs submitted whose results were not handed back yet."""
        return len(self.queue)

    def submit(self, job: JobT) -> None:
        self.queue.append(job)

    def next_done(self) -> ResultT:
        """The next result to finish (blocks); at least one job must be running."""
        return self.work(self.queue.popleft())

    def close(self) -> None:
        self.queue.clear()

    def __enter__(self) -> Executor[JobT, ResultT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProcessExecutor(Executor[JobT, ResultT]):
    """Each job in one of ``workers`` spawned processes (a fork would copy the parent's torch
    threads mid-state). A dead worker breaks the pool without saying which job it ran, so every
    job in flight is charged one attempt and resubmitted to a fresh pool."""

    def __init__(
        self,
        work: Callable[[JobT], ResultT],
        label: Callable[[JobT], str],
        settings: ExecutorSettings,
        retry_exceptions: bool = False,
    ) -> None:
        super().__init__(work, label)
        self.capacity = max(1, settings.workers or os.cpu_count() or 1)
        self.retries = settings.retries
        self.retry_exceptions = retry_exceptions
        self.pool: ProcessPoolExecutor | None = None
        self.pending: dict[Future[ResultT], tuple[JobT, int]] = {}  # -> (job, attempts)
        self.ready: deque[ResultT] = deque()
        self.broken: list[tuple[JobT, int]] = []

    @property
    def running(self) -> int:
        return len(self.pending) + len(self.ready)

    def submit(self, job: JobT, attempts: int = 1) -> None:
        if self.pool is None:  # processes start on demand, up to ``capacity``
            spawn = multiprocessing.get_context("spawn")
            self.pool = ProcessPoolExecutor(max_workers=self.capacity, mp_context=spawn)
        self.pending[self.pool.submit(self.work, job)] = (job, attempts)

    def next_done(self) -> ResultT:
        while not self.ready:
            done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
            for future in done:
                self._collect(future)
            if self.broken:
                wait(self.pending)  # a broken pool fails every job it still holds
                for future in list(self.pending):
                    self._collect(future)
                self._shut(finished=True)
                again, self.broken = self.broken, []
                for job, attempts in again:
                    self.submit(job, attempts + 1)
        return self.ready.popleft()

    def _collect(self, future: Future[ResultT]) -> None:
        job, attempts = self.pending.pop(future)
        try:
            self.ready.append(future.result())
        except BrokenProcessPool as exc:
            if attempts > self.retries:
                raise WorkerLostError(
                    job,
                    f"{self.label(job)}: a worker process died {attempts} time(s) while it ran "
                    f"(config retries: {self.retries}): {exc}",
                ) from exc
            self.broken.append((job, attempts))
        except Exception:
            if not self.retry_exceptions or attempts > self.retries:
                raise
            self.submit(job, attempts + 1)

    def _shut(self, finished: bool) -> None:
        """Shut the pool; unless ``finished``, its processes are ended rather than awaited."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
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

    def close(self) -> None:
        self._shut(finished=not self.pending)
        self.pending.clear()


class RayExecutor(Executor[JobT, ResultT]):
    """Each job a Ray task (1 CPU) on the cluster at ``ray_address``, an already initialized Ray,
    else a local Ray started here (and shut down on ``close``)."""

    def __init__(
        self,
        work: Callable[[JobT], ResultT],
        label: Callable[[JobT], str],
        settings: ExecutorSettings,
        retry_exceptions: bool = False,
    ) -> None:
        super().__init__(work, label)
        # heavy optional dependency (the `ray` extra), needed only by this executor
        self.ray = ray = require_extra("ray", "ray", "running jobs on Ray (executor: ray)")
        self.retries = settings.retries
        self.started = False
        if not ray.is_initialized():
            if settings.ray_address is None:
                ray.init(num_cpus=settings.workers, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=settings.ray_address, log_to_driver=False)
            self.started = True
        self.capacity = settings.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        options = {"max_retries": self.retries, "retry_exceptions": retry_exceptions}
        self.remote = ray.remote(num_cpus=1, **options)(work)
        self.pending: dict[Any, JobT] = {}  # Ray object ref -> the job it runs

    @property
    def running(self) -> int:
        return len(self.pending)

    def submit(self, job: JobT) -> None:
        self.pending[self.remote.remote(job)] = job

    def next_done(self) -> ResultT:
        done, _ = self.ray.wait(list(self.pending), num_returns=1)
        job = self.pending.pop(done[0])
        try:
            return self.ray.get(done[0])
        except self.ray.exceptions.RayTaskError:
            raise  # the job's own exception (also an instance of its type)
        except self.ray.exceptions.RayError as exc:
            raise WorkerLostError(
                job,
                f"{self.label(job)}: its Ray worker failed {self.retries + 1} time(s) "
                f"(config retries: {self.retries}): {exc}",
            ) from exc

    def close(self) -> None:
        for ref in self.pending:
            self.ray.cancel(ref, force=True)
        self.pending = {}
        if self.started:
            self.ray.shutdown()
            self.started = False


class ExecutorSettings(StrictModel):
    """The executor keys of a job config that fans its runs out (walk-forward, suite)."""

    executor: ExecutorKind = "local"
    workers: int | None = Field(
        None, ge=1, description="runs at once: processes, or a local Ray's CPUs (None: all)"
    )
    ray_address: str | None = Field(None, description="None: start a local Ray")
    retries: int = Field(
        1,
        ge=0,
        description="processes and Ray: times a run is rerun when its worker process dies "
        "(killed, out of memory, node lost)",
    )


def open_executor(
    settings: ExecutorSettings,
    work: Callable[[JobT], ResultT],
    label: Callable[[JobT], str],
    retry_exceptions: bool = False,
) -> Executor[JobT, ResultT]:
    """The executor a job's config names (``executor: local | processes | ray``)."""
    if settings.executor == "local":
        return Executor(work, label)
    kind = RayExecutor if settings.executor == "ray" else ProcessExecutor
    return kind(work, label, settings, retry_exceptions)


def fan_out(
    executor: Executor[JobT, ResultT], jobs: Iterable[JobT]
) -> Generator[ResultT, None, None]:
    """Every job submitted at once, each result yielded as it finishes; the executor is closed
    however the loop ends."""
    with executor:
        for job in jobs:
            executor.submit(job)
        while executor.running:
            yield executor.next_done()
