"""Rebuild portfolio states from the recorded decisions, so a restart is invisible to clients.

A decision row holds what the next decision needs (smoothed weights, slot layout, model, the
answer and its fingerprint); a later record still in the spool takes its row's place. Not
restored: the ICM's previous observation and action (prices are not recorded), so the first
decision after a restart has no ICM reward; rows without slots start again; a reset is not
recorded, so a restart brings the last recorded state back.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from allocator.portfolio import CASH_ID
from allocator.recording.records import DECISION_FIELDS, DecisionRecord
from allocator.recording.schema import Decision, ModelVersion
from allocator.recording.spool import Spool
from allocator.serving.answers import AnswerEncoder
from allocator.serving.portfolio_state import LastAnswer, ModelKey, PortfolioState
from allocator.serving.state import StateStore

__all__ = ["Latest", "latest_decisions", "restore_states", "state_from_record"]

log = logging.getLogger("allocator.serving")

_CHUNK = 1_000
"""Portfolios put into the store per locked session."""
_COLUMNS = {"model_name": "name", "model_version": "version", "fingerprint": "request_fingerprint"}
"""Record fields read from a column of another name (the rest: their own)."""


Latest = tuple[DecisionRecord, int]
"""A portfolio's latest recorded decision and how many it has recorded."""


def _utc(t: dt.datetime) -> dt.datetime:
    return t.replace(tzinfo=dt.UTC) if t.utcoffset() is None else t.astimezone(dt.UTC)


def latest_decisions(database_url: str) -> dict[str, Latest]:
    """The latest recorded decision of every portfolio (by ``decided_at``, then row id), without
    its current weights (unneeded, and their JSON decoding dominates the time)."""
    d = Decision.__table__
    m = ModelVersion.__table__
    order = (d.c.decided_at.desc(), d.c.id.desc())
    needed = [c for c in d.c if c.name != "current_weights"]  # the one vector restore ignores
    ranked = sa.select(
        *needed,
        sa.func.row_number().over(partition_by=d.c.portfolio_id, order_by=order).label("rank"),
        sa.func.count().over(partition_by=d.c.portfolio_id).label("n"),
    ).subquery()
    query = (
        sa.select(ranked, m.c.name, m.c.version)
        .join(m, m.c.id == ranked.c.model_version_id)
        .where(ranked.c.rank == 1)
    )
    url = sa.make_url(database_url)
    if url.get_backend_name() == "postgresql":
        url = url.set(drivername="postgresql+psycopg")  # the driver the recorder uses
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
    finally:
        engine.dispose()
    out: dict[str, Latest] = {}
    for row in rows:
        values: dict[str, Any] = {f: row.get(_COLUMNS.get(f, f)) for f in DECISION_FIELDS}
        values = {f: tuple(v) if isinstance(v, list) else v for f, v in values.items()}
        record = DecisionRecord(**values | {"decided_at": _utc(row["decided_at"])})
        out[record.portfolio_id] = (record, int(row["n"]))
    return out


def merge_spooled(latest: dict[str, Latest], spool: Spool) -> None:
    """Oldest segment first (some may be in the database too: the later-wins merge absorbs it)."""
    for segment in spool.segments():
        for frame in spool.read(segment):
            for record in map(DecisionRecord.from_json, frame.get("d", ())):
                known, count = latest.get(record.portfolio_id, (None, 0))
                if known is not None and record.request_id == known.request_id:
                    continue
                if known is None or _utc(record.decided_at) >= known.decided_at:
                    latest[record.portfolio_id] = (record, count + 1)


def state_from_record(record: DecisionRecord, steps: int) -> PortfolioState | None:
    if record.slots is None or record.asset_ids[:1] != (CASH_ID,):
        return None
    weight = dict(zip(record.asset_ids, record.smoothed_weights, strict=True))
    smoothed = np.array([weight[CASH_ID]] + [weight.get(a, 0.0) for a in record.slots])
    smoothed.setflags(write=False)
    last = None
    if record.fingerprint is not None:  # the answer, by the live path's own encoder
        raw = np.asarray(record.raw_weights, dtype="<f8").tobytes()
        smoothed_bytes = np.asarray(record.smoothed_weights, dtype="<f8").tobytes()
        answer = AnswerEncoder(record.model_name, record.model_version).encode(
            record.request_id, record.portfolio_id, record.asset_ids, raw, smoothed_bytes, record
        )
        last = LastAnswer(record.request_id, bytes.fromhex(record.fingerprint), answer)
    model = ModelKey(record.model_name, record.model_version, len(record.slots) + 1)
    return PortfolioState(model, record.slots, smoothed, None, None, steps, last)


def restore_states(database_url: str, spool: Spool | None, store: StateStore) -> int:
    """Put every portfolio's latest recorded state into ``store``; the number restored. Call it
    before the recorder starts (its writer deletes spool segments). An unreadable database is
    logged and only the spool is restored: the server still starts."""
    try:
        latest = latest_decisions(database_url)
    except sa.exc.DBAPIError as exc:
        log.error("cannot read the recorded decisions, portfolios start again: %s", exc)
        latest = {}
    if spool is not None:
        merge_spooled(latest, spool)
    states = {pid: state_from_record(*known) for pid, known in latest.items()}
    ready = {pid: s for pid, s in states.items() if s is not None}
    if len(ready) < len(states):
        log.warning(
            "%d portfolio(s) recorded without a slot layout start again",
            len(states) - len(ready),
        )
    ids: Sequence[str] = sorted(ready)
    for at in range(0, len(ids), _CHUNK):
        chunk = ids[at : at + _CHUNK]
        with store.locked(chunk) as session:
            session.put([ready[pid] for pid in chunk])
    return len(ready)
