"""A recording process for the crash test: records decisions [start, stop) in chunks.

After each chunk it waits until the chunk is durable (``flush``) and prints ``acked <next>``:
a decision is acknowledged only once it is in the database or the fsync'd spool, which is the
promise the crash test holds the recorder to after a SIGKILL.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from allocator.recording.recorder import Recorder
from tests.recording.decisions import MODEL, make_decision


def main() -> None:
    url, spool, start, stop, chunk = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    recorder = Recorder(
        url, spool, batch_size=100, flush_interval=0.005, retry_interval=(0.05, 0.2)
    ).start()
    recorder.register_model(MODEL)
    print("started", flush=True)
    for first in range(start, stop, chunk):
        last = min(first + chunk, stop)
        recorder.submit_many([make_decision(i) for i in range(first, last)])
        if not recorder.flush(30):
            raise SystemExit("flush timed out")
        print(f"acked {last}", flush=True)
    recorder.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
