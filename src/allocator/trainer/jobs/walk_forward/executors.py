"""Where the windows run: one after another in this process, or as Ray tasks.

Both executors yield ``WindowResult``s as windows finish; a window is a pure function of its
job, so which executor ran it changes the order and the wall time, never the figures.

Failures: locally, a window that raises fails the run (the windows already finished stay kept,
and ``--resume`` continues from them). Under Ray a window whose worker process dies (killed,
out of memory, node lost) is rerun up to ``retries`` times (Ray's ``max_retries``); an
exception raised inside the window is a bug or bad data and fails the run at once unless
``retry_exceptions`` is set (Ray's ``retry_exceptions``, then also up to ``retries`` times). A
rerun window starts clean (``window.train_export_evaluate``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from allocator.trainer.jobs.walk_forward.config import WalkForwardError
from allocator.trainer.jobs.walk_forward.results import WindowResult
from allocator.trainer.jobs.walk_forward.window import WindowJob, run_window


def run_local(jobs: Sequence[WindowJob]) -> Iterator[WindowResult]:
    """Windows one after another in this process."""
    for job in jobs:
        yield run_window(job)


def run_ray(
    jobs: Sequence[WindowJob],
    address: str | None = None,
    workers: int | None = None,
    retries: int = 1,
    retry_exceptions: bool = False,
) -> Iterator[WindowResult]:
    """Each window a Ray task (1 CPU), yielded as it finishes, rerun as the module says.

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
        remote = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=retry_exceptions)(
            run_window
        )
        pending = {remote.remote(job): job for job in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                job = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError:
                    raise  # the window's own exception (also an instance of its type)
                except ray.exceptions.RayError as exc:
                    raise WalkForwardError(
                        f"window {job.window.label}: its Ray worker failed {retries + 1} "
                        f"time(s) (config retries: {retries}): {exc}"
                    ) from exc
                yield result
    finally:
        if started:
            ray.shutdown()
