"""Where the windows run: one after another in this process, or as Ray tasks.

Both executors yield ``WindowResult``s as windows finish; a window is a pure function of its
job, so which executor ran it changes the order and the wall time, never the figures.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from allocator.trainer.jobs.walk_forward.results import WindowResult
from allocator.trainer.jobs.walk_forward.window import WindowJob, run_window


def run_local(jobs: Sequence[WindowJob]) -> Iterator[WindowResult]:
    """Windows one after another in this process."""
    for job in jobs:
        yield run_window(job)


def run_ray(
    jobs: Sequence[WindowJob], address: str | None = None, workers: int | None = None
) -> Iterator[WindowResult]:
    """Each window a Ray task (1 CPU), yielded as it finishes.

    Without ``address`` a local Ray is started with ``workers`` CPUs (and shut down after);
    with one, ``ray.init(address=address)`` joins that cluster. An already initialized Ray
    (a caller's) is used as it is.
    """
    import ray  # heavy optional dependency, needed only by this executor

    started = False
    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_window)
        pending = [remote.remote(job) for job in jobs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    finally:
        if started:
            ray.shutdown()
