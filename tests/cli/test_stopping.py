"""How the batch commands take SIGTERM and Ctrl-C: the first asks for a stop at a safe point,
a second stops at once, and the previous handlers come back afterwards."""

from __future__ import annotations

import os
import signal
import time

import pytest

from allocator.cli.options import Stopped, graceful_stop


def _deliver(signum: int) -> None:
    """Send ``signum`` to this process and give the handler time to run."""
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # the handler runs in the main thread between two bytecodes


@pytest.mark.parametrize(
    ("signum", "second", "code"),
    [(signal.SIGTERM, Stopped, 143), (signal.SIGINT, KeyboardInterrupt, 130)],
)
def test_the_first_signal_asks_the_second_stops_at_once(
    signum: int, second: type[BaseException], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with graceful_stop("finishing this step") as ask:
        assert not ask.event.is_set()
        _deliver(signum)
        assert ask.event.is_set()  # asked, not raised: the job goes on to its safe point
        assert ask.exit_code == code
        assert f"{signal.Signals(signum).name}: finishing this step" in capsys.readouterr().err
        with pytest.raises(second, match="second"):
            _deliver(signum)
    assert {sig: signal.getsignal(sig) for sig in before} == before
