"""Where trials train: one at a time in this process, or as Ray tasks, several at once.

The driver asks the study for a trial, submits its job while the executor has room, and tells
the study each outcome as it comes back. A trial is a pure function of its job, so the executor
changes the order and the wall time, never a trial's value.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from allocator.trainer import require_extra
from allocator.trainer.jobs.tuning.objective import TrialJob, TrialOutcome, run_trial


class TrialExecutor(Protocol):
    """Runs submitted trial jobs and hands back their outcomes as they finish."""

    capacity: int

    @property
    def running(self) -> int: ...

    def submit(self, job: TrialJob) -> None: ...

    def next_done(self) -> TrialOutcome: ...

    def close(self) -> None: ...


class LocalTrials:
    """One trial at a time, trained in this process when its outcome is asked for."""

    capacity = 1

    def __init__(self) -> None:
        self.queue: deque[TrialJob] = deque()

    @property
    def running(self) -> int:
        return len(self.queue)

    def submit(self, job: TrialJob) -> None:
        self.queue.append(job)

    def next_done(self) -> TrialOutcome:
        return run_trial(self.queue.popleft())

    def close(self) -> None:
        self.queue.clear()


class RayTrials:
    """Each trial a Ray task (1 CPU); ``parallel`` at once (default: every CPU Ray sees).

    Without ``address`` a local Ray is started with ``parallel`` CPUs (and shut down on
    ``close``); with one, ``ray.init(address=address)`` joins that cluster, whose nodes must
    share the tuning folder (the study's journal and the trials' run directories). An already
    initialized Ray (a caller's) is used as it is.
    """

    def __init__(self, address: str | None, parallel: int | None) -> None:
        # heavy optional dependency (the `ray` extra), needed only by this executor
        ray = require_extra("ray", "ray", "tuning on Ray (executor: ray)")

        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            if address is None:
                ray.init(num_cpus=parallel, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
            self.started = True
        self.capacity = parallel or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.remote = ray.remote(num_cpus=1, max_retries=0)(run_trial)
        self.pending: dict[Any, TrialJob] = {}  # Ray object ref -> the job it runs

    @property
    def running(self) -> int:
        return len(self.pending)

    def submit(self, job: TrialJob) -> None:
        self.pending[self.remote.remote(job)] = job

    def next_done(self) -> TrialOutcome:
        """The next trial to finish; a worker that died (out of memory, killed) fails it."""
        done, _ = self.ray.wait(list(self.pending), num_returns=1)
        job = self.pending.pop(done[0])
        try:
            return self.ray.get(done[0])
        except self.ray.exceptions.RayError as exc:
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            return TrialOutcome(job.number, "FAIL", None, 0, 0.0, None, 0, str(job.run_dir), error)

    def close(self) -> None:
        for ref in self.pending:
            self.ray.cancel(ref, force=True)
        self.pending = {}
        if self.started:
            self.ray.shutdown()
            self.started = False


@contextmanager
def open_executor(
    kind: str, address: str | None = None, parallel: int | None = None
) -> Iterator[TrialExecutor]:
    """The configured executor, closed (Ray shut down, running tasks cancelled) however the
    study ends."""
    trials: TrialExecutor = RayTrials(address, parallel) if kind == "ray" else LocalTrials()
    try:
        yield trials
    finally:
        trials.close()
