"""How reliably ``allocator serve --workers N`` starts on a fresh SQLite trade database.

Each start gets a newly migrated SQLite file (never switched to WAL yet, the case where the
workers raced for the journal-mode lock), starts ``allocator serve --workers N --redis-url``,
waits for it to print that it serves, and stops it with SIGTERM. Prints JSON: starts, failures
and each failure's stderr tail. Run: ``.venv/bin/python bench/worker_starts.py --starts 50``
(``--registry`` and ``--model`` name a model; by default the tests' tiny policy is written).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVING_ON = re.compile(r"serving on (\S+) \(metrics on port")


def start_once(
    registry: Path, model: str, redis_url: str, workers: int, directory: Path, timeout: float
) -> dict[str, Any]:
    """One start on a fresh database: ok, seconds to serve, exit code, stderr tail."""
    from allocator.recording.migrations import upgrade

    directory.mkdir(parents=True)
    url = f"sqlite:///{directory / 'trades.sqlite'}"
    upgrade(url)
    args = [
        *(sys.executable, "-m", "allocator.cli", "serve", "--port", "0", "--metrics-port", "0"),
        *("--workers", str(workers), "--registry", str(registry), "--model", model, "--cpu"),
        *("--redis-url", redis_url, "--database-url", url, "--spool-dir", str(directory / "s")),
    ]
    began = time.monotonic()
    proc = subprocess.Popen(
        args,
        cwd=directory,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    serving = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if SERVING_ON.search(line):
                serving.set()
        serving.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ok = serving.wait(timeout) and proc.poll() is None and any(map(SERVING_ON.search, lines))
    seconds = time.monotonic() - began
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    reader.join(5)
    return {"ok": ok and code == 0, "seconds": round(seconds, 3), "code": code, "tail": lines[-8:]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--registry", type=Path, default=None)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="worker-starts-") as tmp:
        registry = args.registry
        if registry is None:
            sys.path.insert(0, str(ROOT))
            from tests.serving.conftest import write_tiny_model

            registry = Path(tmp) / "registry"
            write_tiny_model(registry / args.model / "1")
        runs = [
            start_once(
                registry,
                args.model,
                args.redis_url,
                args.workers,
                Path(tmp) / f"s{k}",
                args.timeout,
            )
            for k in range(args.starts)
        ]
    failures = [dict(run, start=k) for k, run in enumerate(runs) if not run["ok"]]
    seconds = sorted(run["seconds"] for run in runs)
    figures = {
        "starts": len(runs),
        "workers": args.workers,
        "failures": len(failures),
        "median_seconds_to_serve": seconds[len(seconds) // 2] if seconds else None,
        "failed": failures,
    }
    print(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    sys.exit(1 if main()["failures"] else 0)
