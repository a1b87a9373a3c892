"""Batched, idempotent writes of decision records, straight through the database drivers:
SQLAlchemy's inserts top out near 15,000 rows/s, short of the server's 20,000 decisions/s, so
Postgres gets ``COPY`` into a staging table then ``INSERT .. SELECT .. ON CONFLICT (request_id)
DO NOTHING`` (COPY has no conflict clause), SQLite ``executemany``. Keeping a request id's first
record makes spool replays and client retries safe."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson
from sqlalchemy import JSON, ColumnElement
from sqlalchemy.engine import make_url

from allocator.recording.records import DECISION_FIELDS, DecisionRecord, ModelRecord
from allocator.recording.schema import Decision
from allocator.recording.settings import shown_url

_FIELD = {"request_fingerprint": "fingerprint"}
"""Record field per column, where names differ."""
_TEXT_ARRAYS = frozenset({"asset_ids", "slots"})  # JSON columns of strings; the others: floats


def _stage_type(column: ColumnElement[Any]) -> str:
    """The Postgres type a column's values travel as (JSON arrays as binary arrays)."""
    if isinstance(column.type, JSON):
        return "text[]" if column.name in _TEXT_ARRAYS else "float8[]"
    pg = {str: "text", dt.datetime: "timestamptz", float: "float8", int: "int8", bool: "bool"}
    return pg[column.type.python_type]


_RECORDED = [
    c
    for c in Decision.__table__.columns
    if _FIELD.get(c.name, c.name) in {*DECISION_FIELDS, "model_version_id"}
]  # not the key, nor the trading cycle's stamps
DECISION_COLUMNS = tuple(c.name for c in _RECORDED)
"""The columns a decision record fills, in the schema's order (``_row``'s order)."""
STAGE_TYPES = tuple(_stage_type(c) for c in _RECORDED)
_JSON = [isinstance(c.type, JSON) for c in _RECORDED]
_SOURCES = [(_FIELD.get(c.name, c.name), j) for c, j in zip(_RECORDED, _JSON, strict=True)]
_NAMES = ", ".join(DECISION_COLUMNS)

COPY_STAGE = f"COPY decisions_stage ({_NAMES}) FROM STDIN (FORMAT BINARY)"
CREATE_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS decisions_stage ("
    + ", ".join(f"{n} {t}" for n, t in zip(DECISION_COLUMNS, STAGE_TYPES, strict=True))
    + ") ON COMMIT DELETE ROWS"
)
# Arrays travel as binary float8[] and become JSONB inside Postgres: the float-to-text work
# (Postgres prints the shortest exact form) runs in the server process, on the other core,
# instead of in the recorder thread, which shares the allocation server's GIL.
INSERT_FROM_STAGE = (
    f"INSERT INTO decisions ({_NAMES}) SELECT "
    + ", ".join(f"to_jsonb({n})" if j else n for n, j in zip(DECISION_COLUMNS, _JSON, strict=True))
    + " FROM decisions_stage ON CONFLICT (request_id) DO NOTHING"
)
INSERT_VALUES = f"INSERT INTO decisions ({_NAMES}) VALUES {{}} ON CONFLICT (request_id) DO NOTHING"
_VALUES_ROW = "({})".format(
    ", ".join(f"to_jsonb(%s::{t})" if j else "%s" for t, j in zip(STAGE_TYPES, _JSON, strict=True))
)
INSERT_SQLITE = INSERT_VALUES.format(f"({', '.join('?' * len(DECISION_COLUMNS))})")


class SinkUnavailableError(ConnectionError):
    """The database cannot be reached now (or is locked); the batch should be spooled."""


class RecordRejectedError(ValueError):
    """The database refused a record itself (a constraint or a value): retrying cannot help."""


class SchemaMissingError(RuntimeError):
    """The database is reachable but has no trade schema: migrations were not run."""


class Sink(Protocol):
    """A database the recorder writes batches to; one instance per writer thread."""

    url: str

    def connect(self) -> None:
        """Open (or reopen) the connection, check the schema; ``SinkUnavailableError`` if down."""

    def write(self, models: Sequence[ModelRecord], decisions: Sequence[DecisionRecord]) -> int:
        """Upsert ``models``, insert ``decisions`` in one transaction; returns rows inserted.

        ``SinkUnavailableError`` when unreachable, ``RecordRejectedError`` for a bad record."""

    def close(self) -> None: ...


def _dumps(value: Any) -> str:
    """Compact JSON (orjson: ~15x json.dumps; records are checked finite when made)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def _schema_missing(url: str) -> SchemaMissingError:
    return SchemaMissingError(
        f"{url} has no trade schema (no decisions table): run `allocator db upgrade` with "
        "DATABASE_URL set to it"
    )


_UPSERT_MODEL = (
    "INSERT INTO model_versions (name, version, algorithm, manifest, checksums, created) "
    "VALUES ({p}, {p}, {p}, {json}, {json}, {now}) ON CONFLICT (name, version) DO NOTHING"
)
_SELECT_MODEL = "SELECT id FROM model_versions WHERE name = {p} AND version = {p}"


def _model_row(m: ModelRecord) -> tuple[str, ...]:
    return (m.name, m.version, m.algorithm, _dumps(dict(m.manifest)), _dumps(dict(m.checksums)))


SMALL_BATCH = 16
"""Up to this many decisions go in one multi-row ``INSERT .. VALUES`` instead of COPY, whose
staging round trip costs ~3 ms: most of a lone decision's wait under durable acks."""


class _Connection:
    """One connection, and the ids of the models it has looked up (forgotten with it)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self._timeout = timeout
        self._conn: Any = None
        self._ids: dict[tuple[str, str], int] = {}

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
            self._ids.clear()

    def _lookup_models(
        self, db: Any, p: str, models: Sequence[ModelRecord], decisions: Sequence[DecisionRecord]
    ) -> None:
        """Remember the ids of ``models`` and of every model ``decisions`` name (``db``: what
        executes a query, ``p`` its parameter marker)."""
        ids, select = self._ids, _SELECT_MODEL.format(p=p)
        wanted = {m.key for m in models} | ({d.model_key for d in decisions} - ids.keys())
        for name, version in wanted:
            row = db.execute(select, (name, version)).fetchone()
            if row is None:
                raise LookupError(
                    f"model {name}/{version} is not registered: register_model() it before "
                    "recording its decisions"
                )
            ids[(name, version)] = int(row[0])


class PostgresSink(_Connection):
    """COPY into a staging table, then insert what is new; one connection, reconnects on loss."""

    def __init__(self, url: str, connect_timeout: float = 3.0) -> None:
        import psycopg  # noqa: F401  (the serve extra brings it; fail here, not mid-batch)

        super().__init__(url, connect_timeout)
        self._conninfo = make_url(url).set(drivername="postgresql").render_as_string(False)

    def _unavailable(self, exc: Exception) -> SinkUnavailableError:
        return SinkUnavailableError(f"{shown_url(self.url)}: {exc}".strip())

    def connect(self) -> None:
        import psycopg

        self.close()
        try:
            conn = psycopg.connect(
                self._conninfo,
                connect_timeout=max(1, round(self._timeout)),
                # Fail a write on a dead peer instead of hanging on it: libpq's TCP user timeout
                # and keepalives bound how long a cut network can hold a batch.
                tcp_user_timeout=int(self._timeout * 1000),
                keepalives=1,
                keepalives_idle=max(1, round(self._timeout)),
                keepalives_interval=1,
                keepalives_count=3,
            )
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from None
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass('decisions'), to_regclass('model_versions')")
                row = cur.fetchone()
                if row is None or None in row:
                    raise _schema_missing(shown_url(self.url))
                cur.execute(CREATE_STAGE)
            conn.commit()
        except BaseException as exc:
            conn.close()
            if isinstance(exc, psycopg.OperationalError):
                raise self._unavailable(exc) from None
            raise
        self._conn = conn

    def write(self, models: Sequence[ModelRecord], decisions: Sequence[DecisionRecord]) -> int:
        import psycopg

        if self._conn is None or self._conn.closed:
            self.connect()
        conn, ids = self._conn, self._ids
        try:
            with conn.cursor() as cur:
                upsert = _UPSERT_MODEL.format(p="%s", json="%s::jsonb", now="now()")
                for m in models:
                    cur.execute(upsert, _model_row(m))
                self._lookup_models(cur, "%s", models, decisions)
                rows = [_row(d, ids[d.model_key], list, d.decided_at) for d in decisions]
                if len(rows) > SMALL_BATCH:
                    with cur.copy(COPY_STAGE) as copy:
                        copy.set_types(STAGE_TYPES)
                        for row in rows:
                            copy.write_row(row)
                    cur.execute(INSERT_FROM_STAGE)
                elif rows:
                    values = ", ".join([_VALUES_ROW] * len(rows))
                    cur.execute(INSERT_VALUES.format(values), [v for row in rows for v in row])
                inserted = max(cur.rowcount, 0) if rows else 0
            conn.commit()
            return inserted
        except psycopg.OperationalError as exc:
            self.close()
            raise self._unavailable(exc) from None
        except (psycopg.IntegrityError, psycopg.DataError, LookupError) as exc:
            self._rollback()
            raise RecordRejectedError(str(exc).strip()) from exc
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        try:
            self._conn.rollback()
        except Exception:
            self.close()


WAL_RETRY_SECONDS = 0.01


def enable_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Put the database in WAL mode, retrying ``database is locked`` for up to ``timeout``:
    the switch's exclusive lock fails at once (no busy handler) for all but one of several
    workers opening a fresh file. WAL persists, so a database already in it takes no lock."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            for pragma in ("PRAGMA journal_mode", "PRAGMA journal_mode = WAL"):
                mode = conn.execute(pragma).fetchone()
                if mode is not None and str(mode[0]).lower() == "wal":
                    return
            raise sqlite3.OperationalError(f"journal mode stays {mode!r}, not WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY_SECONDS * (0.5 + random.random()))


def prepare_sqlite(url: str, timeout: float = 30.0) -> None:
    """Switch a SQLite trade database to WAL once, before several processes open it together
    (``serve --workers``); any other URL, or a file not there yet, is left alone."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return
    database = parsed.database or ""
    if not database or database == ":memory:" or not os.path.exists(database):
        return
    with contextlib.closing(sqlite3.connect(database, timeout=timeout, isolation_level=None)) as c:
        enable_wal(c, timeout)


def _sqlite_time(t: dt.datetime) -> str:
    """SQLAlchemy's SQLite DateTime storage format (naive UTC), so ORM reads parse it."""
    return t.astimezone(dt.UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


class SqliteSink(_Connection):
    """``executemany`` in one transaction; WAL journal so readers do not block the writer."""

    def __init__(self, url: str, busy_timeout: float = 5.0) -> None:
        database = make_url(url).database or ""
        if not database or database == ":memory:":
            raise ValueError(
                f"{url}: the recorder needs a SQLite file (an in-memory database would vanish "
                "with its connection)"
            )
        super().__init__(url, busy_timeout)
        self.path = database

    def connect(self) -> None:
        self.close()
        try:
            # The recorder connects on the caller's thread and writes on its own.
            conn = sqlite3.connect(
                self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.OperationalError as exc:
            raise SinkUnavailableError(f"{self.url}: {exc}") from None
        try:
            tables = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name IN ('decisions', 'model_versions')"
            ).fetchall()
            if len(tables) != 2:
                raise _schema_missing(self.url)
            enable_wal(conn, self._timeout)
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.OperationalError):
                raise SinkUnavailableError(f"{self.url}: {exc}") from None
            raise
        self._conn = conn

    def write(self, models: Sequence[ModelRecord], decisions: Sequence[DecisionRecord]) -> int:
        if self._conn is None:
            self.connect()
        conn, ids = self._conn, self._ids
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                now = _sqlite_time(dt.datetime.now(dt.UTC))
                conn.executemany(
                    _UPSERT_MODEL.format(p="?", json="?", now="?"),
                    [(*_model_row(m), now) for m in models],
                )
                self._lookup_models(conn, "?", models, decisions)
                before = conn.total_changes
                conn.executemany(
                    INSERT_SQLITE,
                    [
                        _row(d, ids[d.model_key], _dumps, _sqlite_time(d.decided_at))
                        for d in decisions
                    ],
                )
                inserted = conn.total_changes - before
                conn.execute("COMMIT")
                return inserted
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            # "database is locked" or a vanished file: transient, spool and retry.
            ids.clear()
            raise SinkUnavailableError(f"{self.url}: {exc}") from None
        except (sqlite3.IntegrityError, sqlite3.DataError, LookupError) as exc:
            raise RecordRejectedError(str(exc)) from exc


def make_sink(url: str) -> Sink:
    """The sink for a SQLAlchemy-style URL (``postgresql[+psycopg]://``, ``sqlite:///file``)."""
    backend = make_url(url).get_backend_name()
    if backend == "postgresql":
        return PostgresSink(url)
    if backend == "sqlite":
        return SqliteSink(url)
    raise ValueError(f"unsupported database URL {shown_url(url)!r}: use postgresql:// or sqlite://")


def _row(
    d: DecisionRecord, model_version_id: int, array: Callable[[Any], Any], decided_at: Any
) -> tuple[Any, ...]:
    """A decision's values in ``DECISION_COLUMNS`` order, each vector encoded by ``array``."""
    given = {"decided_at": decided_at, "model_version_id": model_version_id}
    row = []
    for name, is_json in _SOURCES:
        value = given[name] if name in given else getattr(d, name)
        row.append(array(value) if is_json and value is not None else value)
    return tuple(row)
