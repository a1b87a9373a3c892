"""The servers the serving benchmarks run: a model to serve, and processes started on free ports,
waited for, measured (CPU seconds) and stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {"mlp": "td3_demo.yaml", "shared": "td3_shared_demo.yaml"}
"""The config each ``--model`` trains: the flat MLP demo, or the shared (per-asset) demo."""


def build_registry(directory: Path, model: str = "mlp") -> Path:
    """Train a demo config briefly and export it: a real, full-size exported policy (a shared
    one gets the export's default ``max_served_assets``)."""
    from allocator.trainer.export.run import export_run
    from allocator.trainer.training.config import load_config
    from allocator.trainer.training.run import train

    config = load_config(
        ROOT / "configs" / CONFIGS[model],
        [
            "total_timesteps=300",
            "algorithm.learning_starts=100",
            "progress_bar=false",
            "torch_threads=1",
        ],
    )
    run = train(config, directory / "run")
    registry = directory / "registry"
    export_run(run.run_dir, registry, name="bench", version="1", n_parity=50)
    return registry


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant (a supervisor's
    workers), from /proc; 0 where /proc is not there."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_serving(target: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    import grpc

    from allocator.serving.proto.v1 import allocator_pb2 as pb
    from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the server at {target} exited with {process.returncode}")
            try:  # the bare server has no health service: ask what both answer
                stub.ListModels(pb.ListModelsRequest(), timeout=1)
                return
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return
            time.sleep(0.2)
    raise TimeoutError(f"the server at {target} did not answer in {timeout} s")


class Servers:
    """Server processes by name, each on a free port with its stderr in ``tmp/NAME.log``, all
    stopped with SIGTERM at the end (``allocator serve``'s drain then flushes every record)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.targets: dict[str, str] = {}

    def start(self, name: str, argv: list[str]) -> str:
        port = free_port()
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115  (lives as long as the server)
        process = subprocess.Popen(
            [*argv, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=log
        )
        self.processes[name] = process
        self.targets[name] = f"127.0.0.1:{port}"
        return self.targets[name]

    def stop(self) -> dict[str, int | None]:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for name, process in self.processes.items():
            try:
                codes[name] = process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                codes[name] = None
        return codes
