"""Load generators and process helpers for the server tests that run under traffic.

A reload or a SIGTERM is only interesting while calls are flowing, and the assertions need every
call's request id, status and answering model version, in the order each client saw them. So
the load runs in client threads of the test process (``LoadThread``), each sending its calls one
after the other, paced to a rate or as fast as the server answers, and logging every outcome.
``ServeProcess`` runs ``allocator serve`` as a real subprocess and reads the address it prints.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from allocator.serving.client import (
    DEFAULT_RETRY,
    AllocationRequest,
    AllocatorClient,
    AllocatorError,
    RetryPolicy,
)
from allocator.serving.proto import SERVICE_NAME

OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""Channel options for a connection of the client's own, as a separate process has: grpc shares
one connection between channels of equal arguments (its global subchannel pool), even with a
channel that is still closing, and ``--workers`` spreads connections, not calls."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One call as its client saw it; a batch call carries all of its request ids."""

    request_ids: tuple[str, ...]
    code: grpc.StatusCode
    version: str
    """The answering model version ("" when the call failed)."""
    details: str = ""

    @property
    def ok(self) -> bool:
        return self.code is grpc.StatusCode.OK


def price_path(n_assets: int, length: int, seed: int) -> np.ndarray:
    """Geometric random walks from 100, shape ``(n_assets, length)``."""
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0003, 0.015, size=(n_assets, length - 1))
    return 100.0 * np.exp(np.concatenate([np.zeros((n_assets, 1)), steps], axis=1).cumsum(axis=1))


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


class LoadThread(threading.Thread):
    """Sends ``Allocate`` (or, with ``batch``, ``AllocateBatch``) calls for one portfolio.

    Calls go one after the other, so ``outcomes`` is in the order the server answered this
    client. ``rate`` paces them (calls per second, no catch-up burst after a slow call); ``None``
    sends the next call as soon as the previous one returns. The thread stops on ``stop()`` or
    after ``max_failures`` failed calls in a row (a server that is gone). ``retry`` is the
    client's retry policy; ``None`` shows each call's first answer, as the server gave it.
    """

    def __init__(
        self,
        target: str,
        portfolio_id: str,
        *,
        window: int,
        n_assets: int = 3,
        rate: float | None = None,
        batch: int = 0,
        model: str | None = None,
        version: str | None = None,
        timeout: float = 5.0,
        max_failures: int | None = None,
        seed: int = 0,
        retry: RetryPolicy | None = DEFAULT_RETRY,
    ) -> None:
        super().__init__(name=f"load-{portfolio_id}", daemon=True)
        self.target = target
        self.portfolio_id = portfolio_id
        self.window = window
        self.assets = [f"A{i}" for i in range(n_assets)]
        self.rate = rate
        self.batch = batch
        self.model = model
        self.version = version
        self.timeout = timeout
        self.max_failures = max_failures
        self.retry = retry
        self.outcomes: list[Outcome] = []
        self.error: BaseException | None = None
        self._path = price_path(n_assets, 512, seed)
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok]

    def versions(self) -> list[str]:
        return [o.version for o in self.outcomes]

    def _prices(self, i: int) -> np.ndarray:
        start = i % (self._path.shape[1] - self.window - 1)
        return self._path[:, start : start + self.window + 1]

    def _call(self, client: AllocatorClient, i: int) -> Outcome:
        prices = self._prices(i)
        if not self.batch:
            request_id = f"{self.portfolio_id}-{i}"
            try:
                answer = client.allocate(
                    self.portfolio_id,
                    self.assets,
                    prices,
                    request_id=request_id,
                    model=self.model,
                    version=self.version,
                )
            except AllocatorError as error:
                return Outcome((request_id,), error.code, "", error.details)
            return Outcome((answer.request_id,), grpc.StatusCode.OK, answer.model_version)
        requests = [
            AllocationRequest(
                f"{self.portfolio_id}-{k}",
                self.assets,
                prices,
                request_id=f"{self.portfolio_id}-{i}-{k}",
                model=self.model,
                version=self.version,
            )
            for k in range(self.batch)
        ]
        ids = tuple(r.request_id or "" for r in requests)
        try:
            answers = client.allocate_batch(requests)
        except AllocatorError as error:
            return Outcome(ids, error.code, "", error.details)
        versions = {a.model_version for a in answers}
        if tuple(a.request_id for a in answers) != ids or len(versions) != 1:
            raise AssertionError(f"batch {i}: answers do not match the requests ({versions})")
        return Outcome(ids, grpc.StatusCode.OK, versions.pop())

    def run(self) -> None:
        try:
            with AllocatorClient(
                self.target, timeout=self.timeout, retry=self.retry, options=OWN_CONNECTION
            ) as client:
                start = time.monotonic()
                failures = 0
                i = 0
                while not self._halt.is_set():
                    if self.rate is not None:
                        delay = start + i / self.rate - time.monotonic()
                        if delay > 0 and self._halt.wait(delay):
                            break
                    outcome = self._call(client, i)
                    self.outcomes.append(outcome)
                    failures = 0 if outcome.ok else failures + 1
                    if self.max_failures is not None and failures >= self.max_failures:
                        break
                    i += 1
        except BaseException as exc:  # surfaced by the test, which checks ``error``
            self.error = exc


class HealthWatch(threading.Thread):
    """Streams ``Health/Watch`` for the Allocator service and logs each status it is sent.

    It cancels its stream as soon as it sees NOT_SERVING, so the draining server does not wait
    its grace period for this stream to end.
    """

    def __init__(self, target: str) -> None:
        super().__init__(name="health-watch", daemon=True)
        self.target = target
        self.statuses: list[str] = []
        self.end: grpc.StatusCode | None = None

    def run(self) -> None:
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            call = stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=120)
            try:
                for response in call:
                    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
                    self.statuses.append(status)
                    if status == "NOT_SERVING":
                        call.cancel()
                        break
            except grpc.RpcError as error:
                self.end = error.code()


_SERVING_ON = re.compile(r"serving on (\S+) \(metrics on port (\d+|None)\)")


class ServeProcess:
    """``python -m allocator.cli serve ARGS`` in a subprocess; stderr is collected by a thread.

    ``wait_ready`` returns the ``HOST:PORT`` the server printed (it binds ``--port 0``).
    ``program`` and ``env`` run another installation's ``allocator`` (the wheel test).
    """

    def __init__(
        self,
        args: Sequence[str],
        cwd: Path,
        program: Sequence[str] = (sys.executable, "-m", "allocator.cli"),
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [*program, "serve", "--port", "0", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.target: str | None = None
        self._reader = threading.Thread(target=self._read, name="serve-stderr", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            match = _SERVING_ON.search(line)
            if match and self.target is None:
                self.target = match.group(1)
                self._ready.set()
        self._ready.set()  # the process ended: wake wait_ready

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float = 60.0) -> str:
        if not self._ready.wait(timeout) or self.target is None:
            raise AssertionError(f"allocator serve did not start:\n{self.stderr}")
        return self.target

    def terminate(self) -> None:
        """SIGTERM: what an orchestrator sends to stop a replica."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        """Clean-up after a failed test: never leave a server running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
