"""The durable recorder against the real Postgres and SQLite: completeness through outages,
crashes and duplicates, the admission quota, quarantine, and its metrics."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from allocator.metrics.recorder import RecorderMetrics
from allocator.recording.migrations import upgrade
from allocator.recording.recorder import Recorder, RecorderRefusedError
from allocator.recording.schema import Decision, ModelVersion
from allocator.recording.sinks import SMALL_BATCH, SchemaMissingError
from tests.recording.decisions import MODEL, make_decision, row_of
from tests.recording.proxy import TcpProxy

CHILD = Path(__file__).with_name("record_child.py")
FAST = {"batch_size": 200, "flush_interval": 0.005, "retry_interval": (0.02, 0.1)}


@pytest.fixture
def migrated_url(database_url: str) -> str:
    upgrade(database_url)
    return database_url


@pytest.fixture
def proxied_postgres(postgres_url: str) -> Iterator[tuple[str, TcpProxy]]:
    """The session's Postgres database, migrated, reached through a proxy the test can cut."""
    from tests.postgres import reset_schema

    reset_schema(postgres_url)
    upgrade(postgres_url)
    url = make_url(postgres_url)
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        yield url.set(port=proxy.port).render_as_string(False), proxy


def read_rows(url: str) -> list[dict[str, Any]]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with Session(engine) as session:
            rows = session.scalars(select(Decision).order_by(Decision.request_id)).all()
            out = []
            for r in rows:
                at = r.decided_at
                if at.tzinfo is None:  # SQLite keeps no zone; the recorder stores UTC
                    at = at.replace(tzinfo=make_decision(0).decided_at.tzinfo)
                out.append(
                    {
                        "request_id": r.request_id,
                        "portfolio_id": r.portfolio_id,
                        "decided_at": at,
                        "asset_ids": r.asset_ids,
                        "raw_weights": r.raw_weights,
                        "smoothed_weights": r.smoothed_weights,
                        "current_weights": r.current_weights,
                        "turnover": r.turnover,
                        "icm_reward": r.icm_reward,
                        "latency_seconds": r.latency_seconds,
                        "slots": r.slots,
                        "request_fingerprint": r.request_fingerprint,
                    }
                )
            return out
    finally:
        engine.dispose()


def request_ids(url: str) -> list[str]:
    return [row["request_id"] for row in read_rows(url)]


def test_ten_thousand_decisions_round_trip_exactly(migrated_url: str, tmp_path: Path) -> None:
    decisions = [make_decision(i) for i in range(10_000)]
    with Recorder(migrated_url, tmp_path / "spool", batch_size=1_000) as recorder:
        recorder.register_model(MODEL)
        for i in range(0, len(decisions), 250):
            recorder.submit_many(decisions[i : i + 250])
        assert recorder.flush(60)
        stats = recorder.stats()
    assert stats.written == 10_000
    assert stats.spooled_records == 0
    rows = read_rows(migrated_url)
    assert len(rows) == 10_000
    assert rows == [row_of(d) for d in decisions]  # exact: floats, None, order of assets
    engine = create_engine(migrated_url, poolclass=NullPool)
    with Session(engine) as session:
        (model,) = session.scalars(select(ModelVersion)).all()
        assert (model.name, model.version, model.algorithm) == ("test-model", "1", "td3")
        assert model.manifest == {"schema_version": 2}
    engine.dispose()


def test_small_batches_round_trip_exactly(migrated_url: str, tmp_path: Path) -> None:
    """Batches of at most ``SMALL_BATCH`` take the sinks' other path (multi-row VALUES)."""
    decisions = [make_decision(i) for i in range(3 * SMALL_BATCH)]
    with Recorder(migrated_url, tmp_path / "spool", **FAST) as recorder:
        recorder.register_model(MODEL)
        for i in range(0, len(decisions), SMALL_BATCH // 2):
            recorder.wait_durable(recorder.submit_many(decisions[i : i + SMALL_BATCH // 2]), 10)
    assert read_rows(migrated_url) == [row_of(d) for d in decisions]


def test_a_request_id_is_recorded_once(migrated_url: str, tmp_path: Path) -> None:
    first = make_decision(1)
    retry = dataclasses.replace(make_decision(2), request_id=first.request_id)
    with Recorder(migrated_url, tmp_path / "spool", **FAST) as recorder:
        recorder.register_model(MODEL)
        recorder.submit(first)
        assert recorder.flush(10)
        recorder.submit_many([retry, make_decision(3), make_decision(3)])
        assert recorder.flush(10)
    rows = read_rows(migrated_url)
    assert [r["request_id"] for r in rows] == [first.request_id, make_decision(3).request_id]
    assert rows[0] == row_of(first)  # the first record of a request id is the one kept


def test_outage_during_two_thousand_decisions_loses_and_duplicates_nothing(
    proxied_postgres: tuple[str, TcpProxy], tmp_path: Path
) -> None:
    url, proxy = proxied_postgres
    registry = CollectorRegistry()
    recorder = Recorder(url, tmp_path / "spool", metrics=RecorderMetrics(registry), **FAST)
    recorder.start()
    recorder.register_model(MODEL)
    spooled_seen = 0
    for i in range(2_000):
        if i == 500:
            proxy.cut()
        if i == 1_500:
            spooled_seen = recorder.stats().spooled_records
            proxy.restore()
        recorder.submit(make_decision(i))
        if i % 100 == 99:
            time.sleep(0.01)  # a request stream, not one burst
    assert recorder.flush(60)
    deadline = time.monotonic() + 30
    while recorder.stats().spooled_records and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = recorder.stats()
    recorder.close()
    assert spooled_seen > 0, "the outage never reached the spool"
    assert stats.replayed >= spooled_seen
    assert stats.spooled_records == 0
    ids = request_ids(url)
    assert len(ids) == len(set(ids)) == 2_000
    assert read_rows(url) == [row_of(make_decision(i)) for i in range(2_000)]
    failed = registry.get_sample_value(
        "allocator_recorder_failed_writes_total", {"reason": "unavailable"}
    )
    assert failed is not None
    assert failed >= 1
    # rows_written counts the rows this recorder inserted. A batch whose commit reached the
    # database just as the connection was cut never got its acknowledgement: it is spooled and
    # replayed, and the replay finds its rows already there (ON CONFLICT DO NOTHING). So the
    # counter may miss one in-flight batch, never more, while the table (checked above) holds
    # every decision exactly once.
    written = registry.get_sample_value("allocator_recorder_rows_written_total")
    assert 2_000 - FAST["batch_size"] <= written <= 2_000
    assert registry.get_sample_value("allocator_recorder_spooled_records") == 0


def _child(url: str, spool: Path, start: int, stop: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), url, str(spool), str(start), str(stop), "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_after_acks(child: subprocess.Popen[str], acks: int) -> int:
    """SIGKILL ``child`` right after its ``acks``-th acknowledgement; the last acked index."""
    assert child.stdout is not None
    acked, seen = 0, 0
    for line in child.stdout:
        if line.startswith("acked"):
            acked, seen = int(line.split()[1]), seen + 1
            if seen == acks:
                os.kill(child.pid, signal.SIGKILL)
                break
    child.wait(30)
    assert child.returncode == -signal.SIGKILL, child.stderr.read() if child.stderr else ""
    return acked


def _finish(child: subprocess.Popen[str]) -> None:
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert "closed" in out


@pytest.mark.parametrize("outage", [False, True], ids=["database-up", "database-down"])
def test_sigkill_mid_stream_then_restart_loses_and_duplicates_nothing(
    proxied_postgres: tuple[str, TcpProxy], tmp_path: Path, outage: bool
) -> None:
    url, proxy = proxied_postgres
    spool = tmp_path / "spool"
    total = 1_500
    if outage:
        proxy.cut()  # the killed process has only its spool to keep its acknowledgements
    acked = _kill_after_acks(_child(url, spool, 0, total), acks=12)
    assert 0 < acked < total
    if outage:
        assert any(spool.glob("*.spool")), "nothing was spooled during the outage"
        proxy.restore()
    # The restarted process replays the spool; its client resends what was not acknowledged,
    # plus one acknowledged chunk again (a retry after a timeout), under the same request ids.
    _finish(_child(url, spool, max(0, acked - 50), total))
    ids = request_ids(url)
    assert len(ids) == len(set(ids)) == total
    assert read_rows(url) == [row_of(make_decision(i)) for i in range(total)]
    assert not any(spool.glob("*.spool"))


def test_sigkill_on_sqlite_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'trade.db'}"
    upgrade(url)
    spool = tmp_path / "spool"
    acked = _kill_after_acks(_child(url, spool, 0, 800), acks=6)
    _finish(_child(url, spool, max(0, acked - 50), 800))
    ids = request_ids(url)
    assert len(ids) == len(set(ids)) == 800


def test_spool_quota_refuses_at_the_door_and_keeps_what_it_accepted(
    proxied_postgres: tuple[str, TcpProxy], tmp_path: Path
) -> None:
    url, proxy = proxied_postgres
    registry = CollectorRegistry()
    proxy.cut()
    recorder = Recorder(
        url,
        tmp_path / "spool",
        metrics=RecorderMetrics(registry),
        spool_quota_bytes=20_000,
        **FAST,
    ).start()
    recorder.register_model(MODEL)
    accepted: list[int] = []
    refused: list[int] = []
    reasons: set[str] = set()
    for i in range(400):
        try:
            recorder.submit(make_decision(i))
            accepted.append(i)
        except RecorderRefusedError as exc:
            reasons.add(str(exc).split("(")[0])
            refused.append(i)
        if i % 20 == 19:
            assert recorder.flush(10)
    assert accepted
    assert refused
    assert reasons == {"the recorder spool reached its quota "}
    assert registry.get_sample_value("allocator_recorder_rejected_total") == len(refused)
    assert registry.get_sample_value("allocator_recorder_spool_bytes") >= 20_000
    proxy.restore()
    deadline = time.monotonic() + 30
    while recorder.stats().spooled_records and time.monotonic() < deadline:
        time.sleep(0.05)
    recorder.submit(make_decision(1_000))  # the door opens again once the spool drained
    recorder.close()
    assert request_ids(url) == sorted(make_decision(i).request_id for i in [*accepted, 1_000])


def test_close_spools_what_the_database_cannot_take(
    proxied_postgres: tuple[str, TcpProxy], tmp_path: Path
) -> None:
    url, proxy = proxied_postgres
    recorder = Recorder(url, tmp_path / "spool", **FAST).start()
    recorder.register_model(MODEL)
    proxy.cut()
    recorder.submit_many([make_decision(i) for i in range(300)])
    assert recorder.close(30)
    with pytest.raises(RecorderRefusedError, match="closed"):
        recorder.submit(make_decision(301))
    assert list((tmp_path / "spool").glob("*.spool")), "close() did not spool the rest"
    proxy.restore()
    with Recorder(url, tmp_path / "spool", **FAST) as again:  # a new process on the same spool
        again.register_model(MODEL)
        assert again.flush(10)
        deadline = time.monotonic() + 30
        while again.stats().spooled_records and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(request_ids(url)) == 300


def test_a_record_the_database_refuses_is_quarantined_not_dropped(
    migrated_url: str, tmp_path: Path
) -> None:
    bad = dataclasses.replace(make_decision(5), turnover=-1.0)  # bypasses create(): a bug
    registry = CollectorRegistry()
    with Recorder(
        migrated_url, tmp_path / "spool", metrics=RecorderMetrics(registry), **FAST
    ) as recorder:
        recorder.register_model(MODEL)
        recorder.submit_many([make_decision(4), bad, make_decision(6)])
        assert recorder.flush(10)
        assert recorder.stats().quarantined == 1
    assert request_ids(migrated_url) == [make_decision(4).request_id, make_decision(6).request_id]
    quarantine = (tmp_path / "spool" / "quarantine.frames").read_bytes()
    assert bad.request_id.encode() in quarantine
    assert (
        registry.get_sample_value("allocator_recorder_failed_writes_total", {"reason": "rejected"})
        == 1
    )


def test_an_unmigrated_database_is_named_with_the_fix(database_url: str, tmp_path: Path) -> None:
    recorder = Recorder(database_url, tmp_path / "spool")
    with pytest.raises(SchemaMissingError, match="allocator db upgrade"):
        recorder.start()


def test_unregistered_model_and_closed_recorder_are_refused(
    migrated_url: str, tmp_path: Path
) -> None:
    with Recorder(migrated_url, tmp_path / "spool", **FAST) as recorder:
        with pytest.raises(RecorderRefusedError, match="not registered"):
            recorder.submit(make_decision(0))
        assert recorder.stats().rejected == 1


def test_submit_is_thread_safe(migrated_url: str, tmp_path: Path) -> None:
    with Recorder(migrated_url, tmp_path / "spool", **FAST) as recorder:
        recorder.register_model(MODEL)

        def produce(offset: int) -> None:
            for i in range(offset, 2_000, 4):
                recorder.submit(make_decision(i))

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert recorder.flush(30)
    ids = request_ids(migrated_url)
    assert len(ids) == len(set(ids)) == 2_000


def test_postgres_stores_jsonb_that_grafana_can_unnest(migrated_url: str, tmp_path: Path) -> None:
    decision = make_decision(7)
    with Recorder(migrated_url, tmp_path / "spool", **FAST) as recorder:
        recorder.register_model(MODEL)
        recorder.submit(decision)
    engine = create_engine(migrated_url, poolclass=NullPool)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT asset_id, raw_weight, smoothed_weight FROM decision_weights ORDER BY position"
        ).all()
    engine.dispose()
    assert [r[0] for r in rows] == list(decision.asset_ids)
    assert [r[1] for r in rows] == list(decision.raw_weights)
    assert [r[2] for r in rows] == list(decision.smoothed_weights)
