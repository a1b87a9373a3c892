"""A call whose deadline passes while its decision is being made durable: the client gets
DEADLINE_EXCEEDED, the decision is kept as recorded, and a retry of its request id fetches it
(the semantics the proto's status table states)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import grpc

from tests.serving.server.helpers import OK, connect, make_request, start_server, wait_for, weights


def test_a_decision_durable_after_the_deadline_is_fetched_by_retrying_its_request_id(
    tiny_registry: Path, tmp_path: Path
) -> None:
    server = start_server(tmp_path, tiny_registry)
    conn = connect(server)
    db_path = tmp_path / "trades.db"
    conn.allocate(make_request("late", seed=1))  # the portfolio has a state to advance from
    # Another writer holds the database: the recorder waits out its busy timeout (5 s), then
    # spools the decision, which makes it durable well after the call's deadline.
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        request = make_request("late", seed=2, request_id="late-2")
        code, _, _ = conn.call("Allocate", request, timeout=0.5)
        assert code is grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: conn.state("late").steps == 2, "the late decision to advance the state")
        code, details, fetched = conn.call("Allocate", request)
        assert code is OK, details
        assert fetched.request_id == "late-2"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert conn.state("late").steps == 2  # the retry was answered, not decided again
    wait_for(lambda: _recorded(db_path, "late-2") is not None, "the spool to replay")
    # The client fetched exactly the decision the database holds for that request id.
    assert weights(fetched).tolist() == _recorded(db_path, "late-2")
    nxt = conn.allocate(make_request("late", seed=3, request_id="late-3"))
    assert nxt.request_id == "late-3"
    assert conn.state("late").steps == 3
    conn.channel.close()
    server.stop()


def _recorded(path: Path, request_id: str) -> list[float] | None:
    with sqlite3.connect(path) as db:
        row = db.execute(
            "SELECT smoothed_weights FROM decisions WHERE request_id = ?", (request_id,)
        ).fetchone()
    return None if row is None else list(json.loads(row[0]))
